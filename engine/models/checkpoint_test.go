package models

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func tinyConfig(t *testing.T, family string) *config.Config {
	t.Helper()
	c, err := config.Preset(family, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize = 61
	c.HiddenSize, c.IntermediateSize, c.HeadDim = 32, 48, 8
	return c
}

// TestSaveLoadRoundTrip saves every family (single file and sharded) and loads it back: the
// parameters are bit-identical and so are the logprobs; config.json survives.
func TestSaveLoadRoundTrip(t *testing.T) {
	for _, fam := range Families() {
		for _, shard := range []int64{0, 20_000} {
			t.Run(fam, func(t *testing.T) {
				b := newCPU()
				cfg := tinyConfig(t, fam)
				m, err := New(cfg, b, Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if err := m.InitRandom(21); err != nil {
					t.Fatal(err)
				}
				perturb(t, m, 21)
				dir := t.TempDir()
				if err := m.Save(dir, SaveOptions{MaxShardSize: shard}); err != nil {
					t.Fatal(err)
				}
				_, errIdx := os.Stat(filepath.Join(dir, safetensors.IndexName))
				if sharded := errIdx == nil; sharded != (shard > 0) {
					t.Errorf("index present = %v with max shard size %d", sharded, shard)
				}
				m2, err := Load(dir, b, Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer m2.Close()
				if m2.Arch.ModelType != fam || !slices.Equal(m2.Config().Architectures, m.Family.Architectures[:1]) {
					t.Errorf("reloaded model_type %q architectures %v", m2.Arch.ModelType, m2.Config().Architectures)
				}
				for _, s := range m.Specs {
					a, _ := m.ParamFloat32(s.Name)
					c, err := m2.ParamFloat32(s.Name)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(a, c) {
						t.Errorf("%s changed in the round trip", s.Name)
					}
				}
				ids := []int32{5, 17, 33, 2, 60, 8}
				l1, err := m.Logprobs(ids)
				if err != nil {
					t.Fatal(err)
				}
				l2, err := m2.Logprobs(ids)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(l1, l2) {
					t.Errorf("logprobs %v before save, %v after load", l1, l2)
				}
			})
		}
	}
}

// TestSaveBF16 checks that weights saved as bf16 are the bf16 rounding of the f32 weights and
// that config.json says so.
func TestSaveBF16(t *testing.T) {
	b := newCPU()
	m, err := New(tinyConfig(t, "qwen3"), b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.InitRandom(3); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{DType: tensor.BF16}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DType != "bfloat16" {
		t.Errorf("config dtype %q, want bfloat16", cfg.DType)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	info, _ := ck.Tensor(nameEmbed)
	if info.DType != safetensors.BF16 {
		t.Fatalf("stored dtype %v", info.DType)
	}
	got, _ := safetensors.ToFloat32(info)
	want, _ := m.ParamFloat32(nameEmbed)
	for i := range want {
		if r := tensor.BF16ToF32(tensor.F32ToBF16(want[i])); got[i] != r {
			t.Fatalf("element %d: stored %v, want bf16(%v) = %v", i, got[i], want[i], r)
		}
	}
	// A bf16 model loads it without conversion loss.
	m2, err := Load(dir, b, Options{DType: tensor.BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	v, _ := m2.ParamFloat32(nameEmbed)
	if !slices.Equal(v, got) {
		t.Error("bf16 model did not load the stored bf16 values exactly")
	}
}

// TestLoadErrors checks that broken checkpoints are refused with the tensor named.
func TestLoadErrors(t *testing.T) {
	b := newCPU()
	cfg := tinyConfig(t, "llama")
	m, err := New(cfg, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tensors, err := m.WeightTensors(tensor.F32)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func([]safetensors.Tensor) []safetensors.Tensor
		want string
	}{
		{"missing tensor", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return slices.DeleteFunc(ts, func(t safetensors.Tensor) bool { return t.Name == "model.layers.1.mlp.up_proj.weight" })
		}, `no tensor "model.layers.1.mlp.up_proj.weight"`},
		{"wrong shape", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == "model.norm.weight" {
					ts[i] = safetensors.Tensor{Name: ts[i].Name, DType: safetensors.F32, Shape: []int{3}, Data: make([]byte, 12)}
				}
			}
			return ts
		}, `"model.norm.weight"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := cfg.Write(filepath.Join(dir, "config.json")); err != nil {
				t.Fatal(err)
			}
			if _, err := safetensors.SaveCheckpoint(dir, tc.edit(slices.Clone(tensors)), safetensors.CheckpointOptions{}); err != nil {
				t.Fatal(err)
			}
			_, err := Load(dir, b, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error %v, want it to mention %s", err, tc.want)
			}
		})
	}
	if _, err := Load(t.TempDir(), b, Options{}); err == nil {
		t.Error("Load of an empty directory succeeded")
	}
}

// TestInitRandom checks transformers' initialisation: normal(0, initializer_range) for
// matrices, ones for norms, zeros for biases, the pad row zeroed; reproducible by seed.
func TestInitRandom(t *testing.T) {
	b := newCPU()
	a := tinyArch("llama", func(a *Arch) { a.QKVBias, a.Vocab, a.Hidden, a.PadID = true, 400, 32, 7 })
	m := newTiny(t, b, a, Options{}, 1)
	if err := m.InitRandom(5); err != nil {
		t.Fatal(err)
	}
	for _, s := range m.Specs {
		v, _ := m.ParamFloat32(s.Name)
		switch s.Init {
		case InitOnes, InitZeros:
			want := float32(0)
			if s.Init == InitOnes {
				want = 1
			}
			for i, x := range v {
				if x != want {
					t.Fatalf("%s[%d] = %v, want %v", s.Name, i, x, want)
				}
			}
		case InitNormal:
			if s.Decay != true || len(s.Shape) != 2 {
				t.Errorf("%s: matrix with decay=%v shape %v", s.Name, s.Decay, s.Shape)
			}
			var sum, sq float64
			for _, x := range v {
				sum += float64(x)
				sq += float64(x) * float64(x)
			}
			n := float64(len(v))
			mean, std := sum/n, math.Sqrt(sq/n-(sum/n)*(sum/n))
			if math.Abs(mean) > 4*a.InitStd/math.Sqrt(n) || math.Abs(std-a.InitStd) > 0.1*a.InitStd {
				t.Errorf("%s: mean %.4f std %.4f, want 0 and %.2f", s.Name, mean, std, a.InitStd)
			}
		}
	}
	emb, _ := m.ParamFloat32(nameEmbed)
	if row := emb[7*32 : 8*32]; slices.ContainsFunc(row, func(x float32) bool { return x != 0 }) {
		t.Error("pad_token_id row of the embedding is not zero")
	}
	first := slices.Clone(emb)
	if err := m.InitRandom(5); err != nil {
		t.Fatal(err)
	}
	if again, _ := m.ParamFloat32(nameEmbed); !slices.Equal(again, first) {
		t.Error("same seed gave different weights")
	}
	if err := m.InitRandom(6); err != nil {
		t.Fatal(err)
	}
	if other, _ := m.ParamFloat32(nameEmbed); slices.Equal(other, first) {
		t.Error("different seeds gave the same weights")
	}
}

// TestBatchValidation checks that malformed batches are refused with a message naming the
// problem, before any work.
func TestBatchValidation(t *testing.T) {
	b := newCPU()
	m := newTiny(t, b, tinyArch("llama", nil), Options{}, 1)
	cases := []struct {
		name  string
		batch Batch
		want  string
	}{
		{"empty", Batch{Targets: []int32{}}, "no tokens"},
		{"token out of vocab", Batch{Tokens: []int32{1, 37}, Targets: []int32{1, 2}}, "token 37 at position 1"},
		{"negative token", Batch{Tokens: []int32{-1}, Targets: []int32{1}}, "token -1 at position 0"},
		{"target out of vocab", Batch{Tokens: []int32{1, 2}, Targets: []int32{99, -100}}, "target 99 at position 0"},
		{"targets length", Batch{Tokens: []int32{1, 2}, Targets: []int32{1}}, "1 targets for 2 tokens"},
		{"positions length", Batch{Tokens: []int32{1, 2}, Positions: []int32{0}, Targets: []int32{1, 2}}, "1 positions for 2 tokens"},
		{"doc starts end", Batch{Tokens: []int32{1, 2}, DocStarts: []int32{0, 1}, Targets: []int32{1, 2}}, "end at 2"},
		{"doc starts order", Batch{Tokens: []int32{1, 2, 3}, DocStarts: []int32{0, 2, 2, 3}, Targets: []int32{1, 2, 3}}, "strictly increasing"},
		{"negative position", Batch{Tokens: []int32{1, 2}, Positions: []int32{0, -4}, DocStarts: []int32{0, 2}, Targets: []int32{1, 2}}, "position -4"},
		{"no targets", Batch{Tokens: []int32{1, 2}}, "Targets"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := m.ForwardBackward(tc.batch, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// TestDerivedDocumentsFromPositions checks that a batch with only Positions is split into
// documents where positions restart, giving the same result as explicit DocStarts.
func TestDerivedDocumentsFromPositions(t *testing.T) {
	b := newCPU()
	m := newTiny(t, b, tinyArch("qwen3", nil), Options{}, 2)
	explicit := packedBatch(m.Arch.Vocab, []int{4, 6}, 3)
	derived := explicit
	derived.DocStarts = nil
	l1, err := m.TokenLogprobs(explicit)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m.TokenLogprobs(derived)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l1, l2) {
		t.Errorf("logprobs with DocStarts %v, derived from positions %v", l1, l2)
	}
}
