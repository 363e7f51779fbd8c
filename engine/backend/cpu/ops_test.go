package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func refGEMM(ta, tb bool, m, n, k int, alpha float64, a, b []float64, beta float64, c []float64) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				av := a[i*k+p]
				if ta {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if tb {
					bv = b[j*k+p]
				}
				s += av * bv
			}
			out[i*n+j] = alpha*s + beta*c[i*n+j]
		}
	}
	return out
}

// kernels lists the micro-kernels the GEMM can run with on this machine.
func kernels() map[string]microKernel {
	ks := map[string]microKernel{
		"portable4x4":         {mr: 4, nr: 4, run: kernel4x4},
		"portable6x16":        {mr: 6, nr: 16, run: kernel6x16Go},
		"portable6x16_direct": {mr: 6, nr: 16, run: kernel6x16Go, direct: kernel6x16StridedGo},
		"6x16_direct_storeC":  {6, 16, kernel6x16, kernel6x16Strided, kernel6x16C, kernel6x16StridedC},
	}
	if useAVX2 {
		ks["avx2_6x16"] = microKernel{mr: 6, nr: 16, run: kernel6x16}
		ks["avx2_6x16_direct"] = microKernel{mr: 6, nr: 16, run: kernel6x16, direct: kernel6x16Strided}
	}
	return ks
}

func TestKernel6x16MatchesPortable(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA on this CPU: only the portable kernel runs")
	}
	r := rand.New(rand.NewPCG(30, 31))
	for _, k := range []int{0, 1, 7, 300} {
		a, b := f32s(randn(r, 6*k+1, 1)), f32s(randn(r, 16*k+1, 1))
		got, want := make([]float32, 96), make([]float32, 96)
		for i := range got {
			got[i] = 5 // stale contents must be overwritten
		}
		kernel6x16(k, a, b, got)
		kernel6x16Go(k, a, b, want)
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-4*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("k=%d acc[%d] = %v, portable %v", k, i, got[i], want[i])
			}
		}
		// The strided kernel reads the same A from 6 rows of stride lda.
		lda := k + 3
		as := f32s(randn(r, 6*lda+1, 1))
		for p := 0; p < k; p++ {
			for row := 0; row < 6; row++ {
				a[p*6+row] = as[row*lda+p]
			}
		}
		kernel6x16Go(k, a, b, want)
		kernel6x16Strided(k, as, lda, b, got)
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-4*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("strided k=%d acc[%d] = %v, packed %v", k, i, got[i], want[i])
			}
		}
	}
}

func TestGEMMMatchesNaive(t *testing.T) {
	for name, kern := range kernels() {
		t.Run(name, func(t *testing.T) {
			saved := gemmKernel
			gemmKernel = kern
			defer func() { gemmKernel = saved }()
			testGEMMMatchesNaive(t)
		})
	}
}

func testGEMMMatchesNaive(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		m, n, k     int
		ta, tb      bool
		alpha, beta float64
		dt          tensor.DType
	}{
		{1, 1, 1, false, false, 1, 0, tensor.F32},
		{1, 70, 33, false, true, 1, 0, tensor.F32},  // decode-sized: unpacked path
		{3, 9, 20, false, true, 0.5, 2, tensor.F32}, // unpacked path with beta
		{7, 5, 3, false, true, 1, 0, tensor.F32},
		{9, 13, 17, true, false, 0.5, 1, tensor.F32},
		{70, 66, 33, true, true, -1.5, 0.25, tensor.F32},
		{130, 67, 5, false, false, 1, 2, tensor.F32},
		{33, 65, 40, false, true, 1, 0, tensor.BF16},
		{4, 4, 0, false, false, 1, 0.5, tensor.F32},
		{130, 140, 300, false, true, 1, 0.5, tensor.F32}, // several tiles and reduction blocks
		{100, 20, 520, true, false, 2, 0, tensor.F32},
	} {
		t.Run(fmt.Sprintf("%dx%dx%d_ta%v_tb%v_%v", tc.m, tc.n, tc.k, tc.ta, tc.tb, tc.dt), func(t *testing.T) {
			a := rounded(randn(r, tc.m*tc.k, 1), tc.dt)
			bb := rounded(randn(r, tc.k*tc.n, 1), tc.dt)
			c := rounded(randn(r, tc.m*tc.n, 1), tc.dt)
			ash := []int{tc.m, tc.k}
			if tc.ta {
				ash = []int{tc.k, tc.m}
			}
			bsh := []int{tc.k, tc.n}
			if tc.tb {
				bsh = []int{tc.n, tc.k}
			}
			C := up(t, b, c, tc.dt, tc.m, tc.n)
			must(t, b.GEMM(backend.GEMMArgs{A: up(t, b, a, tc.dt, ash...), B: up(t, b, bb, tc.dt, bsh...), C: C,
				TransA: tc.ta, TransB: tc.tb, Alpha: float32(tc.alpha), Beta: float32(tc.beta)}))
			want := refGEMM(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, a, bb, tc.beta, c)
			tol := 1e-5 + 1e-7*float64(tc.k) // fp32 rounding grows with the reduction length
			if tc.dt == tensor.BF16 {
				tol = 1e-2
			}
			approx(t, "C", down(t, b, C), want, tol, tol)
		})
	}
}

