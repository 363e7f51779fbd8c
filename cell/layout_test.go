package cell

import (
	"context"
	"strings"
	"testing"
)

func TestLayoutCommandAndAPI(t *testing.T) {
	it, _ := attached(t)
	evalT(t, it, ":step 1")
	for _, tc := range []struct{ src, want string }{
		{":layout", "layout dp=1 tp=1 cp=1 ep=1 etp=1 on cpu (step 1)"},
		{":layout cp=2", "layout dp=1 tp=1 cp=2 ep=1 etp=1 on cpu:2 from step 2 (was dp=1 tp=1 cp=1 ep=1 etp=1; moved in "},
		{"%layout", "layout dp=1 tp=1 cp=2 ep=1 etp=1 on cpu:2 (step 1)"},
		{`halo.Layout("dp=1").Layout`, `"dp=1 tp=1 cp=1 ep=1 etp=1"`},
		{`halo.Layout("").Devices`, `"cpu"`},
	} {
		if got := plain(evalT(t, it, tc.src).Value); !strings.HasPrefix(got, tc.want) {
			t.Fatalf("%s = %q, want it to start with %q", tc.src, got, tc.want)
		}
	}
	// The run steps on after the moves, and status shows the layout.
	evalT(t, it, ":step 1")
	if got := plain(evalT(t, it, ":status").Value); !strings.Contains(got, "layout: dp=1 tp=1 cp=1 ep=1 etp=1 on cpu") {
		t.Fatalf(":status = %q, want the layout", got)
	}
	for _, tc := range []struct{ src, want string }{
		{":layout tp=2", "rule"},             // the tiny model has one key/value head
		{":layout tq=2", `unknown key "tq"`}, // caught before anything is sent
		{`halo.Layout("tp=2")`, "halo.Layout"},
	} {
		_, err := it.Eval(context.Background(), tc.src)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want an error naming %q", tc.src, err, tc.want)
		}
	}
	if got := plain(evalT(t, it, ":layout").Value); !strings.HasPrefix(got, "layout dp=1 tp=1 cp=1") {
		t.Fatalf("after refusals :layout = %q", got)
	}
}
