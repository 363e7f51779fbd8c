package cpu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func TestAllocZeroedAndAccounted(t *testing.T) {
	b := New(Options{Workers: 2, MemoryLimit: 1 << 20})
	defer b.Close()
	x := zeros(t, b, tensor.F32, 10, 10)
	for i, v := range down(t, b, x) {
		if v != 0 {
			t.Fatalf("fresh tensor element %d = %v", i, v)
		}
	}
	y := zeros(t, b, tensor.BF16, 100)
	if s := b.MemStats(); s.Allocated != 600 || s.Peak != 600 || s.Total != 1<<20 {
		t.Fatalf("stats after 400+200 bytes: %+v", s)
	}
	must(t, b.Free(x))
	if s := b.MemStats(); s.Allocated != 200 || s.Peak != 600 {
		t.Fatalf("stats after free: %+v", s)
	}
	b.ResetPeak()
	if s := b.MemStats(); s.Peak != 200 {
		t.Fatalf("peak after reset: %+v", s)
	}
	if err := b.Free(x); err == nil || !strings.Contains(err.Error(), "already freed") {
		t.Fatalf("double free: %v", err)
	}
	if err := b.Upload(x, make([]byte, 400)); err == nil || !strings.Contains(err.Error(), "freed") {
		t.Fatalf("upload into a freed tensor: %v", err)
	}
	row, _ := y.Rows(0, 10)
	if err := b.Free(row); err == nil || !strings.Contains(err.Error(), "view") {
		t.Fatalf("free of a view: %v", err)
	}
	if _, err := b.Alloc(tensor.F32, 1<<20); err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("allocation over the limit: %v", err)
	}
	if _, err := b.Alloc(tensor.F32, -3); err == nil {
		t.Fatal("negative shape accepted")
	}
	if err := b.Upload(y, make([]byte, 3)); err == nil || !strings.Contains(err.Error(), "want 200") {
		t.Fatalf("short upload: %v", err)
	}
}

func TestElementwiseOps(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(40, 41))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		n := 70000 // several parallel chunks
		x, y := rounded(randn(r, n, 1), dt), rounded(randn(r, n, 1), dt)
		X, Y := up(t, b, x, dt, n), up(t, b, y, dt, n)
		tol, atol := 0.0, 1e-6
		if dt == tensor.BF16 {
			tol, atol = 1.0/128, 1.0/32 // results rounded to bf16 after each op
		}
		out := zeros(t, b, dt, n)
		must(t, b.Add(out, X, Y))
		want := make([]float64, n)
		for i := range want {
			want[i] = x[i] + y[i]
		}
		approx(t, "add "+dt.String(), down(t, b, out), want, atol, tol)
		must(t, b.Add(X, X, Y)) // in place
		approx(t, "add in place "+dt.String(), down(t, b, X), want, atol, tol)
		must(t, b.Axpy(Y, -0.5, out))
		for i := range want {
			want[i] = y[i] - 0.5*(x[i]+y[i])
		}
		approx(t, "axpy "+dt.String(), down(t, b, Y), want, atol, 2*tol)
		must(t, b.Scale(out, 3))
		for i := range want {
			want[i] = 3 * (x[i] + y[i])
		}
		approx(t, "scale "+dt.String(), down(t, b, out), want, 4*atol, 2*tol)
		must(t, b.Fill(out, 0.25))
		for i := range want {
			want[i] = 0.25
		}
		approx(t, "fill "+dt.String(), down(t, b, out), want, 0, 0)
	}
	ids := zeros(t, b, tensor.I32, 3)
	must(t, b.Fill(ids, -100))
	if v, _ := backend.ToInt32(b, ids); v[2] != -100 {
		t.Fatalf("fill i32: %v", v)
	}
	if err := b.Fill(ids, 0.5); err == nil {
		t.Fatal("filled an integer tensor with 0.5")
	}
	if err := b.Add(zeros(t, b, tensor.F32, 3), zeros(t, b, tensor.F32, 3), zeros(t, b, tensor.F32, 4)); err == nil {
		t.Fatal("add of mismatched sizes succeeded")
	}
}

func TestSumSquaresDeterministicFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 43))
	x := randn(r, 100003, 1)
	var want float64
	for _, v := range x {
		f := float64(float32(v))
		want += f * f
	}
	var first float64
	for _, w := range []int{1, 3, 4} {
		b := New(Options{Workers: w})
		got, err := b.SumSquares([]tensor.Tensor{up(t, b, x, tensor.F32, len(x)), up(t, b, []float64{3, 4}, tensor.BF16, 2)})
		b.Close()
		must(t, err)
		if math.Abs(got[0]-want) > 1e-9*want || got[1] != 25 {
			t.Fatalf("workers=%d: %v, want [%v 25]", w, got, want)
		}
		if first == 0 {
			first = got[0]
		} else if got[0] != first {
			t.Fatalf("workers=%d: %v differs from %v", w, got[0], first)
		}
	}
}

func TestCopyConverts(t *testing.T) {
	b := newTestBackend(t)
	src := up(t, b, []float64{1.00390625, -3, 1e-8}, tensor.F32, 3)
	bf := zeros(t, b, tensor.BF16, 3)
	must(t, b.Copy(bf, src))
	approx(t, "f32->bf16", down(t, b, bf), []float64{1, -3, float64(tensor.BF16ToF32(tensor.F32ToBF16(1e-8)))}, 0, 0)
	f16 := zeros(t, b, tensor.F16, 3)
	must(t, b.Copy(f16, bf))
	back := zeros(t, b, tensor.F32, 1, 3)
	must(t, b.Copy(back, f16))
	approx(t, "bf16->f16->f32", down(t, b, back), []float64{1, -3, 0}, 0, 0)
	i64 := zeros(t, b, tensor.I64, 2)
	must(t, b.Copy(i64, upInts(t, b, []int32{-5, 9}, 2)))
	i32 := zeros(t, b, tensor.I32, 2)
	must(t, b.Copy(i32, i64))
	if v, _ := backend.ToInt32(b, i32); v[0] != -5 || v[1] != 9 {
		t.Fatalf("i32->i64->i32: %v", v)
	}
	if err := b.Copy(i32, zeros(t, b, tensor.F32, 2)); err == nil {
		t.Fatal("copied f32 into i32")
	}
}

// TestOpsAcceptBF16Storage runs the model ops with bf16 tensors and compares them with the same
// ops on the f32 values, within bf16 tolerance.
func TestOpsAcceptBF16Storage(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(44, 45))
	cu := []int32{0, 6, 10}
	n, nh, nkv, hd := 10, 4, 2, 8
	q := rounded(randn(r, n*nh*hd, 1), tensor.BF16)
	k := rounded(randn(r, n*nkv*hd, 1), tensor.BF16)
	v := rounded(randn(r, n*nkv*hd, 1), tensor.BF16)
	run := func(dt tensor.DType) (out, dq, dk, dv, ce, dh []float64) {
		Q, K, V := up(t, b, q, dt, n, nh*hd), up(t, b, k, dt, n, nkv*hd), up(t, b, v, dt, n, nkv*hd)
		sh := backend.AttentionShape{CuSeqlens: upInts(t, b, cu, 3), NH: nh, NKV: nkv, HD: hd}
		O, L := zeros(t, b, dt, n, nh*hd), zeros(t, b, tensor.F32, n, nh)
		must(t, b.Attention(backend.AttentionArgs{AttentionShape: sh, Out: O, LSE: L, Q: Q, K: K, V: V}))
		DQ, DK, DV := zeros(t, b, dt, n, nh*hd), zeros(t, b, dt, n, nkv*hd), zeros(t, b, dt, n, nkv*hd)
		must(t, b.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: sh, DQ: DQ, DK: DK, DV: DV, DOut: Q, Q: Q, K: K, V: V, Out: O, LSE: L}))
		W := up(t, b, v[:nkv*hd*5], dt, 5*nkv, hd) // [V=10, C=8]
		H := up(t, b, k[:n*hd], dt, n, hd)
		loss, dH := zeros(t, b, tensor.F32, n), zeros(t, b, dt, n, hd)
		must(t, b.CrossEntropy(backend.CrossEntropyArgs{Hidden: H, Weight: W, Targets: upInts(t, b, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 0}, n), Loss: loss, DHidden: dH, GradScale: 0.1}))
		return down(t, b, O), down(t, b, DQ), down(t, b, DK), down(t, b, DV), down(t, b, loss), down(t, b, dH)
	}
	a := [][]float64{}
	o1, q1, k1, v1, c1, h1 := run(tensor.F32)
	o2, q2, k2, v2, c2, h2 := run(tensor.BF16)
	a = append(a, o1, q1, k1, v1, c1, h1)
	for i, got := range [][]float64{o2, q2, k2, v2, c2, h2} {
		if e := relErr(got, a[i]); e > 1e-2 {
			t.Errorf("output %d: bf16 storage differs from f32 by %.3g relative", i, e)
		}
	}
}