func TestGEMMBetaZeroIgnoresNaN(t *testing.T) {
	b := newTestBackend(t)
	C := up(t, b, []float64{math.NaN(), math.NaN(), math.NaN(), math.NaN()}, tensor.F32, 2, 2)
	A := up(t, b, []float64{1, 2, 3, 4}, tensor.F32, 2, 2)
	must(t, b.GEMM(backend.GEMMArgs{A: A, B: A, C: C, Alpha: 1}))
	approx(t, "C", down(t, b, C), []float64{7, 10, 15, 22}, 0, 0)
	// Full register tiles (stored straight into C) must not read C either.
	r := rand.New(rand.NewPCG(70, 71))
	m, n, k := 12, 32, 5
	nan := make([]float64, m*n)
	for i := range nan {
		nan[i] = math.NaN()
	}
	a, bb := randn(r, m*k, 1), randn(r, k*n, 1)
	C = up(t, b, nan, tensor.F32, m, n)
	must(t, b.GEMM(backend.GEMMArgs{A: up(t, b, a, tensor.F32, m, k), B: up(t, b, bb, tensor.F32, k, n), C: C, Alpha: 2}))
	approx(t, "C full tiles", down(t, b, C), refGEMM(false, false, m, n, k, 2, rounded(a, tensor.F32), rounded(bb, tensor.F32), 0, make([]float64, m*n)), 1e-5, 1e-5)
}

func TestGEMMDeterministicAcrossWorkerCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	a, bb := randn(r, 150*97, 1), randn(r, 97*131, 1)
	var first []float64
	for _, w := range []int{1, 2, 5} {
		b := New(Options{Workers: w})
		C := zeros(t, b, tensor.F32, 150, 131)
		must(t, b.GEMM(backend.GEMMArgs{A: up(t, b, a, tensor.F32, 150, 97), B: up(t, b, bb, tensor.F32, 97, 131), C: C, Alpha: 1}))
		got := down(t, b, C)
		b.Close()
		if first == nil {
			first = got
			continue
		}
		for i := range got {
			if got[i] != first[i] {
				t.Fatalf("workers=%d: C[%d] = %v, with 1 worker %v", w, i, got[i], first[i])
			}
		}
	}
}

func refLinear(x, w, bias []float64, m, in, o int) []float64 {
	out := make([]float64, m*o)
	for i := 0; i < m; i++ {
		for j := 0; j < o; j++ {
			s := 0.0
			if bias != nil {
				s = bias[j]
			}
			for p := 0; p < in; p++ {
				s += x[i*in+p] * w[j*in+p]
			}
			out[i*o+j] = s
		}
	}
	return out
}

