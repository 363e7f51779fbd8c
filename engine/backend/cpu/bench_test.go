package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// BenchmarkMatMul reports GFLOP/s of out[M,N] = a[M,K] @ b[N,K]^T (Linear) on all cores.
func BenchmarkMatMul(b *testing.B) {
	for _, s := range []struct{ m, n, k int }{{512, 512, 512}, {2048, 768, 768}} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			b.Run(fmt.Sprintf("%dx%dx%d_%v", s.m, s.n, s.k, dt), func(b *testing.B) {
				be := New(Options{})
				defer be.Close()
				r := rand.New(rand.NewPCG(1, 1))
				x := up(b, be, randn(r, s.m*s.k, 1), dt, s.m, s.k)
				w := up(b, be, randn(r, s.n*s.k, 1), dt, s.n, s.k)
				out := zeros(b, be, dt, s.m, s.n)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := be.Linear(out, x, w, tensor.Tensor{}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkAttention reports forward and forward+backward throughput (tokens/s) of causal GQA
// attention over a packed micro-batch of 4 documents x 512 tokens, NH=8, NKV=4, HD=64.
func BenchmarkAttention(b *testing.B) {
	const docs, l, nh, nkv, hd = 4, 512, 8, 4, 64
	n := docs * l
	be := New(Options{})
	defer be.Close()
	r := rand.New(rand.NewPCG(2, 2))
	cu := make([]int32, docs+1)
	for d := range cu {
		cu[d] = int32(d * l)
	}
	q := up(b, be, randn(r, n*nh*hd, 1), tensor.F32, n, nh*hd)
	k := up(b, be, randn(r, n*nkv*hd, 1), tensor.F32, n, nkv*hd)
	v := up(b, be, randn(r, n*nkv*hd, 1), tensor.F32, n, nkv*hd)
	out, lse := zeros(b, be, tensor.F32, n, nh*hd), zeros(b, be, tensor.F32, n, nh)
	dq, dk, dv := zeros(b, be, tensor.F32, n, nh*hd), zeros(b, be, tensor.F32, n, nkv*hd), zeros(b, be, tensor.F32, n, nkv*hd)
	shape := backend.AttentionShape{CuSeqlens: upInts(b, be, cu, docs+1), NH: nh, NKV: nkv, HD: hd}
	// Causal attention FLOPs: 2 matmuls of (L^2/2)*HD per head and document forward, 2.5x that backward.
	fwdFlops := float64(docs) * float64(nh) * 2 * 2 * float64(l*l/2) * hd
	b.Run("forward", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := be.Attention(backend.AttentionArgs{AttentionShape: shape, Out: out, LSE: lse, Q: q, K: k, V: v}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
		b.ReportMetric(fwdFlops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
	b.Run("backward", func(b *testing.B) {
		do := up(b, be, randn(r, n*nh*hd, 1), tensor.F32, n, nh*hd)
		for i := 0; i < b.N; i++ {
			if err := be.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: shape, DQ: dq, DK: dk, DV: dv, DOut: do, Q: q, K: k, V: v, Out: out, LSE: lse}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
	})
}

// BenchmarkCrossEntropy reports tokens/s of the fused LM head + loss, forward and backward, for
// 1024 tokens, C=512 and a 32k vocabulary.
func BenchmarkCrossEntropy(b *testing.B) {
	const n, c, v = 1024, 512, 32000
	be := New(Options{})
	defer be.Close()
	r := rand.New(rand.NewPCG(3, 3))
	h := up(b, be, randn(r, n*c, 1), tensor.F32, n, c)
	w := up(b, be, randn(r, v*c, 0.02), tensor.F32, v, c)
	tg := make([]int32, n)
	for i := range tg {
		tg[i] = int32(r.IntN(v))
	}
	targets := upInts(b, be, tg, n)
	loss, dh, dw := zeros(b, be, tensor.F32, n), zeros(b, be, tensor.F32, n, c), zeros(b, be, tensor.F32, v, c)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.CrossEntropy(backend.CrossEntropyArgs{Hidden: h, Weight: w, Targets: targets, Loss: loss, DHidden: dh, DWeight: dw, GradScale: 1.0 / n}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
	b.ReportMetric(6*float64(n)*c*v*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
