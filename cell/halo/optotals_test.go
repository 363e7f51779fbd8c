package halo

import (
	"bytes"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/profile"
)

func TestOpTotalsAddsUpATraceByOp(t *testing.T) {
	step := func(n int) profile.Step {
		return profile.Step{Step: n, Wall: 10 * time.Millisecond, Spans: []profile.Span{
			{Name: "Linear", Class: "matmul", Dur: time.Millisecond, FLOPs: 1000, Bytes: 10},
			{Name: "LinearBackward", Class: "matmul", Dur: 2 * time.Millisecond, FLOPs: 2000, Bytes: 20},
			{Name: "Linear", Class: "matmul", Start: time.Millisecond, Dur: time.Millisecond, FLOPs: 1000, Bytes: 10},
			{Name: "Attention", Class: "attention", Dur: 3 * time.Millisecond, Bytes: 5}, // FLOPs not counted
			{Name: "all_reduce", Class: "all_reduce", Comm: true, Dur: time.Millisecond, Bytes: 8, Group: "dp"},
		}}
	}
	var buf bytes.Buffer
	if err := profile.WriteTrace(&buf, []profile.Step{step(1), step(2)}); err != nil {
		t.Fatal(err)
	}
	got, err := ProfileReport{Trace: buf.Bytes()}.OpTotals()
	if err != nil {
		t.Fatal(err)
	}
	want := []OpTotal{
		{Name: "Linear", Class: "matmul", Calls: 4, Seconds: 4e-3, FLOPs: 4000, Bytes: 40},
		{Name: "LinearBackward", Class: "matmul", Calls: 2, Seconds: 4e-3, FLOPs: 4000, Bytes: 40},
		{Name: "Attention", Class: "attention", Calls: 2, Seconds: 6e-3, Bytes: 10},
		{Name: "all_reduce", Class: "all_reduce", Calls: 2, Seconds: 2e-3, Bytes: 16},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d ops %+v, want %d", len(got), got, len(want))
	}
	near := func(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 }
	for i, w := range want {
		g := got[i]
		if g.Name != w.Name || g.Class != w.Class || g.Calls != w.Calls || !near(g.Seconds, w.Seconds) || g.FLOPs != w.FLOPs || g.Bytes != w.Bytes {
			t.Errorf("op %d: got %+v, want %+v", i, g, w)
		}
	}
	if _, err := (ProfileReport{}).OpTotals(); err == nil {
		t.Error("a report without a trace must fail")
	}
	if _, err := (ProfileReport{Trace: []byte("{")}).OpTotals(); err == nil {
		t.Error("a trace that is not JSON must fail")
	}
}