func TestLinearForwardBackward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		m, in, o int
		bias     bool
		accDX    bool
	}{
		{1, 1, 1, false, false},
		{5, 7, 3, true, false},
		{9, 4, 11, true, true},
		{17, 6, 5, false, true},
	} {
		t.Run(fmt.Sprintf("%dx%d->%d_bias%v_acc%v", tc.m, tc.in, tc.o, tc.bias, tc.accDX), func(t *testing.T) {
			x, w := randn(r, tc.m*tc.in, 1), randn(r, tc.o*tc.in, 1)
			var bias []float64
			var B T
			if tc.bias {
				bias = randn(r, tc.o, 1)
				B = up(t, b, bias, tensor.F32, tc.o)
			}
			X, W := up(t, b, x, tensor.F32, tc.m, tc.in), up(t, b, w, tensor.F32, tc.o, tc.in)
			out := zeros(t, b, tensor.F32, tc.m, tc.o)
			must(t, b.Linear(out, X, W, B))
			approx(t, "out", down(t, b, out), refLinear(x, w, bias, tc.m, tc.in, tc.o), 1e-5, 1e-5)

			g := randn(r, tc.m*tc.o, 1)
			dx0, dw0, db0 := randn(r, tc.m*tc.in, 1), randn(r, tc.o*tc.in, 1), randn(r, tc.o, 1)
			dX, dW, dB := up(t, b, dx0, tensor.F32, tc.m, tc.in), up(t, b, dw0, tensor.F32, tc.o, tc.in), up(t, b, db0, tensor.F32, tc.o)
			must(t, b.LinearBackward(backend.LinearBackwardArgs{DX: dX, DW: dW, DB: dB, DY: up(t, b, g, tensor.F32, tc.m, tc.o), X: X, W: W, AccumulateDX: tc.accDX}))
			f := func(in [][]float64) []float64 { return refLinear(in[0], in[1], in[2], tc.m, tc.in, tc.o) }
			ins := [][]float64{x, w, randn(r, tc.o, 0)}
			wantDX := fdGrad(f, ins, g, 0)
			if tc.accDX {
				for i := range wantDX {
					wantDX[i] += dx0[i]
				}
			}
			wantDW := fdGrad(f, ins, g, 1)
			wantDB := fdGrad(f, ins, g, 2)
			for i := range wantDW {
				wantDW[i] += dw0[i]
			}
			for i := range wantDB {
				wantDB[i] += db0[i]
			}
			approx(t, "dX", down(t, b, dX), wantDX, 1e-4, 1e-4)
			approx(t, "dW (+=)", down(t, b, dW), wantDW, 1e-4, 1e-4)
			if tc.bias {
				approx(t, "dB (+=)", down(t, b, dB), wantDB, 1e-4, 1e-4)
			}
		})
	}
}

func refRMSNorm(x, w []float64, n, c int, eps float64) []float64 {
	out := make([]float64, n*c)
	for i := 0; i < n; i++ {
		var ss float64
		for j := 0; j < c; j++ {
			ss += x[i*c+j] * x[i*c+j]
		}
		r := 1 / math.Sqrt(ss/float64(c)+eps)
		for j := 0; j < c; j++ {
			out[i*c+j] = x[i*c+j] * r * w[j]
		}
	}
	return out
}

func TestRMSNormForwardBackward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(7, 8))
	const eps = 1e-6
	for _, tc := range []struct {
		n, c  int
		accDX bool
		dt    tensor.DType
	}{
		{1, 1, false, tensor.F32}, {3, 8, false, tensor.F32}, {37, 5, true, tensor.F32}, {20, 16, false, tensor.BF16},
	} {
		t.Run(fmt.Sprintf("%dx%d_acc%v_%v", tc.n, tc.c, tc.accDX, tc.dt), func(t *testing.T) {
			x := rounded(randn(r, tc.n*tc.c, 2), tc.dt)
			w := rounded(randn(r, tc.c, 1), tc.dt)
			X, W := up(t, b, x, tc.dt, tc.n, tc.c), up(t, b, w, tc.dt, tc.c)
			out, rstd := zeros(t, b, tc.dt, tc.n, tc.c), zeros(t, b, tensor.F32, tc.n)
			must(t, b.RMSNorm(out, rstd, X, W, eps))
			tol := 1e-5
			if tc.dt == tensor.BF16 {
				tol = 8e-3
			}
			approx(t, "out", down(t, b, out), refRMSNorm(x, w, tc.n, tc.c, eps), tol, tol)
			if tc.dt != tensor.F32 {
				return
			}
			g := randn(r, tc.n*tc.c, 1)
			dx0, dw0 := randn(r, tc.n*tc.c, 1), randn(r, tc.c, 1)
			dX, dW := up(t, b, dx0, tensor.F32, tc.n, tc.c), up(t, b, dw0, tensor.F32, tc.c)
			must(t, b.RMSNormBackward(backend.RMSNormBackwardArgs{DX: dX, DW: dW, DY: up(t, b, g, tensor.F32, tc.n, tc.c), X: X, W: W, RStd: rstd, AccumulateDX: tc.accDX}))
			f := func(in [][]float64) []float64 { return refRMSNorm(in[0], in[1], tc.n, tc.c, eps) }
			wantDX, wantDW := fdGrad(f, [][]float64{x, w}, g, 0), fdGrad(f, [][]float64{x, w}, g, 1)
			for i := range wantDW {
				wantDW[i] += dw0[i]
			}
			if tc.accDX {
				for i := range wantDX {
					wantDX[i] += dx0[i]
				}
			}
			approx(t, "dX", down(t, b, dX), wantDX, 1e-4, 1e-4)
			approx(t, "dW", down(t, b, dW), wantDW, 1e-4, 1e-4)
		})
	}
}

