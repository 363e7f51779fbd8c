package server

import (
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// TestStepMetricsCarryExpertLoad checks that a MoE run's step metrics carry the aux loss and
// the per-layer expert load over the whole step (every micro-batch and rank), and that a dense
// run's carry neither.
func TestStepMetricsCarryExpertLoad(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"one device", nil},
		{"ep=2 on cpu:2", []string{"--devices=cpu:2", "--expert_parallel_size=2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, Options{})
			c := dial(t, s.Socket(), "controller")
			if _, err := c.Load(ctxT(t), "testdata/tiny_moe.yaml", "sft", tc.flags...); err != nil {
				t.Fatal(err)
			}
			ms, err := c.Step(ctxT(t), 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				if m.AuxLoss == nil || len(m.ExpertLoad) != 2 {
					t.Fatalf("step %d: aux loss %v, expert load of %d layers, want 2", m.Step, m.AuxLoss, len(m.ExpertLoad))
				}
				for i, l := range m.ExpertLoad {
					sum := int64(0)
					for _, n := range l.Tokens {
						sum += n
					}
					if int(l.Layer) != i || len(l.Tokens) != 4 || sum != 2*m.Tokens {
						t.Errorf("step %d layer %d: %v over %d experts, want 4 experts and %d assignments (top-2 of the step's %d tokens)",
							m.Step, l.Layer, l.Tokens, len(l.Tokens), 2*m.Tokens, m.Tokens)
					}
					if l.Max != slices.Max(l.Tokens) || l.Min != slices.Min(l.Tokens) || l.Cv < 0 || l.Dead < 0 || int(l.Dead) > len(l.Tokens) {
						t.Errorf("step %d layer %d: max %d min %d cv %v dead %d for %v", m.Step, l.Layer, l.Max, l.Min, l.Cv, l.Dead, l.Tokens)
					}
				}
			}
		})
	}
	_, dense := loaded(t)
	ms, err := dense.Step(ctxT(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].AuxLoss != nil || ms[0].ExpertLoad != nil {
		t.Fatalf("dense model reports aux loss %v and expert load %v", ms[0].AuxLoss, ms[0].ExpertLoad)
	}
}

// TestProfileOfAMoEStepSplitsTheLayer: a profiled MoE step's breakdown splits the layer into
// router, permute, expert GEMM and combine (the device path of the CPU backend), under expert
// parallelism also into the dispatch and combine all-to-alls; it counts the step's ops and host
// syncs, and its trace carries spans of each of those classes.
func TestProfileOfAMoEStepSplitsTheLayer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		comm  []string
	}{
		{"one device", nil, nil},
		{"ep=2 on cpu:2", []string{"--devices=cpu:2", "--expert_parallel_size=2"}, []string{"all_to_all_dispatch", "all_to_all_combine"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, Options{})
			c := dial(t, s.Socket(), "controller")
			if _, err := c.Load(ctxT(t), "testdata/tiny_moe.yaml", "sft", tc.flags...); err != nil {
				t.Fatal(err)
			}
			r, err := c.Profile(ctxT(t), 1, true)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Steps) != 1 {
				t.Fatalf("Profile(1) returned %d steps", len(r.Steps))
			}
			p := r.Steps[0]
			for _, class := range []string{"router", "permute", "expert_gemm", "combine"} {
				if p.ComputeS[class] <= 0 {
					t.Errorf("no time in %s: %v", class, p.ComputeS)
				}
			}
			for _, kind := range tc.comm {
				if p.CommS[kind] <= 0 {
					t.Errorf("no time in %s: %v", kind, p.CommS)
				}
			}
			if p.Ops <= 0 || p.Syncs <= 0 {
				t.Errorf("ops %d and host syncs %d: want both counted", p.Ops, p.Syncs)
			}
			t.Logf("%s: %d ops and %d host syncs in the step", tc.name, p.Ops, p.Syncs)
			var tr struct {
				TraceEvents []struct {
					Cat string `json:"cat"`
				} `json:"traceEvents"`
			}
			if err := json.Unmarshal(r.TraceJson, &tr); err != nil {
				t.Fatal(err)
			}
			cats := map[string]bool{}
			for _, e := range tr.TraceEvents {
				cats[e.Cat] = true
			}
			for _, cat := range append([]string{"router", "permute", "expert_gemm", "combine"}, tc.comm...) {
				if !cats[cat] {
					t.Errorf("the trace has no span of class %s (classes %v)", cat, cats)
				}
			}
		})
	}
}

// TestMoEModelFLOPsCountActiveParameters checks that a MoE step's model FLOPs count the top-k
// experts a token passes through, not every expert: with 4 experts, top-2, hidden 32, expert
// width 16 and 2 layers, the two skipped experts of each layer (3·32·16 weights each) are not
// model FLOPs.
func TestMoEModelFLOPsCountActiveParameters(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "controller")
	if _, err := c.Load(ctxT(t), "testdata/tiny_moe.yaml", "sft"); err != nil {
		t.Fatal(err)
	}
	st, err := c.Inspect(ctxT(t), &halov1.InspectRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, p := range st.Stats {
		if p.Kind != "param" {
			continue
		}
		n := int64(1)
		for _, d := range p.Shape {
			n *= d
		}
		total += n
	}
	ms, err := c.Step(ctxT(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	m := ms[0]
	const skipped = 2 * 2 * 3 * 32 * 16 // layers x skipped experts x (gate, up, down) x hidden x width
	// Attention: 6·L·NH·HD·max_length/2·... as backend.TrainingFLOPsPerToken counts it.
	attn := backend.TrainingFLOPsPerToken(0, 2, 32, 2, 16)
	want := (6*float64(total-skipped) + attn) * float64(m.Tokens)
	if math.Abs(m.ModelFlops-want) > 1e-9*want {
		t.Errorf("model flops %g, want %g: 6 x (%d parameters - %d in skipped experts) + attention, per token", m.ModelFlops, want, total, skipped)
	}
}