func TestAttentionRejectsBadBoundaries(t *testing.T) {
	b := newTestBackend(t)
	q := zeros(t, b, tensor.F32, 6, 4)
	for _, tc := range []struct {
		cu   []int32
		want string
	}{
		{[]int32{1, 6}, "start with 0"},
		{[]int32{0, 4, 2, 6}, "must not decrease"},
		{[]int32{0, 5}, "ends at 5"},
	} {
		err := b.Attention(backend.AttentionArgs{AttentionShape: backend.AttentionShape{CuSeqlens: upInts(t, b, tc.cu, len(tc.cu)), NH: 2, NKV: 2, HD: 2},
			Out: zeros(t, b, tensor.F32, 6, 4), Q: q, K: q, V: q})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("cu_seqlens %v: error %v, want it to mention %q", tc.cu, err, tc.want)
		}
	}
	err := b.Attention(backend.AttentionArgs{AttentionShape: backend.AttentionShape{CuSeqlens: upInts(t, b, []int32{0, 6}, 2), NH: 3, NKV: 2, HD: 2},
		Out: q, Q: q, K: q, V: q})
	if err == nil || !strings.Contains(err.Error(), "NH % NKV") {
		t.Errorf("NH=3 NKV=2: %v", err)
	}
}

func TestFreedStorageIsReusedZeroedAndStaleTensorsStayFreed(t *testing.T) {
	b := New(Options{Workers: 2, MemoryLimit: 1 << 20})
	defer b.Close()
	x := up(t, b, []float64{1, 2, 3, 4}, tensor.F32, 4)
	must(t, b.Free(x))
	if s := b.MemStats(); s.Allocated != 0 || s.Reserved < 16 {
		t.Fatalf("after free: %+v (want the storage kept as reserved)", s)
	}
	y := zeros(t, b, tensor.F32, 2, 2)
	if s := b.MemStats(); s.Allocated != 16 || s.Reserved != 16 {
		t.Fatalf("after reuse: %+v", s)
	}
	for i, v := range down(t, b, y) {
		if v != 0 {
			t.Fatalf("reused storage element %d = %v, want 0", i, v)
		}
	}
	if err := b.Fill(x, 1); err == nil || !strings.Contains(err.Error(), "freed") {
		t.Fatalf("write through a stale tensor: %v", err)
	}
	must(t, b.Free(y))
	b.EmptyCache()
	if s := b.MemStats(); s.Reserved != 0 {
		t.Fatalf("after EmptyCache: %+v", s)
	}
	// A cache never pushes the total over the limit: freeing 600 KiB and asking for 700 KiB works.
	big := zeros(t, b, tensor.U8, 600<<10)
	must(t, b.Free(big))
	if _, err := b.Alloc(tensor.U8, 700<<10); err != nil {
		t.Fatalf("allocation after a large free: %v", err)
	}
	if s := b.MemStats(); s.Reserved > 1<<20 {
		t.Fatalf("reserved %d exceeds the limit", s.Reserved)
	}
}