func TestAddRMSNormMatchesUnfused(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(9, 10))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		n, c := 11, 24
		x, res, w := randn(r, n*c, 1), randn(r, n*c, 1), randn(r, c, 1)
		X, R, W := up(t, b, x, dt, n, c), up(t, b, res, dt, n, c), up(t, b, w, dt, c)
		ro, out, rstd := zeros(t, b, dt, n, c), zeros(t, b, dt, n, c), zeros(t, b, tensor.F32, n)
		must(t, b.AddRMSNorm(ro, out, rstd, X, R, W, 1e-5))
		ro2, out2, rstd2 := zeros(t, b, dt, n, c), zeros(t, b, dt, n, c), zeros(t, b, tensor.F32, n)
		must(t, b.Add(ro2, X, R))
		must(t, b.RMSNorm(out2, rstd2, ro2, W, 1e-5))
		approx(t, "residual "+dt.String(), down(t, b, ro), down(t, b, ro2), 0, 0)
		approx(t, "out "+dt.String(), down(t, b, out), down(t, b, out2), 0, 0)
		approx(t, "rstd "+dt.String(), down(t, b, rstd), down(t, b, rstd2), 0, 0)
	}
}

func refRoPE(x []float64, pos []int32, inv []float64, scale float64, n, h, hd, rd int, sign float64) []float64 {
	return refRoPEPairs(x, pos, inv, scale, n, h, hd, rd, sign, false)
}

// refRoPEPairs rotates the pairs (i, i+R/2), or (2i, 2i+1) when interleaved.
func refRoPEPairs(x []float64, pos []int32, inv []float64, scale float64, n, h, hd, rd int, sign float64, inter bool) []float64 {
	out := append([]float64(nil), x...)
	half := rd / 2
	j1, j2 := func(i int) int { return i }, func(i int) int { return i + half }
	if inter {
		j1, j2 = func(i int) int { return 2 * i }, func(i int) int { return 2*i + 1 }
	}
	for t := 0; t < n; t++ {
		for hh := 0; hh < h; hh++ {
			base := t*h*hd + hh*hd
			for i := 0; i < half; i++ {
				ang := float64(float32(pos[t]) * float32(inv[i]))
				c, s := math.Cos(ang)*scale, sign*math.Sin(ang)*scale
				x1, x2 := x[base+j1(i)], x[base+j2(i)]
				out[base+j1(i)] = x1*c - x2*s
				out[base+j2(i)] = x2*c + x1*s
			}
		}
	}
	return out
}

