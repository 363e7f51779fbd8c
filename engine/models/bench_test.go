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

// BenchmarkForwardBackward reports training throughput (tokens/s) of one packed micro-batch of
// 4 documents x 256 tokens on the CPU backend.
func BenchmarkForwardBackward(b *testing.B) {
	for _, recompute := range []bool{false, true} {
		name := "stored"
		if recompute {
			name = "recompute"
		}
		b.Run(name, func(b *testing.B) {
			be := newCPU()
			m := newTiny(b, be, benchArch(), Options{Recompute: recompute}, 1)
			batch := packedBatch(m.Arch.Vocab, []int{256, 256, 256, 256}, 2)
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
		})
	}
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
