package server

import (
	"github.com/halo-shell/halo-shell/session"
	"math"
	"path/filepath"
	"testing"
)

// TestPlanSessionReadsTheTrainedWeights steps a session on one device and one on a cp=2 fsdp
// plan (whose steps leave the parameters on the devices): Inspect, Eval, Generate and Save of
// the plan session must all see the trained weights, as the single-device session does.
func TestPlanSessionReadsTheTrainedWeights(t *testing.T) {
	ctx := ctxT(t)
	const name = "model.layers.1.mlp.down_proj.weight"
	type reads struct {
		initial, values []float32
		eval            float64
		text            string
		saved           []float32
	}
	read := func(flags ...string) reads {
		var r reads
		_, c := loaded(t, append([]string{"--gradient_accumulation_steps=2"}, flags...)...)
		in, err := c.Inspect(ctx, &session.InspectRequest{Name: name, Count: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		r.initial = in.Values
		if _, err := c.Step(ctx, 2); err != nil {
			t.Fatal(err)
		}
		// Generation and evaluation first: they must not depend on an earlier inspection.
		if r.text, err = c.Generate(ctx, &session.GenerateRequest{Prompt: "What is 2+3?", Chat: true, MaxNewTokens: 6}, nil); err != nil {
			t.Fatal(err)
		}
		if r.eval, err = c.Eval(ctx); err != nil {
			t.Fatal(err)
		}
		in, err = c.Inspect(ctx, &session.InspectRequest{Name: name, Count: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		r.values = in.Values
		dir := filepath.Join(t.TempDir(), "ck")
		if _, err := c.Save(ctx, dir); err != nil {
			t.Fatal(err)
		}
		// The checkpoint read back by a single-device session.
		_, back := loaded(t, "--gradient_accumulation_steps=2", "--resume_from_checkpoint="+dir)
		if in, err = back.Inspect(ctx, &session.InspectRequest{Name: name, Count: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		r.saved = in.Values
		return r
	}
	want := read()
	got := read("--devices=cpu:4", "--context_parallel_size=2", "--fsdp=true")
	if relL2(want.values, want.initial) < 1e-4 {
		t.Fatal("two steps left the weights where they started")
	}
	if math.Abs(got.eval-want.eval) > 1e-4*want.eval {
		t.Fatalf("Eval on the plan %v, one device %v", got.eval, want.eval)
	}
	if got.text != want.text {
		t.Fatalf("Generate on the plan %q, one device %q", got.text, want.text)
	}
	if d := relL2(got.values, want.values); d > 1e-4 {
		t.Fatalf("Inspect on the plan: %s differs from one device's by %g (relative L2)", name, d)
	}
	if d := relL2(got.saved, got.values); d != 0 {
		t.Fatalf("the plan's checkpoint holds other weights than Inspect showed (relative L2 %g)", d)
	}
}

// relL2 is |a-b| / |b|.
func relL2(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	num, den := 0.0, 0.0
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / max(den, 1e-30))
}
