package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/quant"
)

// loraCases are one tiny model of every registered family with the targets that family
// supports: every linear layer for dense families, the attention projections ("all-linear")
// for mixture-of-experts ones.
func loraCases(t *testing.T) map[string]func(t *testing.T, o Options) *Model {
	cases := map[string]func(t *testing.T, o Options) *Model{}
	for _, fam := range Families() {
		f, _ := Lookup(fam)
		if loraRefused(fam) {
			continue // TestLoRARefusedOnFusedWeights
		}
		if f.FFN != nil {
			cases[fam] = func(t *testing.T, o Options) *Model {
				// Without the aux loss, whose gradient Forward's loss does not include.
				return tinyMoEWith(t, fam, func(c *config.Config) { c.NumHiddenLayers, c.OutputRouterLogits = 2, false }, o)
			}
			continue
		}
		cases[fam] = func(t *testing.T, o Options) *Model { return newTiny(t, newCPU(), tinyArch(fam, nil), o, 3) }
	}
	return cases
}

// randomizeB gives every B a non-zero value so that A has a gradient.
func randomizeB(t *testing.T, m *Model, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 11))
	for _, s := range m.LoRA().Specs {
		if !strings.HasSuffix(s.Name, "lora_B.weight") {
			continue
		}
		v := make([]float32, s.Numel())
		for i := range v {
			v[i] = 0.3 * float32(rng.NormFloat64())
		}
		if err := m.SetAdapterParam(s.Name, v); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoRAGradientsMatchFiniteDifferences(t *testing.T) {
	for fam, mk := range loraCases(t) {
		for _, rec := range []bool{false, true} {
			t.Run(fam+map[bool]string{false: "", true: "/recompute"}[rec], func(t *testing.T) {
				m := mk(t, Options{Recompute: rec})
				if err := m.AttachLoRA(LoRAConfig{R: 2, Alpha: 3, Targets: []string{AllLinear}, RSLoRA: rec, Seed: 4}); err != nil {
					t.Fatal(err)
				}
				randomizeB(t, m, 5)
				b := packedBatch(m.Arch.Vocab, []int{5, 3}, 9)
				if _, _, err := m.ForwardBackward(b, 1); err != nil {
					t.Fatal(err)
				}
				if m.Grads != nil {
					t.Fatal("base gradient arena allocated under LoRA")
				}
				ad := m.LoRA()
				rng := rand.New(rand.NewPCG(1, 2))
				// A perturbation that changes a mixture of experts' top-k choice crosses a
				// discontinuity: such an element is replaced by another.
				composed(m)
				if _, _, err := m.Forward(b); err != nil {
					t.Fatal(err)
				}
				base := selections(m)
				for _, s := range ad.Specs {
					g, err := m.AdapterGradFloat32(s.Name)
					if err != nil {
						t.Fatal(err)
					}
					v, _ := m.AdapterFloat32(s.Name)
					for checked, tries := 0, 0; checked < 2 && tries < 20; tries++ {
						j := rng.IntN(len(v))
						const h = 2e-3
						same := true
						loss := func(d float32) float64 {
							w := slices.Clone(v)
							w[j] += d
							if err := m.SetAdapterParam(s.Name, w); err != nil {
								t.Fatal(err)
							}
							l, _, err := m.Forward(b)
							if err != nil {
								t.Fatal(err)
							}
							for k, sel := range selections(m) {
								same = same && slices.Equal(sel, base[k])
							}
							return l
						}
						fd := (loss(h) - loss(-h)) / (2 * h)
						_ = m.SetAdapterParam(s.Name, v)
						if !same {
							continue
						}
						checked++
						if math.Abs(fd-float64(g[j])) > 2e-2*math.Max(1, math.Abs(fd)) {
							t.Errorf("%s[%d]: gradient %v, finite difference %v", s.Name, j, g[j], fd)
						}
					}
				}
			})
		}
	}
}

func TestLoRAFreshAdaptersLeaveTheModelUnchanged(t *testing.T) {
	for fam, mk := range loraCases(t) {
		t.Run(fam, func(t *testing.T) {
			m := mk(t, Options{})
			ids := packedBatch(m.Arch.Vocab, []int{7}, 3).Tokens
			base, err := m.Logprobs(ids)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.AttachLoRA(LoRAConfig{R: 4, Alpha: 8, Targets: []string{AllLinear}, Seed: 1}); err != nil {
				t.Fatal(err)
			}
			got, err := m.Logprobs(ids)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(base, got) {
				t.Fatalf("fresh adapters (B = 0) changed logprobs: %v vs %v", got, base)
			}
			for i, mod := range m.LoRA().Modules {
				a, _ := m.AdapterFloat32(mod.AName())
				bound := 1 / math.Sqrt(float64(mod.In))
				lo, hi := 0.0, 0.0
				for _, x := range a {
					lo, hi = math.Min(lo, float64(x)), math.Max(hi, float64(x))
				}
				if lo < -bound || hi > bound || hi-lo < bound {
					t.Errorf("module %d %s: A spans [%v, %v], want U(-%v, %v)", i, mod.Name, lo, hi, bound, bound)
				}
				b, _ := m.AdapterFloat32(mod.BName())
				if slices.ContainsFunc(b, func(x float32) bool { return x != 0 }) {
					t.Errorf("%s: B is not zero-initialised", mod.Name)
				}
			}
		})
	}
}

// sgdAdapters takes one plain SGD step on the adapter parameters (the optimizer is not this
// package's; the test needs only the parameters to move).
func sgdAdapters(t *testing.T, m *Model, lr float32) {
	t.Helper()
	ad := m.LoRA()
	if err := m.Backend().Axpy(ad.Params.Flat, -lr, ad.Grads.Flat); err != nil {
		t.Fatal(err)
	}
}

func TestLoRAKeepsTheBaseFrozen(t *testing.T) {
	m := newTiny(t, newCPU(), tinyArch("qwen3", nil), Options{}, 3)
	if err := m.EnableGrads(); err != nil {
		t.Fatal(err)
	}
	before := map[string][]float32{}
	for _, s := range m.Specs {
		before[s.Name], _ = m.ParamFloat32(s.Name)
	}
	if err := m.AttachLoRA(LoRAConfig{R: 2, Alpha: 16, Dropout: 0.1, Targets: []string{"q_proj", "v_proj", "down_proj"}, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	if m.Grads != nil {
		t.Fatal("AttachLoRA kept the base gradient arena")
	}
	b := packedBatch(m.Arch.Vocab, []int{6, 4}, 1)
	first, _, _ := m.Forward(b)
	for range 3 {
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.ForwardBackward(b, 0.1); err != nil {
			t.Fatal(err)
		}
		sgdAdapters(t, m, 0.5)
	}
	if m.Grads != nil {
		t.Fatal("training under LoRA allocated base gradients")
	}
	ad := m.LoRA()
	if got, want := ad.Grads.Flat.Numel(), ad.NumParams(); got != want {
		t.Fatalf("adapter gradient arena has %d elements, want the %d adapter parameters", got, want)
	}
	if len(ad.Modules) != 2*2+2 {
		t.Fatalf("adapted %d modules, want q_proj, v_proj and down_proj of 2 layers", len(ad.Modules))
	}
	for _, s := range m.Specs {
		v, _ := m.ParamFloat32(s.Name)
		if !slices.Equal(v, before[s.Name]) {
			t.Fatalf("base parameter %s changed under LoRA training", s.Name)
		}
	}
	if last, _, _ := m.Forward(b); !(last < first) {
		t.Fatalf("adapter steps did not lower the loss: %v -> %v", first, last)
	}
}

func TestLoRADropoutIsDeterministicAndRecomputable(t *testing.T) {
	run := func(rec bool, p float64) []float32 {
		m := newTiny(t, newCPU(), tinyArch("llama", nil), Options{Recompute: rec}, 3)
		if err := m.AttachLoRA(LoRAConfig{R: 3, Alpha: 6, Dropout: p, Targets: []string{AllLinear}, Seed: 7}); err != nil {
			t.Fatal(err)
		}
		randomizeB(t, m, 2)
		b := packedBatch(m.Arch.Vocab, []int{5, 4}, 2)
		for range 2 {
			if _, _, err := m.ForwardBackward(b, 1); err != nil {
				t.Fatal(err)
			}
		}
		g, _ := m.backendFlat(m.LoRA().Grads)
		return g
	}
	a, b, c := run(false, 0.3), run(true, 0.3), run(false, 0)
	if !slices.Equal(a, b) {
		t.Fatal("dropout gradients differ between stored activations and recomputation")
	}
	if slices.Equal(a, run(false, 0.3)) == false {
		t.Fatal("dropout is not deterministic for a fixed seed")
	}
	if slices.Equal(a, c) {
		t.Fatal("lora_dropout 0.3 gave the same gradients as no dropout")
	}
}

func (m *Model) backendFlat(a *Arena) ([]float32, error) {
	return backend.ToFloat32(m.b, a.Flat)
}

func TestLoRAMergeEqualsAdapterForward(t *testing.T) {
	for fam, mk := range loraCases(t) {
		t.Run(fam, func(t *testing.T) {
			m := mk(t, Options{})
			if err := m.AttachLoRA(LoRAConfig{R: 4, Alpha: 5, Targets: []string{AllLinear}, RSLoRA: true, Seed: 3}); err != nil {
				t.Fatal(err)
			}
			randomizeB(t, m, 8)
			ids := packedBatch(m.Arch.Vocab, []int{9}, 4).Tokens
			adapted, _ := m.Logprobs(ids)
			if err := m.MergeLoRA(); err != nil {
				t.Fatal(err)
			}
			if m.LoRA() != nil {
				t.Fatal("MergeLoRA left adapters attached")
			}
			merged, _ := m.Logprobs(ids)
			if d := maxAbsDiff(adapted, merged); d > 1e-5 {
				t.Fatalf("merged logprobs differ from the adapter forward by %g (fp32)", d)
			}
		})
	}
}

func TestLoRAAdapterSwitchAndNorms(t *testing.T) {
	m := newTiny(t, newCPU(), tinyArch("mistral", nil), Options{}, 3)
	ids := packedBatch(m.Arch.Vocab, []int{6}, 4).Tokens
	base, _ := m.Logprobs(ids)
	if err := m.AttachLoRA(LoRAConfig{R: 2, Alpha: 4, Targets: []string{"o_proj"}, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	randomizeB(t, m, 1)
	on, _ := m.Logprobs(ids)
	if slices.Equal(on, base) {
		t.Fatal("a non-zero adapter did not change logprobs")
	}
	m.SetAdaptersEnabled(false)
	off, _ := m.Logprobs(ids)
	m.SetAdaptersEnabled(true)
	if !slices.Equal(off, base) {
		t.Fatal("logprobs with adapters disabled differ from the base model's")
	}
	norms, err := m.AdapterNorms()
	if err != nil {
		t.Fatal(err)
	}
	if len(norms) != 2 || norms[0].Module != "model.layers.0.self_attn.o_proj" {
		t.Fatalf("norms %+v", norms)
	}
	// Delta against the dense product.
	mod := m.LoRA().Modules[0]
	a, _ := m.AdapterFloat32(mod.AName())
	b, _ := m.AdapterFloat32(mod.BName())
	s := 0.0
	for o := range mod.Out {
		for i := range mod.In {
			d := 0.0
			for r := range 2 {
				d += float64(b[o*2+r]) * float64(a[r*mod.In+i])
			}
			s += d * d
		}
	}
	if want := 2 * math.Sqrt(s); math.Abs(norms[0].Delta-want) > 1e-9*want {
		t.Fatalf("delta norm %v, dense product gives %v", norms[0].Delta, want)
	}
}

func TestLoRARefusesBadConfigs(t *testing.T) {
	dense := func(t *testing.T) *Model { return newTiny(t, newCPU(), tinyArch("llama", nil), Options{}, 3) }
	moe := func(t *testing.T) *Model { return tinyMoE(t, "qwen3_moe", nil) }
	for _, c := range []struct {
		name string
		mk   func(*testing.T) *Model
		cfg  LoRAConfig
		want string
	}{
		{"rank", dense, LoRAConfig{R: 0, Alpha: 1, Targets: []string{"q_proj"}}, "r must be > 0"},
		{"alpha", dense, LoRAConfig{R: 2, Alpha: 0, Targets: []string{"q_proj"}}, "lora_alpha"},
		{"dropout", dense, LoRAConfig{R: 2, Alpha: 1, Dropout: 1, Targets: []string{"q_proj"}}, "lora_dropout"},
		{"no targets", dense, LoRAConfig{R: 2, Alpha: 1}, "target_modules is empty"},
		{"unknown", dense, LoRAConfig{R: 2, Alpha: 1, Targets: []string{"qkv"}}, `"qkv" matches no linear layer`},
		{"lm head", dense, LoRAConfig{R: 2, Alpha: 1, Targets: []string{"lm_head"}}, "not the embedding or the LM head"},
		{"all-linear plus", dense, LoRAConfig{R: 2, Alpha: 1, Targets: []string{"all-linear", "q_proj"}}, "stands alone"},
		{"experts", moe, LoRAConfig{R: 2, Alpha: 1, Targets: []string{"gate_proj"}}, "routed experts"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := c.mk(t)
			err := m.AttachLoRA(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
			if m.LoRA() != nil {
				t.Fatal("a refused config left adapters attached")
			}
		})
	}
}

func TestLoRAMergeRefusesAnNF4Base(t *testing.T) {
	m := newTiny(t, newCPU(), tinyArch("qwen3", nil), Options{}, 3)
	if err := m.QuantizeBase(quant.Config{LoadIn4bit: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.AttachLoRA(LoRAConfig{R: 2, Alpha: 4, Targets: []string{AllLinear}, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	err := m.MergeLoRA()
	if err == nil || !strings.Contains(err.Error(), "quantised to 4 bits") {
		t.Fatalf("merge over an NF4 base: %v", err)
	}
	if m.LoRA() == nil {
		t.Fatal("a refused merge detached the adapters")
	}
}

// loraRefused reports whether fam's model fuses weights that LoRA would have to span.
func loraRefused(fam string) bool {
	c, err := config.Preset(fam, "tiny")
	if err != nil {
		panic(err)
	}
	s := c.Shape()
	// deepseek_v4's host decoder has no adapters (TestDeepseekV4Refusals).
	return s.FusedQKV || s.FusedGateUp || s.V4.HC > 0
}

func TestLoRARefusedOnFusedWeights(t *testing.T) {
	for _, fam := range []string{"phi3", "glm4"} {
		if !loraRefused(fam) {
			t.Fatalf("%s is expected to fuse weights", fam)
		}
		m := newTiny(t, newCPU(), tinyArch(fam, nil), Options{}, 3)
		err := m.AttachLoRA(LoRAConfig{R: 2, Alpha: 3, Targets: []string{AllLinear}})
		if err == nil || !strings.Contains(err.Error(), "fused") {
			t.Errorf("%s: AttachLoRA = %v, want a refusal naming the fused weights", fam, err)
		}
		if m.LoRA() != nil {
			t.Errorf("%s: adapters attached after the refusal", fam)
		}
	}
}

// withoutDropoutOp hides the backend's Dropout op, so that LoRA dropout takes its fallback
// (the host mask through ScaleRows).
type withoutDropoutOp struct{ backend.Backend }

func (w withoutDropoutOp) Optional() backend.Optional {
	o := w.Backend.Optional()
	o.Dropout = nil
	return o
}

// TestLoRADropoutFallbackMatchesTheOp: adapters trained with dropout on a backend whose
// Dropout op draws the mask and on one that builds it on the host get the same gradients to
// the bit, with and without recomputation.
func TestLoRADropoutFallbackMatchesTheOp(t *testing.T) {
	run := func(b backend.Backend, rec bool) []float32 {
		m := newTiny(t, b, tinyArch("qwen3", nil), Options{Recompute: rec}, 3)
		if err := m.AttachLoRA(LoRAConfig{R: 3, Alpha: 6, Dropout: 0.2, Targets: []string{AllLinear}, Seed: 7}); err != nil {
			t.Fatal(err)
		}
		randomizeB(t, m, 2)
		if _, _, err := m.ForwardBackward(packedBatch(m.Arch.Vocab, []int{6, 5}, 2), 1); err != nil {
			t.Fatal(err)
		}
		g, _ := m.backendFlat(m.LoRA().Grads)
		return g
	}
	for _, rec := range []bool{false, true} {
		op, host := run(newCPU(), rec), run(withoutDropoutOp{newCPU()}, rec)
		if !slices.Equal(op, host) {
			t.Fatalf("recompute %v: gradients with the Dropout op differ from the host mask's", rec)
		}
	}
}