func TestRoPEForwardBackward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(11, 12))
	for _, tc := range []struct {
		pos       []int32
		h, hd, rd int
		scale     float32
		inPlace   bool
		inter     bool
	}{
		{[]int32{0}, 1, 2, 0, 0, false, false},
		{[]int32{0, 1, 2, 0, 1, 0, 1, 2, 3}, 2, 8, 0, 0, false, false}, // three packed documents
		{[]int32{0, 1, 2, 3, 4}, 3, 10, 4, 1.3, false, false},          // partial rotary + attention scaling
		{[]int32{5, 900, 7}, 2, 6, 6, 0, true, false},                  // positions larger than N, in place
		{[]int32{0, 1, 2, 3, 0, 1}, 3, 10, 6, 1.1, false, true},        // interleaved pairs (GLM), partial
		{[]int32{3, 1, 4}, 2, 8, 0, 0, true, true},                     // interleaved, whole head, in place
	} {
		t.Run(fmt.Sprintf("n%d_h%d_hd%d_rd%d_inter%v", len(tc.pos), tc.h, tc.hd, tc.rd, tc.inter), func(t *testing.T) {
			rd := tc.rd
			if rd == 0 {
				rd = tc.hd
			}
			cfg := backend.RoPEConfig{Theta: 10000, HeadDim: tc.hd, PartialRotaryFactor: float64(rd) / float64(tc.hd)}
			inv32, _, err := cfg.Compute(0)
			must(t, err)
			inv := make([]float64, len(inv32))
			for i, v := range inv32 {
				inv[i] = float64(v)
			}
			n := len(tc.pos)
			x := randn(r, n*tc.h*tc.hd, 1)
			args := backend.RoPEArgs{Positions: upInts(t, b, tc.pos, n), InvFreq: up(t, b, inv, tensor.F32, len(inv)),
				Heads: tc.h, HeadDim: tc.hd, RotaryDim: tc.rd, AttentionScaling: tc.scale, Interleaved: tc.inter}
			sc := float64(tc.scale)
			if sc == 0 {
				sc = 1
			}
			X := up(t, b, x, tensor.F32, n, tc.h*tc.hd)
			out := X
			if !tc.inPlace {
				out = zeros(t, b, tensor.F32, n, tc.h*tc.hd)
			}
			must(t, b.RoPE(out, X, args))
			approx(t, "out", down(t, b, out), refRoPEPairs(x, tc.pos, inv, sc, n, tc.h, tc.hd, rd, 1, tc.inter), 1e-5, 1e-5)
			g := randn(r, len(x), 1)
			dX := zeros(t, b, tensor.F32, n, tc.h*tc.hd)
			must(t, b.RoPEBackward(dX, up(t, b, g, tensor.F32, n, tc.h*tc.hd), args))
			f := func(in [][]float64) []float64 {
				return refRoPEPairs(in[0], tc.pos, inv, sc, n, tc.h, tc.hd, rd, 1, tc.inter)
			}
			approx(t, "dX", down(t, b, dX), fdGrad(f, [][]float64{x}, g, 0), 1e-5, 1e-4)
		})
	}
}

// refAttention is naive masked softmax attention in float64 over packed documents.
func refAttention(q, k, v []float64, cu []int32, nh, nkv, hd, window int, scale float64) (out, lse []float64) {
	n := int(cu[len(cu)-1])
	out = make([]float64, n*nh*hd)
	lse = make([]float64, n*nh)
	g := nh / nkv
	for d := 0; d+1 < len(cu); d++ {
		for i := int(cu[d]); i < int(cu[d+1]); i++ {
			for h := 0; h < nh; h++ {
				kv := h / g
				var js []int
				var ss []float64
				m := math.Inf(-1)
				for j := int(cu[d]); j <= i; j++ {
					if window > 0 && i-j >= window {
						continue
					}
					var s float64
					for e := 0; e < hd; e++ {
						s += q[i*nh*hd+h*hd+e] * k[j*nkv*hd+kv*hd+e]
					}
					s *= scale
					js, ss = append(js, j), append(ss, s)
					m = math.Max(m, s)
				}
				var l float64
				for _, s := range ss {
					l += math.Exp(s - m)
				}
				for x, j := range js {
					p := math.Exp(ss[x]-m) / l
					for e := 0; e < hd; e++ {
						out[i*nh*hd+h*hd+e] += p * v[j*nkv*hd+kv*hd+e]
					}
				}
				lse[i*nh+h] = m + math.Log(l)
			}
		}
	}
	return out, lse
}

