package models

import (
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// benchArch is a small but non-trivial Qwen3-shaped model (about 7M parameters).
func benchArch() Arch {
	return tinyArch("qwen3", func(a *Arch) {
		a.Vocab, a.Hidden, a.Intermediate, a.Layers = 4096, 256, 768, 4
		a.Heads, a.KVHeads, a.HeadDim = 8, 4, 32
		a.Windows = make([]int, a.Layers)
		a.Rope = backend.RoPEConfig{Theta: 1e6, MaxPositionEmbeddings: 4096}
	})
}

// quickstartArch is the shape of examples/quickstart.yaml (Qwen3, 0.6M parameters).
func quickstartArch() Arch {
	return tinyArch("qwen3", func(a *Arch) {
		a.Vocab, a.Hidden, a.Intermediate, a.Layers = 280, 128, 384, 3
		a.Heads, a.KVHeads, a.HeadDim, a.Tied = 4, 2, 32, true
		a.Windows = make([]int, a.Layers)
		a.Rope = backend.RoPEConfig{Theta: 10000, MaxPositionEmbeddings: 128}
	})
}

// BenchmarkForwardBackward reports training throughput (tokens/s) of one packed micro-batch on
// the CPU backend: the quickstart shape (16 x 32 tokens) and a 7M-parameter Qwen3 shape
// (4 x 256 tokens), with stored or recomputed activations.
func BenchmarkForwardBackward(b *testing.B) {
	shapes := []struct {
		name string
		arch Arch
		docs []int
	}{
		{"quickstart", quickstartArch(), []int{32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32}},
		{"qwen3-7M", benchArch(), []int{256, 256, 256, 256}},
	}
	for _, sh := range shapes {
		for _, recompute := range []bool{false, true} {
			name := sh.name + "/stored"
			if recompute {
				name = sh.name + "/recompute"
			}
			b.Run(name, func(b *testing.B) {
				benchFB(b, sh.arch, sh.docs, recompute)
			})
		}
	}
}

func benchFB(b *testing.B, arch Arch, docs []int, recompute bool) {
	be := newCPU()
	m := newTiny(b, be, arch, Options{Recompute: recompute}, 1)
	batch := packedBatch(m.Arch.Vocab, docs, 2)
	if err := m.ZeroGrads(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, _, err := m.ForwardBackward(batch, 1e-3); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(batch.Tokens))/time.Since(start).Seconds(), "tok/s")
}

// BenchmarkGenerate reports KV-cache decoding speed (new tokens/s) after a 64-token prompt.
func BenchmarkGenerate(b *testing.B) {
	be := newCPU()
	m := newTiny(b, be, benchArch(), Options{}, 1)
	prompt := packedBatch(m.Arch.Vocab, []int{64}, 3).Tokens
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := m.Generate(prompt, GenerateOptions{MaxNewTokens: 32}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*32)/time.Since(start).Seconds(), "tok/s")
}
