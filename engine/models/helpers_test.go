package models

import (
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// tinyArch is a small decoder of the given dense family for fast tests: the family's default
// config.json cut to tiny sizes, so the structure (biases, q/k norm) is the family's own; mod
// adjusts it.
func tinyArch(family string, mod func(*Arch)) Arch {
	c, err := config.New(family)
	if err != nil {
		panic(err)
	}
	c.VocabSize, c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers = 37, 16, 24, 2
	c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim = 4, 2, 4
	if family == "gemma4_text" {
		// No per-layer inputs unless a case sets them (Global); full layers of 8-wide heads.
		c.HiddenSizePerLayerInput, c.GlobalHeadDim = 0, 8
	}
	a, err := ArchFromConfig(c)
	if err != nil {
		panic(err)
	}
	a.Config = nil // built by hand from here on
	a.NormEps, a.InitStd, a.PadID = 1e-6, 0.3, 0
	a.Windows = []int{0, 0}
	a.Rope = backend.RoPEConfig{Theta: 10000, HeadDim: 4, MaxPositionEmbeddings: 64}
	if mod != nil {
		mod(&a)
	}
	a.Rope.HeadDim = a.HeadDim
	if a.Global.Full != nil {
		a.Rope.HeadDim = a.Global.HeadDim // gemma4_text: the main table is the full layers'
	}
	if a.SlidingRope != nil {
		a.SlidingRope.HeadDim = a.HeadDim
		if len(a.LocalRope) != a.Layers {
			a.LocalRope = make([]bool, a.Layers)
		}
	}
	return a
}

func newCPU() backend.Backend { return cpu.New(cpu.Options{}) }

// newTiny builds a randomly initialised model with non-trivial norms and biases.
func newTiny(t testing.TB, b backend.Backend, a Arch, o Options, seed uint64) *Model {
	t.Helper()
	f, err := Lookup(a.ModelType)
	if err != nil {
		t.Fatal(err)
	}
	m, err := newModel(f, a, nil, b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.InitRandom(seed); err != nil {
		t.Fatal(err)
	}
	perturb(t, m, seed)
	return m
}

// perturb makes norm weights and biases non-trivial so tests exercise their gradients.
func perturb(t testing.TB, m *Model, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	for _, s := range m.Specs {
		if s.Init == InitNormal {
			continue
		}
		v, err := m.ParamFloat32(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		for i := range v {
			if s.Init == InitOnes || s.Init == InitUnit {
				v[i] = 1 + 0.2*float32(rng.NormFloat64())
			} else {
				v[i] = 0.2 * float32(rng.NormFloat64())
			}
		}
		if err := m.SetParam(s.Name, v); err != nil {
			t.Fatal(err)
		}
	}
}

// packedBatch makes documents of the given lengths with next-token targets inside each
// document (the last token of a document is ignored).
func packedBatch(vocab int, lens []int, seed uint64) Batch {
	rng := rand.New(rand.NewPCG(seed, 7))
	var b Batch
	b.DocStarts = []int32{0}
	for _, l := range lens {
		start := len(b.Tokens)
		for i := 0; i < l; i++ {
			b.Tokens = append(b.Tokens, int32(rng.IntN(vocab)))
			b.Positions = append(b.Positions, int32(i))
		}
		for i := 0; i < l; i++ {
			if i == l-1 {
				b.Targets = append(b.Targets, backend.IgnoreIndex)
			} else {
				b.Targets = append(b.Targets, b.Tokens[start+i+1])
			}
		}
		b.DocStarts = append(b.DocStarts, int32(len(b.Tokens)))
	}
	return b
}

// allGrads downloads every gradient by name.
func allGrads(t testing.TB, m *Model) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for _, s := range m.Specs {
		g, err := m.GradFloat32(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		out[s.Name] = g
	}
	return out
}

func relDiff(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func maxAbsDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}

var _ = tensor.F32

// norm is the Euclidean norm of a.
func norm(a []float32) float64 {
	var s float64
	for _, v := range a {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

// checkLoadsAs saves tensors as a checkpoint beside dir's config.json, loads it, and checks
// that every tensor is used and every parameter equals m's: the checkpoint is m under other
// names or layouts (what says which, in errors).
func checkLoadsAs(t *testing.T, m *Model, dir string, tensors []safetensors.Tensor, what string) {
	t.Helper()
	fdir := t.TempDir()
	if err := safetensors.Save(fdir+"/model.safetensors", tensors, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(dir + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fdir+"/config.json", cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := Load(fdir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if len(back.Unused) != 0 {
		t.Errorf("%s: tensors not used: %v", what, back.Unused)
	}
	for _, s := range m.Specs {
		a, _ := m.ParamFloat32(s.Name)
		b, err := back.ParamFloat32(s.Name)
		if err != nil || !slices.Equal(a, b) {
			t.Errorf("%s differs after %s (%v)", s.Name, what, err)
		}
	}
}