func TestAttentionForwardBackward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(13, 14))
	for _, tc := range []struct {
		cu          []int32
		nh, nkv, hd int
		window      int
		scale       float32
	}{
		{[]int32{0, 1}, 1, 1, 1, 0, 0},
		{[]int32{0, 5}, 2, 2, 4, 0, 0},
		{[]int32{0, 3, 7, 8}, 4, 2, 3, 0, 0},    // GQA 2:1, three documents
		{[]int32{0, 9, 14}, 6, 2, 5, 3, 0},      // GQA 3:1, sliding window
		{[]int32{0, 4, 4, 21}, 4, 1, 2, 0, 0.7}, // MQA, empty document, given scale
	} {
		t.Run(fmt.Sprintf("cu%v_nh%d_nkv%d_hd%d_w%d", tc.cu, tc.nh, tc.nkv, tc.hd, tc.window), func(t *testing.T) {
			n := int(tc.cu[len(tc.cu)-1])
			q, k, v := randn(r, n*tc.nh*tc.hd, 1), randn(r, n*tc.nkv*tc.hd, 1), randn(r, n*tc.nkv*tc.hd, 1)
			shape := backend.AttentionShape{CuSeqlens: upInts(t, b, tc.cu, len(tc.cu)), NH: tc.nh, NKV: tc.nkv, HD: tc.hd, Window: tc.window, Scale: tc.scale}
			Q, K, V := up(t, b, q, tensor.F32, n, tc.nh*tc.hd), up(t, b, k, tensor.F32, n, tc.nkv*tc.hd), up(t, b, v, tensor.F32, n, tc.nkv*tc.hd)
			out, lse := zeros(t, b, tensor.F32, n, tc.nh*tc.hd), zeros(t, b, tensor.F32, n, tc.nh)
			must(t, b.Attention(backend.AttentionArgs{AttentionShape: shape, Out: out, LSE: lse, Q: Q, K: K, V: V}))
			scale := float64(tc.scale)
			if scale == 0 {
				scale = float64(float32(1 / math.Sqrt(float64(tc.hd))))
			}
			wantOut, wantLSE := refAttention(q, k, v, tc.cu, tc.nh, tc.nkv, tc.hd, tc.window, scale)
			approx(t, "out", down(t, b, out), wantOut, 1e-5, 1e-5)
			approx(t, "lse", down(t, b, lse), wantLSE, 1e-5, 1e-5)

			g := randn(r, len(q), 1)
			dQ, dK, dV := zeros(t, b, tensor.F32, n, tc.nh*tc.hd), zeros(t, b, tensor.F32, n, tc.nkv*tc.hd), zeros(t, b, tensor.F32, n, tc.nkv*tc.hd)
			must(t, b.Fill(dQ, 7)) // "=" outputs: stale contents must not leak
			must(t, b.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: shape, DQ: dQ, DK: dK, DV: dV,
				DOut: up(t, b, g, tensor.F32, n, tc.nh*tc.hd), Q: Q, K: K, V: V, Out: out, LSE: lse}))
			f := func(in [][]float64) []float64 {
				o, _ := refAttention(in[0], in[1], in[2], tc.cu, tc.nh, tc.nkv, tc.hd, tc.window, scale)
				return o
			}
			ins := [][]float64{q, k, v}
			approx(t, "dQ", down(t, b, dQ), fdGrad(f, ins, g, 0), 1e-4, 1e-3)
			approx(t, "dK", down(t, b, dK), fdGrad(f, ins, g, 1), 1e-4, 1e-3)
			approx(t, "dV", down(t, b, dV), fdGrad(f, ins, g, 2), 1e-4, 1e-3)
		})
	}
}

func TestAttentionKVCacheMatchesFullPrefix(t *testing.T) {
	// Decoding the last 2 tokens of each document against its full keys must give the same
	// outputs as the corresponding rows of full causal attention.
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(15, 16))
	cu := []int32{0, 5, 12}
	nh, nkv, hd := 4, 2, 3
	n := 12
	q, k, v := randn(r, n*nh*hd, 1), randn(r, n*nkv*hd, 1), randn(r, n*nkv*hd, 1)
	full, _ := refAttention(q, k, v, cu, nh, nkv, hd, 0, float64(float32(1/math.Sqrt(3))))
	rows := []int{3, 4, 10, 11}
	var qd, want []float64
	for _, i := range rows {
		qd = append(qd, q[i*nh*hd:(i+1)*nh*hd]...)
		want = append(want, full[i*nh*hd:(i+1)*nh*hd]...)
	}
	out := zeros(t, b, tensor.F32, 4, nh*hd)
	must(t, b.Attention(backend.AttentionArgs{
		AttentionShape: backend.AttentionShape{CuSeqlens: upInts(t, b, []int32{0, 2, 4}, 3), CuSeqlensK: upInts(t, b, cu, 3), NH: nh, NKV: nkv, HD: hd},
		Out:            out, Q: up(t, b, qd, tensor.F32, 4, nh*hd), K: up(t, b, k, tensor.F32, n, nkv*hd), V: up(t, b, v, tensor.F32, n, nkv*hd)}))
	approx(t, "decode out", down(t, b, out), want, 1e-5, 1e-5)
}

