package server

import (
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/session"
)

// TestHostileConfigLeavesTheSessionServing sends :load the YAML that used to take a
// session's memory (an alias bomb of nine levels of ten, 400 KB of nested brackets) and checks
// that each is refused with the limit named and that the session goes on answering.
func TestHostileConfigLeavesTheSessionServing(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "hostile")
	ctx := ctxT(t)
	var bomb strings.Builder
	bomb.WriteString("init:\n  arch: qwen3\n  overrides:\n    l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		fmt.Fprintf(&bomb, "    l%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 10), ", "))
	}
	for _, tc := range []struct{ name, yaml, limit string }{
		{"alias bomb", bomb.String(), "yamlsafe MaxNodes"},
		{"deep nesting", "a: " + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + "\n", "yamlsafe MaxBytes"},
		{"deep nesting within the size limit", "a: " + strings.Repeat("[", 30000) + strings.Repeat("]", 30000) + "\n", "yamlsafe MaxDepth"},
	} {
		_, err := c.LoadYAML(ctx, tc.yaml, "sft")
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("%s: %v, want InvalidArgument", tc.name, err)
		}
		mustContain(t, err, tc.limit)
		if st := status(t, c); st.State != session.StateEmpty {
			t.Fatalf("%s: state %v after the refused load", tc.name, st.State)
		}
	}
}
