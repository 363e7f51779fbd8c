package kernel

import (
	"strings"
	"testing"
)

func TestLayoutMagicShowsAndChangesTheLayout(t *testing.T) {
	c, srv := haloKernel(t)
	if r, _ := c.execute("%load examples/quickstart.yaml", nil); r["status"] != "ok" {
		t.Fatalf("%%load: %v", r)
	}
	for _, tc := range []struct{ code, want string }{
		{"%step 1", "step 1 "},
		{"%layout", "layout dp=1 tp=1 cp=1 ep=1 etp=1 on cpu (step 1)"},
		{"%layout tp=2", "layout dp=1 tp=2 cp=1 ep=1 etp=1 on cpu:2 from step 2 (was dp=1 tp=1 cp=1 ep=1 etp=1; moved in "},
		{"%step 1", "step 2 "},
		{"%layout dp=1", "layout dp=1 tp=1 cp=1 ep=1 etp=1 on cpu from step 3 (was dp=1 tp=2 cp=1 ep=1 etp=1; moved in "},
	} {
		r, msgs := c.execute(tc.code, nil)
		if r["status"] != "ok" || !strings.HasPrefix(resultText(msgs), tc.want) {
			t.Fatalf("%s: %v %q, want a result starting with %q", tc.code, r, resultText(msgs), tc.want)
		}
	}
	// A layout that breaks a rule is an error of the cell; the session keeps its layout.
	r, _ := c.execute("%layout tp=3", nil)
	if r["status"] != "error" || !strings.Contains(r["evalue"].(string), "rule") {
		t.Fatalf("%%layout tp=3: %v, want an error naming the rule", r)
	}
	if st := statusOf(t, srv.Socket()); st.Layout != "dp=1 tp=1 cp=1 ep=1 etp=1" || st.Step != 2 {
		t.Fatalf("after the refusal: layout %q at step %d", st.Layout, st.Step)
	}
}