func refSwiGLU(g, u []float64) []float64 {
	out := make([]float64, len(g))
	for i := range g {
		out[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
	}
	return out
}

func TestSwiGLUForwardBackward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(17, 18))
	for _, n := range []int{1, 7, 100} {
		g, u := randn(r, n, 3), randn(r, n, 1)
		G, U := up(t, b, g, tensor.F32, n), up(t, b, u, tensor.F32, n)
		out := zeros(t, b, tensor.F32, n)
		must(t, b.SwiGLU(out, G, U))
		approx(t, "out", down(t, b, out), refSwiGLU(g, u), 1e-6, 1e-5)
		d := randn(r, n, 1)
		dG, dU := zeros(t, b, tensor.F32, n), zeros(t, b, tensor.F32, n)
		must(t, b.SwiGLUBackward(dG, dU, up(t, b, d, tensor.F32, n), G, U))
		f := func(in [][]float64) []float64 { return refSwiGLU(in[0], in[1]) }
		approx(t, "dGate", down(t, b, dG), fdGrad(f, [][]float64{g, u}, d, 0), 1e-5, 1e-4)
		approx(t, "dUp", down(t, b, dU), fdGrad(f, [][]float64{g, u}, d, 1), 1e-5, 1e-4)
	}
}

func TestEmbeddingForwardBackward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(19, 20))
	v, c := 7, 130 // more than one column chunk
	ids := []int32{3, 0, 3, 6, 3, 1}
	w := rounded(randn(r, v*c, 1), tensor.F32)
	W := up(t, b, w, tensor.F32, v, c)
	out := zeros(t, b, tensor.F32, len(ids), c)
	must(t, b.Embedding(out, W, upInts(t, b, ids, len(ids))))
	want := make([]float64, 0, len(ids)*c)
	for _, id := range ids {
		want = append(want, w[int(id)*c:int(id+1)*c]...)
	}
	approx(t, "out", down(t, b, out), want, 0, 0)
	d := randn(r, len(ids)*c, 1)
	dw0 := randn(r, v*c, 1)
	dW := up(t, b, dw0, tensor.F32, v, c)
	must(t, b.EmbeddingBackward(dW, up(t, b, d, tensor.F32, len(ids), c), upInts(t, b, ids, len(ids))))
	f := func(in [][]float64) []float64 {
		o := make([]float64, 0, len(ids)*c)
		for _, id := range ids {
			o = append(o, in[0][int(id)*c:int(id+1)*c]...)
		}
		return o
	}
	wantDW := fdGrad(f, [][]float64{w}, d, 0)
	for i := range wantDW {
		wantDW[i] += dw0[i]
	}
	approx(t, "dWeight (+=)", down(t, b, dW), wantDW, 1e-6, 1e-6)
	if err := b.Embedding(out, W, upInts(t, b, []int32{1, 7, 0, 0, 0, 0}, 6)); err == nil {
		t.Fatal("embedding with id 7 in a vocabulary of 7 succeeded")
	}
}

// refCE is the naive full-logits cross-entropy: per-token loss for non-ignored targets.
func refCE(h, w []float64, tg []int32, n, c, v int) (loss []float64) {
	loss = make([]float64, n)
	for i := 0; i < n; i++ {
		if tg[i] == backend.IgnoreIndex {
			continue
		}
		lg := make([]float64, v)
		m := math.Inf(-1)
		for j := 0; j < v; j++ {
			for p := 0; p < c; p++ {
				lg[j] += h[i*c+p] * w[j*c+p]
			}
			m = math.Max(m, lg[j])
		}
		var s float64
		for _, x := range lg {
			s += math.Exp(x - m)
		}
		loss[i] = -(lg[tg[i]] - m - math.Log(s))
	}
	return loss
}

