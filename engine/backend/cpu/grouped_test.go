package cpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// refGrouped is the fp64 grouped product of the contract in engine/backend/moe.go: a and b hold
// the operands' stored values, off the group offsets; n and k are N_ and K_.
func refGrouped(kind backend.GroupedKind, a, b []float64, off []int32, n, k int) []float64 {
	g := len(off) - 1
	s := int(off[g])
	switch kind {
	case backend.GroupedForward: // Out[r,j] = sum_p A[r,p] B_g[j,p]
		out := make([]float64, s*n)
		for e := range g {
			for r := int(off[e]); r < int(off[e+1]); r++ {
				for j := range n {
					var acc float64
					for p := range k {
						acc += a[r*k+p] * b[e*n*k+j*k+p]
					}
					out[r*n+j] = acc
				}
			}
		}
		return out
	case backend.GroupedInputGrad: // Out[r,p] = sum_j A[r,j] B_g[j,p]
		out := make([]float64, s*k)
		for e := range g {
			for r := int(off[e]); r < int(off[e+1]); r++ {
				for p := range k {
					var acc float64
					for j := range n {
						acc += a[r*n+j] * b[e*n*k+j*k+p]
					}
					out[r*k+p] = acc
				}
			}
		}
		return out
	default: // Out_g[j,p] = sum_{r in g} A[r,j] B[r,p]
		out := make([]float64, g*n*k)
		for e := range g {
			for j := range n {
				for p := range k {
					var acc float64
					for r := int(off[e]); r < int(off[e+1]); r++ {
						acc += a[r*n+j] * b[r*k+p]
					}
					out[e*n*k+j*k+p] = acc
				}
			}
		}
		return out
	}
}

// offsetsOf returns the offsets [G+1] of groups with the given row counts.
func offsetsOf(rows []int) []int32 {
	off := make([]int32, len(rows)+1)
	for g, m := range rows {
		off[g+1] = off[g] + int32(m)
	}
	return off
}

// groupedShapes returns the shapes of A, B and Out for a kind.
func groupedShapes(kind backend.GroupedKind, g, s, n, k int) (sa, sb, so []int) {
	switch kind {
	case backend.GroupedForward:
		return []int{s, k}, []int{g, n, k}, []int{s, n}
	case backend.GroupedInputGrad:
		return []int{s, n}, []int{g, n, k}, []int{s, k}
	}
	return []int{s, n}, []int{s, k}, []int{g, n, k}
}

var groupedKinds = []backend.GroupedKind{backend.GroupedForward, backend.GroupedInputGrad, backend.GroupedWeightGrad}

func TestGroupedGEMMMatchesNaive(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(11, 12))
	for _, tc := range []struct {
		name string
		rows []int // M_g per group
		n, k int   // N_, K_
	}{
		{"uneven with empty and one-row groups", []int{3, 0, 5, 1, 0, 2}, 7, 9},
		{"one group", []int{6}, 5, 4},
		{"one row", []int{0, 1, 0}, 3, 17},
		{"all groups empty", []int{0, 0, 0, 0}, 4, 6},
		{"groups over several row chunks", []int{130, 1, 0, 70}, 33, 20},
		{"wide N_ over several output chunks", []int{2, 9, 4}, 150, 8},
	} {
		for _, kind := range groupedKinds {
			for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
				for _, acc := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/%s/%s/acc=%v", tc.name, kind, dt, acc), func(t *testing.T) {
						off := offsetsOf(tc.rows)
						g, s := len(tc.rows), int(off[len(tc.rows)])
						sa, sb, so := groupedShapes(kind, g, s, tc.n, tc.k)
						av := rounded(randn(r, tensor.Shape(sa).Numel(), 1), dt)
						bv := rounded(randn(r, tensor.Shape(sb).Numel(), 1), dt)
						ov := rounded(randn(r, tensor.Shape(so).Numel(), 1), dt)
						out := up(t, b, ov, dt, so...)
						must(t, b.GroupedGEMM(backend.GroupedGEMMArgs{
							Kind: kind, A: up(t, b, av, dt, sa...), B: up(t, b, bv, dt, sb...), Out: out,
							Offsets: upInts(t, b, off, g+1), Accumulate: acc,
						}))
						want := refGrouped(kind, av, bv, off, tc.n, tc.k)
						if acc {
							for i := range want {
								want[i] += ov[i]
							}
						}
						// fp32 accumulation, then one rounding into Out's dtype.
						atol, rtol := 1e-4, 1e-5
						if dt == tensor.BF16 {
							atol, rtol = 1e-3, 1.0/256
						}
						approx(t, "Out", down(t, b, out), want, atol, rtol)
					})
				}
			}
		}
	}
}

