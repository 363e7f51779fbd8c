package mesh

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
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

func TestEstimateDividesExpertsOverTheExpertGroup(t *testing.T) {
	// 4 MoE layers of 16 experts, 2 dense layers.
	m := ModelShape{Hidden: 64, Intermediate: 256, Heads: 8, KVHeads: 8, HeadDim: 8, Layers: 6, Vocab: 100,
		Experts: 16, ExpertIntermediate: 32, TopK: 2, MoELayers: 4}
	w := Workload{SeqLen: 128}
	experts := int64(4 * 16 * 3 * 64 * 32) // elements of every expert
	base := Estimate(Layout{DP: 8}, m, w)
	for _, tc := range []struct {
		name string
		l    Layout
		// held is the part of the experts a rank holds; shard the part of those in its
		// optimizer (and FSDP shards).
		held, shard int64
	}{
		{"ep=2 holds half the experts", Layout{DP: 8, EP: 2}, 2, 1},
		{"ep=4 holds a quarter", Layout{DP: 8, EP: 4}, 4, 1},
		{"ep=8 holds one expert in eight", Layout{DP: 8, EP: 8}, 8, 1},
		{"ep=4 fsdp shards the quarter over its two replicas", Layout{DP: 8, EP: 4, FSDP: true}, 4, 2},
	} {
		e := Estimate(tc.l, m, w)
		params := e.Params
		if tc.l.FSDP {
			params -= (LocalParams(tc.l, m) - LocalExpertParams(tc.l, m) + 7) / 8 * 4 // dense shard
			params -= LocalExpertParams(tc.l, m) / tc.shard * 4                       // expert shard
		}
		if got, want := base.Params-params, (experts-experts/tc.held)*4; got != want {
			t.Errorf("%s: holds %d fewer parameter bytes than dp=8, want %d", tc.name, got, want)
		}
		if got := LocalExpertParams(tc.l, m); got != experts/tc.held {
			t.Errorf("%s: LocalExpertParams %d, want %d", tc.name, got, experts/tc.held)
		}
		if !tc.l.FSDP && e.Optimizer != base.Optimizer-(experts-experts/tc.held)*8 {
			t.Errorf("%s: optimizer %d bytes, want %d", tc.name, e.Optimizer, base.Optimizer-(experts-experts/tc.held)*8)
		}
	}
}

// TestEstimateCountsWhatAMoELayerKeeps: the activations of a MoE model count, per sparse layer,
// the bytes the MoE block's device path keeps for its backward (nn.MoEKeptBytes), and a dense
// MLP's for each dense layer.
func TestEstimateCountsWhatAMoELayerKeeps(t *testing.T) {
	t.Setenv("HALO_MOE_EXPERT_OUTPUTS", "keep") // the experts' outputs are among the kept bytes
	shape := func(topK, moeLayers int) ModelShape {
		return ModelShape{Hidden: 64, Intermediate: 256, Heads: 8, KVHeads: 8, HeadDim: 8, Layers: 6, Vocab: 100,
			Experts: 16, ExpertIntermediate: 32, TopK: topK, MoELayers: moeLayers}
	}
	w := Workload{Rows: 2, SeqLen: 128, ParamBytes: 2}
	n := w.Rows * w.SeqLen
	kept := func(k int) int64 { return nn.MoEKeptBytes(n, 64, 16, k, 32, 2) }
	a, b := Estimate(Layout{DP: 1}, shape(2, 4), w), Estimate(Layout{DP: 1}, shape(3, 4), w)
	if got, want := b.Activations-a.Activations, 4*(kept(3)-kept(2)); got != want {
		t.Fatalf("top-3 instead of top-2 adds %d activation bytes, want 4 layers x %d", got, want/4)
	}
	c := Estimate(Layout{DP: 1}, shape(2, 3), w)
	if got, want := c.Activations-a.Activations, int64(n)*3*256*2-kept(2); got != want {
		t.Fatalf("one MoE layer fewer changes the activations by %d bytes, want a dense MLP's minus a MoE layer's, %d", got, want)
	}
}

// TestEstimateCountsGemma4MoEBlock: Gemma 4's MoE block beside the MLP adds, per layer, what
// its device path keeps (nn.MoEBesideKeptBytes) to the activations, with and without
// activation recomputation (where one layer's worth is held at a time).
func TestEstimateCountsGemma4MoEBlock(t *testing.T) {
	dense := ModelShape{Hidden: 64, Intermediate: 256, Heads: 8, KVHeads: 8, HeadDim: 8, Layers: 6, Vocab: 100,
		Global: config.GlobalShape{Full: make([]bool, 6), HeadDim: 8, KVHeads: 8}}
	moe := dense
	moe.Global.BesideExperts, moe.Global.BesideWidth, moe.Global.BesideTopK = 16, 32, 4
	for _, recompute := range []bool{false, true} {
		w := Workload{Rows: 2, SeqLen: 128, ParamBytes: 2, Recompute: recompute}
		layers := int64(6)
		if recompute {
			layers = 1
		}
		kept := nn.MoEBesideKeptBytes(w.Rows*w.SeqLen, 64, 16, 4, 32, 2)
		a, b := Estimate(Layout{DP: 1}, dense, w), Estimate(Layout{DP: 1}, moe, w)
		if got := b.Activations - a.Activations; got != layers*kept {
			t.Errorf("recompute %v: the MoE block adds %d activation bytes, want %d layers x %d", recompute, got, layers, kept)
		}
	}
}