func TestCrossEntropyMatchesNaive(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(21, 22))
	for _, tc := range []struct {
		n, c, v, chunk int
		tg             []int32
		scale          float32
	}{
		{1, 3, 5, 0, []int32{2}, 1},
		{6, 4, 9, 4, []int32{0, 8, -100, 3, 3, -100}, 0.25},
		{9, 5, 17, 2, []int32{16, 1, 2, 3, -100, 5, 6, 7, 0}, 1.0 / 7},
		{5, 3, 4, 0, []int32{-100, -100, -100, -100, -100}, 1},
	} {
		t.Run(fmt.Sprintf("n%d_c%d_v%d_chunk%d", tc.n, tc.c, tc.v, tc.chunk), func(t *testing.T) {
			h, w := randn(r, tc.n*tc.c, 1), randn(r, tc.v*tc.c, 1)
			H, W := up(t, b, h, tensor.F32, tc.n, tc.c), up(t, b, w, tensor.F32, tc.v, tc.c)
			loss, lp := zeros(t, b, tensor.F32, tc.n), zeros(t, b, tensor.F32, tc.n)
			dH := zeros(t, b, tensor.F32, tc.n, tc.c)
			dw0 := randn(r, tc.v*tc.c, 1)
			dW := up(t, b, dw0, tensor.F32, tc.v, tc.c)
			must(t, b.CrossEntropy(backend.CrossEntropyArgs{Hidden: H, Weight: W, Targets: upInts(t, b, tc.tg, tc.n),
				Loss: loss, LogProb: lp, DHidden: dH, DWeight: dW, GradScale: tc.scale, ChunkRows: tc.chunk}))
			want := refCE(h, w, tc.tg, tc.n, tc.c, tc.v)
			approx(t, "loss", down(t, b, loss), want, 1e-5, 1e-5)
			neg := make([]float64, len(want))
			for i := range want {
				neg[i] = -want[i]
			}
			approx(t, "logprob", down(t, b, lp), neg, 1e-5, 1e-5)
			g := make([]float64, tc.n)
			for i := range g {
				g[i] = float64(tc.scale)
			}
			f := func(in [][]float64) []float64 { return refCE(in[0], in[1], tc.tg, tc.n, tc.c, tc.v) }
			approx(t, "dHidden", down(t, b, dH), fdGrad(f, [][]float64{h, w}, g, 0), 1e-5, 1e-4)
			wantDW := fdGrad(f, [][]float64{h, w}, g, 1)
			for i := range wantDW {
				wantDW[i] += dw0[i]
			}
			approx(t, "dWeight (+=)", down(t, b, dW), wantDW, 1e-5, 1e-4)
		})
	}
}

func TestCrossEntropyRejectsBadTarget(t *testing.T) {
	b := newTestBackend(t)
	H, W := zeros(t, b, tensor.F32, 2, 3), zeros(t, b, tensor.F32, 4, 3)
	err := b.CrossEntropy(backend.CrossEntropyArgs{Hidden: H, Weight: W, Targets: upInts(t, b, []int32{1, 4}, 2)})
	if err == nil || !strings.Contains(err.Error(), "Targets[1] = 4") {
		t.Fatalf("error = %v, want one naming Targets[1] = 4", err)
	}
}

func TestRoPETableCacheFollowsPositionsAndFrequencies(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(60, 61))
	hd := 8
	for _, tc := range []struct {
		pos   []int32
		theta float64
		scale float32
	}{
		{[]int32{0, 1, 2, 3, 0}, 1e4, 1},
		{[]int32{0, 1, 2, 3, 4, 5, 6, 0}, 1e4, 1}, // longer document: the table must grow
		{[]int32{0, 1, 0}, 1e4, 1},                // shorter: the cached table is reused
		{[]int32{0, 1, 2, 3, 0}, 500, 1},          // other frequencies
		{[]int32{0, 1, 2, 3, 0}, 500, 1.5},        // other scaling
	} {
		inv32, _, err := backend.RoPEConfig{Theta: tc.theta, HeadDim: hd}.Compute(0)
		must(t, err)
		inv := make([]float64, len(inv32))
		for i, v := range inv32 {
			inv[i] = float64(v)
		}
		n := len(tc.pos)
		x := randn(r, n*hd, 1)
		out := zeros(t, b, tensor.F32, n, hd)
		must(t, b.RoPE(out, up(t, b, x, tensor.F32, n, hd), backend.RoPEArgs{Positions: upInts(t, b, tc.pos, n),
			InvFreq: up(t, b, inv, tensor.F32, len(inv)), Heads: 1, HeadDim: hd, AttentionScaling: tc.scale}))
		approx(t, fmt.Sprint("rope ", tc.pos, tc.theta, tc.scale), down(t, b, out), refRoPE(x, tc.pos, inv, float64(tc.scale), n, 1, hd, hd, 1), 1e-5, 1e-5)
	}
}