// TestGroupedGEMMIsGradientOfForward checks the three kinds against each other: for
// L = sum(dY * Forward(X, W)), InputGrad(dY, W) is dL/dX and WeightGrad(dY, X) is dL/dW, by
// central finite differences of the fp64 forward.
func TestGroupedGEMMIsGradientOfForward(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(13, 14))
	rows := []int{2, 0, 3, 1}
	off := offsetsOf(rows)
	const g, n, k = 4, 5, 3
	s := int(off[g])
	x, w, dy := randn(r, s*k, 1), randn(r, g*n*k, 1), randn(r, s*n, 1)
	X, W, DY := up(t, b, x, tensor.F32, s, k), up(t, b, w, tensor.F32, g, n, k), up(t, b, dy, tensor.F32, s, n)
	Off := upInts(t, b, off, g+1)
	dX, dW := zeros(t, b, tensor.F32, s, k), zeros(t, b, tensor.F32, g, n, k)
	must(t, b.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedInputGrad, A: DY, B: W, Out: dX, Offsets: Off}))
	must(t, b.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: DY, B: X, Out: dW, Offsets: Off}))
	f := func(in [][]float64) []float64 { return refGrouped(backend.GroupedForward, in[0], in[1], off, n, k) }
	ins := [][]float64{x, w}
	approx(t, "dX", down(t, b, dX), fdGrad(f, ins, dy, 0), 1e-4, 1e-4)
	approx(t, "dW", down(t, b, dW), fdGrad(f, ins, dy, 1), 1e-4, 1e-4)
}

func TestGroupedGEMMDeterministicAcrossWorkerCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	rows := []int{100, 3, 0, 257}
	off := offsetsOf(rows)
	const n, k = 70, 90
	g, s := len(rows), int(off[len(rows)])
	for _, kind := range groupedKinds {
		sa, sb, so := groupedShapes(kind, g, s, n, k)
		av, bv := randn(r, tensor.Shape(sa).Numel(), 1), randn(r, tensor.Shape(sb).Numel(), 1)
		var first []float64
		for _, workers := range []int{1, 2, 5} {
			b := New(Options{Workers: workers})
			out := zeros(t, b, tensor.F32, so...)
			must(t, b.GroupedGEMM(backend.GroupedGEMMArgs{Kind: kind, A: up(t, b, av, tensor.F32, sa...),
				B: up(t, b, bv, tensor.F32, sb...), Out: out, Offsets: upInts(t, b, off, g+1)}))
			got := down(t, b, out)
			b.Close()
			if first == nil {
				first = got
				continue
			}
			for i := range got {
				if got[i] != first[i] {
					t.Fatalf("%s: %d workers: Out[%d] = %v, 1 worker gave %v", kind, workers, i, got[i], first[i])
				}
			}
		}
	}
}

