package models

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestRecomputeLowersPeakMemory checks that activation recomputation actually saves memory:
// the backend's peak allocation during ForwardBackward is lower with it on, and no tensor
// leaks either way.
func TestRecomputeLowersPeakMemory(t *testing.T) {
	b := newCPU()
	a := tinyArch("llama", func(a *Arch) { a.Layers, a.Windows = 6, make([]int, 6) })
	m := newTiny(t, b, a, Options{}, 1)
	if err := m.EnableGrads(); err != nil {
		t.Fatal(err)
	}
	batch := packedBatch(a.Vocab, []int{64, 64}, 2)
	peak := func(recompute bool) int64 {
		m.SetRecompute(recompute)
		before := b.MemStats().Allocated
		b.ResetPeak()
		if _, _, err := m.ForwardBackward(batch, 1); err != nil {
			t.Fatal(err)
		}
		if after := b.MemStats().Allocated; after != before {
			t.Errorf("recompute=%v: %d bytes allocated before, %d after (leak)", recompute, before, after)
		}
		return b.MemStats().Peak - before
	}
	stored, recomputed := peak(false), peak(true)
	t.Logf("activation peak: %d bytes stored, %d recomputed", stored, recomputed)
	if recomputed >= stored*3/4 {
		t.Errorf("recompute peak %d is not clearly below the stored-activation peak %d", recomputed, stored)
	}
}

// TestNoLeaksInInferencePaths checks that Forward, Logprobs, Generate and GenerateBatch free every tensor
// they allocate.
func TestNoLeaksInInferencePaths(t *testing.T) {
	b := newCPU()
	m := newTiny(t, b, tinyArch("qwen3", nil), Options{}, 3)
	before := b.MemStats().Allocated
	batch := packedBatch(m.Arch.Vocab, []int{5, 9}, 4)
	if _, _, err := m.Forward(batch); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Logprobs(batch.Tokens); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Generate(batch.Tokens[:4], GenerateOptions{MaxNewTokens: 5}); err != nil {
		t.Fatal(err)
	}
	stopped := BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: 5, Temperature: 1, Seed: 1, StopIDs: []int32{batch.Tokens[2]}}}
	if _, err := m.GenerateBatch([][]int32{batch.Tokens[:4], batch.Tokens[4:6], {1}}, stopped); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Forward(Batch{Tokens: []int32{1, 99}, Targets: []int32{1, 1}}); err == nil {
		t.Fatal("bad batch accepted")
	}
	if after := b.MemStats().Allocated; after != before {
		t.Errorf("%d bytes allocated before, %d after", before, after)
	}
}

// TestBF16ModelTracksF32 checks the bf16 path (bf16 weights and activations, fp32 statistics):
// its loss and gradients follow the f32 model's within bf16 precision.
func TestBF16ModelTracksF32(t *testing.T) {
	b := newCPU()
	a := familyCases[5].arch // qwen3 with q/k norm
	m32 := newTiny(t, b, a, Options{}, 5)
	m16 := newTiny(t, b, a, Options{DType: tensor.BF16}, 5)
	batch := packedBatch(a.Vocab, []int{9, 7}, 6)
	for _, m := range []*Model{m32, m16} {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
	}
	l32, n, err := m32.ForwardBackward(batch, 1)
	if err != nil {
		t.Fatal(err)
	}
	l16, _, err := m16.ForwardBackward(batch, 1)
	if err != nil {
		t.Fatal(err)
	}
	if rel := math.Abs(l16-l32) / l32; rel > 2e-2 {
		t.Errorf("bf16 loss %.5f vs f32 %.5f (relative %.3g) over %d targets", l16, l32, rel, n)
	}
	for _, s := range m32.Specs {
		g32, _ := m32.GradFloat32(s.Name)
		g16, _ := m16.GradFloat32(s.Name)
		if r := relDiff(g16, g32); r > 0.1 {
			t.Errorf("%s: bf16 gradient relative difference %.3g", s.Name, r)
		}
	}
}
