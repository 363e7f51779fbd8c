package models

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// TestPhimoeLoadsTransformersNames: a PhiMoE checkpoint under the names transformers 5 may give
// it — the block as mlp, the router as mlp.router, the experts fused (gate_up_proj [E,2I,C],
// down_proj [E,C,I]) or one by one (mlp.experts.<e>.w1/w3/w2) — loads into the same model as
// the Hub names (block_sparse_moe, gate) Save writes.
func TestPhimoeLoadsTransformersNames(t *testing.T) {
	m := tinyMoE(t, "phimoe", func(c *config.Config) { c.AttentionBias, c.LMHeadBias = true, true })
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cfg, err := os.ReadFile(dir + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	rename := func(n string) string {
		n = strings.Replace(n, ".block_sparse_moe.gate.", ".mlp.router.", 1)
		return strings.Replace(n, ".block_sparse_moe.", ".mlp.", 1)
	}
	for _, fused := range []bool{true, false} {
		t.Run(map[bool]string{true: "fused", false: "per expert"}[fused], func(t *testing.T) {
			var out []safetensors.Tensor
			e := m.Arch.Experts
			for l := range m.Arch.Layers {
				if !fused {
					break
				}
				pre := fmt.Sprintf("model.layers.%d.", l)
				var gu, dn []byte
				for x := 0; x < e; x++ {
					for _, p := range []string{"w1", "w3"} {
						info, _ := ck.Tensor(fmt.Sprintf("%sblock_sparse_moe.experts.%d.%s.weight", pre, x, p))
						gu = append(gu, info.Data...)
					}
					info, _ := ck.Tensor(fmt.Sprintf("%sblock_sparse_moe.experts.%d.w2.weight", pre, x))
					dn = append(dn, info.Data...)
				}
				in, c := m.Arch.ExpertIntermediate, m.Arch.Hidden
				out = append(out, safetensors.Tensor{Name: pre + "mlp.experts.gate_up_proj", DType: safetensors.F32, Shape: []int{e, 2 * in, c}, Data: gu},
					safetensors.Tensor{Name: pre + "mlp.experts.down_proj", DType: safetensors.F32, Shape: []int{e, c, in}, Data: dn})
			}
			for _, n := range ck.Names() {
				if fused && strings.Contains(n, ".experts.") {
					continue
				}
				info, _ := ck.Tensor(n)
				out = append(out, safetensors.Tensor{Name: rename(n), DType: info.DType, Shape: info.Shape, Data: info.Data})
			}
			fdir := t.TempDir()
			if err := safetensors.Save(fdir+"/model.safetensors", out, nil); err != nil {
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
				t.Errorf("tensors not used: %v", back.Unused)
			}
			for _, s := range m.Specs {
				a, _ := m.ParamFloat32(s.Name)
				b, err := back.ParamFloat32(s.Name)
				if err != nil || !slices.Equal(a, b) {
					t.Errorf("%s differs after loading transformers' names (%v)", s.Name, err)
				}
			}
		})
	}
}

// TestPhimoeLongRoPEScale: under longrope the rotary tables are scaled by the file's mscale
// (PhimoeRotaryEmbedding's short_mscale and long_mscale), not by longrope's own attention
// factor, and the model's logprobs move with it.
func TestPhimoeLongRoPEScale(t *testing.T) {
	logprobs := func(mscale float64) ([]float32, Arch) {
		return phimoeLongRoPELogprobs(t, mscale, "[2.0, 4.0]")
	}
	a, arch := logprobs(1.3)
	_, scale, err := arch.Rope.Compute(11)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(scale)-1.3) > 1e-6 {
		t.Errorf("rotary scale %v, want the mscale 1.3 (longrope's own factor would be %v)", scale, math.Sqrt(1+math.Log(8)/math.Log(8)))
	}
	b, _ := logprobs(1.0)
	diff := 0.0
	for i := range a {
		diff = math.Max(diff, math.Abs(float64(a[i]-b[i])))
	}
	if diff < 1e-4 {
		t.Errorf("the mscale moved no logprob (max %g)", diff)
	}
}

// phimoeLongRoPELogprobs returns the logprobs of 11 ids (past the original context of 8) from a
// tiny phimoe under longrope with the given mscale (short and long alike) and long_factor, and
// the model's Arch.
func phimoeLongRoPELogprobs(t *testing.T, mscale float64, longFactor string) ([]float32, Arch) {
	t.Helper()
	m := tinyMoE(t, "phimoe", func(c *config.Config) {
		p := fmt.Sprintf(`{"model_type": "phimoe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 12,
			"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 6,
			"max_position_embeddings": 64, "initializer_range": 0.3, "dtype": "float32",
			"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 8,
			"short_factor": [1.0, 1.5], "long_factor": %s, "short_mscale": %v, "long_mscale": %v}}`, longFactor, mscale, mscale)
		n, err := config.Parse([]byte(p), "config.json")
		if err != nil {
			t.Fatal(err)
		}
		*c = *n
	})
	ids := []int32{3, 17, 0, 36, 5, 5, 21, 9, 30, 2, 40}
	lp, err := m.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	return lp, m.Arch
}

// TestPhimoeLongRoPEShortFactors: transformers 5's PhimoeRotaryEmbedding computes its
// frequencies from short_factor whatever the length, so a sequence past the original context
// rotates as a short one and long_factor changes no logprob.
func TestPhimoeLongRoPEShortFactors(t *testing.T) {
	a, arch := phimoeLongRoPELogprobs(t, 1.2, "[2.0, 4.0]")
	if !arch.Rope.ShortFactorsOnly || arch.Rope.LongRoPE(11) || arch.Rope.DependsOnLength() {
		t.Errorf("rope %+v: want short factors at every length", arch.Rope)
	}
	short, _, err := arch.Rope.Compute(1)
	if err != nil {
		t.Fatal(err)
	}
	long, _, err := arch.Rope.Compute(11)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(short, long) {
		t.Errorf("inv_freq at 11 tokens %v, at 1 token %v: want the short factors' both times", long, short)
	}
	b, _ := phimoeLongRoPELogprobs(t, 1.2, "[7.0, 9.0]")
	if !slices.Equal(a, b) {
		t.Errorf("long_factor moved the logprobs: %v, then %v", a, b)
	}
}