func TestGroupedGEMMRejectsBadArguments(t *testing.T) {
	b := newTestBackend(t)
	const g, s, n, k = 3, 6, 4, 5
	f32 := func(shape ...int) T { return zeros(t, b, tensor.F32, shape...) }
	good := upInts(t, b, []int32{0, 2, 2, 6}, g+1)
	shared := f32(s * n)
	aView, _ := shared.Reshape(s, n)
	fwd := func(mod func(*backend.GroupedGEMMArgs)) backend.GroupedGEMMArgs {
		a := backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: f32(s, k), B: f32(g, n, k), Out: f32(s, n), Offsets: good}
		mod(&a)
		return a
	}
	wgrad := func(mod func(*backend.GroupedGEMMArgs)) backend.GroupedGEMMArgs {
		a := backend.GroupedGEMMArgs{Kind: backend.GroupedWeightGrad, A: f32(s, n), B: f32(s, k), Out: f32(g, n, k), Offsets: good}
		mod(&a)
		return a
	}
	for _, tc := range []struct {
		name string
		args backend.GroupedGEMMArgs
		want string
	}{
		{"A with the wrong width", fwd(func(a *backend.GroupedGEMMArgs) { a.A = f32(s, k+1) }), "grouped-gemm forward: A"},
		{"B not 3-D", fwd(func(a *backend.GroupedGEMMArgs) { a.B = f32(g*n, k) }), "grouped-gemm forward: B"},
		{"Out with the wrong rows", fwd(func(a *backend.GroupedGEMMArgs) { a.Out = f32(s+1, n) }), "grouped-gemm forward: Out"},
		{"input-grad Out of the forward's shape", fwd(func(a *backend.GroupedGEMMArgs) {
			a.Kind, a.A = backend.GroupedInputGrad, f32(s, n)
		}), "grouped-gemm input-grad: Out"},
		{"weight-grad B with the wrong rows", wgrad(func(a *backend.GroupedGEMMArgs) { a.B = f32(s-1, k) }), "grouped-gemm weight-grad: B"},
		{"weight-grad A with the wrong width", wgrad(func(a *backend.GroupedGEMMArgs) { a.A = f32(s, n+2) }), "grouped-gemm weight-grad: A"},
		{"integer A", fwd(func(a *backend.GroupedGEMMArgs) { a.A = upInts(t, b, make([]int32, s*k), s, k) }), "want a float tensor"},
		{"missing Out", fwd(func(a *backend.GroupedGEMMArgs) { a.Out = T{} }), "Out is missing"},
		{"missing Offsets", fwd(func(a *backend.GroupedGEMMArgs) { a.Offsets = T{} }), "Offsets is missing"},
		{"F32 Offsets", fwd(func(a *backend.GroupedGEMMArgs) { a.Offsets = f32(g + 1) }), "Offsets f32[4]@cpu: want i32"},
		{"one offset too few", fwd(func(a *backend.GroupedGEMMArgs) { a.Offsets = upInts(t, b, []int32{0, 2, 6}, g) }), "want G+1 = 4"},
		{"weight-grad group count from Out", wgrad(func(a *backend.GroupedGEMMArgs) { a.Out = f32(g+1, n, k) }), "want G+1 = 5"},
		{"decreasing offsets", fwd(func(a *backend.GroupedGEMMArgs) { a.Offsets = upInts(t, b, []int32{0, 3, 2, 6}, g+1) }), "non-decreasing"},
		{"first offset not zero", fwd(func(a *backend.GroupedGEMMArgs) { a.Offsets = upInts(t, b, []int32{1, 2, 2, 6}, g+1) }), "Offsets[0]"},
		{"last offset not the row count", fwd(func(a *backend.GroupedGEMMArgs) { a.Offsets = upInts(t, b, []int32{0, 2, 2, 5}, g+1) }), "want the row count S = 6"},
		{"Out overlapping A", wgrad(func(a *backend.GroupedGEMMArgs) {
			a.A, a.B = aView, f32(s, k+1)
			a.Out, _ = shared.Reshape(1, n, k+1)
			a.Offsets = upInts(t, b, []int32{0, 6}, 2)
		}), "Out and A overlap"},
		{"unknown kind", fwd(func(a *backend.GroupedGEMMArgs) { a.Kind = 7 }), "unknown kind 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := b.GroupedGEMM(tc.args)
			if err == nil || !strings.HasPrefix(err.Error(), "cpu: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one starting with \"cpu: \" and mentioning %q", err, tc.want)
			}
		})
	}
}
