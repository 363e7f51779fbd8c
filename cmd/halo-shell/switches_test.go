package main

import (
	"strings"
	"testing"
)

// TestWarnSwitches: a mistyped HALO_* variable and a value outside a switch's list are
// warned about, with the name to use; known switches and other variables are not.
func TestWarnSwitches(t *testing.T) {
	var b strings.Builder
	warnSwitches(&b, []string{"HOME=/root", "HALO_SESSION_DIR=/tmp/x", "HALO_CUDA_ATENTION=mma", "HALO_CUDA_EMPTY=clear"})
	got := b.String()
	for _, want := range []string{
		"halo-shell: warning: HALO_CUDA_ATENTION is not a halo-shell switch (did you mean HALO_CUDA_ATTENTION?)",
		`halo-shell: warning: HALO_CUDA_EMPTY="clear" is not one of uncleared, cleared`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings lack %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 2 {
		t.Errorf("%d warning lines, want 2:\n%s", n, got)
	}
}
