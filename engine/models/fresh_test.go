package models

import (
	"math"
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// TestLazyGradZeroMatchesFill: with HALO_GRAD_ZERO=lazy ZeroGrads leaves the stacked experts'
// gradients unfilled and the blocks' first backward of the step writes them. Starting from
// gradients poisoned with NaN (a previous step's leftovers), one optimizer step's gradients
// over two micro-batches (the second accumulating) equal those of HALO_GRAD_ZERO=fill bit for
// bit, on the device path (grouped weight gradient with =) and on the composed path (zeroed,
// then accumulated), for qwen3_moe, glm4_moe (a dense first layer), gpt_oss (its own
// block, with expert biases) and gemma4_text (the MoE block beside every MLP).
func TestLazyGradZeroMatchesFill(t *testing.T) {
	build := map[string]func() *Model{
		"qwen3_moe":   func() *Model { return tinyMoE(t, "qwen3_moe", nil) },
		"glm4_moe":    func() *Model { return tinyMoE(t, "glm4_moe", nil) },
		"gpt_oss":     func() *Model { return tinyOSS(t, 0.4) },
		"gemma4_text": func() *Model { return tinyGemma4MoE(t) },
	}
	for _, fam := range []string{"qwen3_moe", "glm4_moe", "gpt_oss", "gemma4_text"} {
		for _, path := range []string{"device", "composed"} {
			t.Run(fam+"/"+path, func(t *testing.T) {
				t.Setenv("HALO_MOE_PATH", path)
				run := func(mode string) map[string][]float32 {
					t.Setenv("HALO_GRAD_ZERO", mode)
					m := build[fam]()
					if err := m.EnableGrads(); err != nil {
						t.Fatal(err)
					}
					if mode == "lazy" && len(m.freshGrads) == 0 {
						t.Fatal("the model lists no expert gradients that ZeroGrads may leave unfilled")
					}
					if err := m.b.Fill(m.Grads.Flat, float32(math.NaN())); err != nil {
						t.Fatal(err)
					}
					if err := m.ZeroGrads(); err != nil {
						t.Fatal(err)
					}
					for i, lens := range [][]int{{9, 14, 5}, {11, 7}} {
						if _, _, err := m.ForwardBackward(packedBatch(m.Config().VocabSize, lens, uint64(3+i)), 1); err != nil {
							t.Fatal(err)
						}
					}
					return allGrads(t, m)
				}
				fill, lazy := run("fill"), run("lazy")
				for name, want := range fill {
					got := lazy[name]
					if !slices.EqualFunc(got, want, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
						t.Errorf("%s: the lazily zeroed step's gradient differs from the filled one's", name)
					}
				}
			})
		}
	}
}

// tinyGemma4MoE is the tiny gemma4_text preset with the MoE block (4 experts of width 8,
// top-2) beside every MLP, with random weights.
func tinyGemma4MoE(t *testing.T) *Model {
	t.Helper()
	base, err := config.Preset("gemma4_text", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ApplyOverrides(base, []string{"enable_moe_block=true", "num_experts=4", "top_k_experts=2", "moe_intermediate_size=8"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(c, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.InitRandom(5); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLazyGradZeroSettlesUnwritten: a gradient left unfilled and never written (no pass ran)
// reads as zeros once the step settles, and ZeroGrads fills the rest of the arena.
func TestLazyGradZeroSettlesUnwritten(t *testing.T) {
	t.Setenv("HALO_GRAD_ZERO", "lazy")
	m := tinyMoE(t, "qwen3_moe", nil)
	if err := m.EnableGrads(); err != nil {
		t.Fatal(err)
	}
	if err := m.b.Fill(m.Grads.Flat, 7); err != nil {
		t.Fatal(err)
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	if m.fresh.Len() != len(m.freshGrads) {
		t.Fatalf("%d gradients marked fresh, want %d", m.fresh.Len(), len(m.freshGrads))
	}
	vals, err := backend.ToFloat32(m.b, m.Grads.Flat)
	if err != nil {
		t.Fatal(err)
	}
	inFresh := func(i int) bool {
		for _, r := range m.freshRanges {
			if i >= r[0] && i < r[1] {
				return true
			}
		}
		return false
	}
	for i, v := range vals {
		if want := map[bool]float32{true: 7, false: 0}[inFresh(i)]; v != want {
			t.Fatalf("gradient element %d after ZeroGrads is %g, want %g (fresh ranges left as they were, the rest zeroed)", i, v, want)
		}
	}
	if err := m.SettleGrads(); err != nil {
		t.Fatal(err)
	}
	if vals, err = backend.ToFloat32(m.b, m.Grads.Flat); err != nil {
		t.Fatal(err)
	}
	for i, v := range vals {
		if v != 0 {
			t.Fatalf("gradient element %d after SettleGrads is %g, want 0", i, v)
		}
	}
}
