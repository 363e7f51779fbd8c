package mesh

import (
	"strings"
	"testing"
)

func TestEstimateScalesWithLayout(t *testing.T) {
	m := ModelShape{Hidden: 64, Intermediate: 256, Heads: 8, KVHeads: 8, HeadDim: 8, Layers: 4, Vocab: 100}
	w := Workload{SeqLen: 128, ParamBytes: 2, OptimizerBytes: 12}
	base := Estimate(Layout{DP: 1}, m, w)
	// Exact parameter count: embed + head + final norm + per layer (4 C·C attention, 3 C·F MLP, 2 norms).
	wantParams := int64(2*100*64 + 64 + 4*(4*64*64+3*64*256+2*64))
	if base.Params != wantParams*2 || base.Grads != wantParams*2 || base.Optimizer != wantParams*12 {
		t.Fatalf("single device: %+v, want params %d elements", base, wantParams)
	}
	for _, tc := range []struct {
		name  string
		l     Layout
		check func(Memory) bool
	}{
		{"fsdp divides the optimizer state", Layout{DP: 4, FSDP: true}, func(e Memory) bool { return e.Optimizer == base.Optimizer/4 }},
		{"dp replicates everything", Layout{DP: 4}, func(e Memory) bool {
			return e.Params == base.Params && e.Optimizer == base.Optimizer && e.Activations == base.Activations
		}},
		{"tp splits the layers but not the embeddings", Layout{DP: 1, TP: 2}, func(e Memory) bool {
			return e.Params < base.Params && e.Params > base.Params/2
		}},
		{"cp halves the activations", Layout{DP: 1, CP: 2}, func(e Memory) bool { return e.Activations == base.Activations/2 }},
		{"tp shrinks the activations", Layout{DP: 1, TP: 2}, func(e Memory) bool { return e.Activations < base.Activations }},
	} {
		if e := Estimate(tc.l, m, w); !tc.check(e) {
			t.Errorf("%s: %s vs single device %s", tc.name, e, base)
		}
	}
	rw := w
	rw.Recompute = true
	if r := Estimate(Layout{DP: 1}, m, rw); r.Activations >= base.Activations {
		t.Errorf("recompute does not reduce activations: %d vs %d", r.Activations, base.Activations)
	}
	if s := base.String(); !strings.Contains(s, "optimizer") || !strings.Contains(s, "total") {
		t.Errorf("String: %q", s)
	}
}
