package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The backend's matrix products: GEMM, Linear and LinearBackward, with split-K weight gradients
// and bf16 accumulation through fp32 (gemmFolded), over the cuBLASLt plans of gemm.go. Bias rows
// and bias gradients run kernels of kernels/elementwise.cu.

// gemmDType checks that the GEMM operands a and bb share a supported dtype and returns it.
func gemmDType(op string, a, bb T) (tensor.DType, error) {
	if a.DType() != bb.DType() {
		return 0, fmt.Errorf("cuda: %s: operands %v and %v must have the same dtype", op, a, bb)
	}
	if a.DType() != tensor.BF16 && a.DType() != tensor.F32 {
		return 0, fmt.Errorf("cuda: %s: operand dtype %s is not supported (use bf16 or f32)", op, a.DType())
	}
	return a.DType(), nil
}

// GEMM computes C = Alpha*op(A)@op(B) + Beta*C.
func (b *Backend) GEMM(a backend.GEMMArgs) error {
	const op = "GEMM"
	if a.A.Rank() != 2 || a.B.Rank() != 2 || a.C.Rank() != 2 {
		return fmt.Errorf("cuda: GEMM: A %v, B %v and C %v must be 2-D", a.A, a.B, a.C)
	}
	M, K := a.A.Dim(0), a.A.Dim(1)
	if a.TransA {
		M, K = K, M
	}
	K2, Nc := a.B.Dim(0), a.B.Dim(1)
	if a.TransB {
		K2, Nc = Nc, K2
	}
	if K != K2 || a.C.Dim(0) != M || a.C.Dim(1) != Nc {
		return fmt.Errorf("cuda: GEMM: op(A) is [%d,%d], op(B) is [%d,%d], C is %v: shapes do not chain", M, K, K2, Nc, a.C)
	}
	return b.gemm(op, gemmCall{A: a.A, B: a.B, C: a.C, M: M, N: Nc, K: K, TransA: a.TransA, TransB: a.TransB, Alpha: a.Alpha, Beta: a.Beta})
}

type gemmCall struct {
	A, B, C        T
	M, N, K        int
	TransA, TransB bool
	Alpha, Beta    float32
	// FoldBeta makes an accumulating bf16 output round once (gemmFolded) whatever
	// HALO_CUDA_GEMM_BETA says: for callers whose contract is one rounding.
	FoldBeta bool
}

func (b *Backend) gemm(op string, g gemmCall) error {
	dt, err := gemmDType(op, g.A, g.B)
	if err != nil {
		return err
	}
	if g.C.DType() != tensor.F32 && g.C.DType() != tensor.BF16 {
		return fmt.Errorf("cuda: %s: output dtype %s is not supported (use bf16 or f32)", op, g.C.DType())
	}
	if g.M == 0 || g.N == 0 {
		return nil
	}
	arg := b.args(op)
	pa := arg.ptr("A", g.A)
	pb := arg.ptr("B", g.B)
	pc := arg.ptr("C", g.C)
	if err := arg.err(); err != nil {
		return err
	}
	if g.K > 0 {
		split := 1
		if !b.noSplitK {
			split = gemmSplitK(g.M, g.N, g.K, g.TransA, g.TransB, b.d.info.SMs)
		}
		// cuBLASLt rounds the product to bf16 before adding Beta·C (TestGPUGemmBetaRoundsOnce),
		// as autograd does when it adds separately rounded bf16 gradients: the backend contract
		// allows it for accumulating outputs. gemmFoldBeta rounds once, through fp32 scratch, at
		// the cost of writing and re-reading that scratch (testdata/README.md, gpu-run18).
		if split > 1 || (g.Beta != 0 && g.C.DType() == tensor.BF16 && (b.gemmFoldBeta || g.FoldBeta)) {
			return b.gemmFolded(op, g, dt, pa, pb, pc, split)
		}
	}
	if g.K == 0 {
		// An empty sum: C = Beta*C.
		if g.Beta == 0 {
			return b.Fill(g.C, 0)
		}
		return b.Scale(g.C, g.Beta)
	}
	return b.postGemm(op, b.gemmSpec(g, dt, pa, pb, pc, g.C))
}

// gemmSpec is the device GEMM of g over A at pa and B at pb, writing c (g.C, or scratch that
// replaces it) at pc.
func (b *Backend) gemmSpec(g gemmCall, dt tensor.DType, pa, pb, pc uintptr, c T) Gemm {
	return Gemm{M: g.M, N: g.N, K: g.K, TransA: g.TransA, TransB: g.TransB,
		A:     &Buffer{dev: b.d, ptr: pa, bytes: uint64(g.A.Bytes())},
		B:     &Buffer{dev: b.d, ptr: pb, bytes: uint64(g.B.Bytes())},
		C:     &Buffer{dev: b.d, ptr: pc, bytes: uint64(c.Bytes())},
		Alpha: g.Alpha, Beta: g.Beta, OutF32: c.DType() == tensor.F32, InF32: dt == tensor.F32}
}

// postGemm checks spec against its buffers and posts it to the device.
func (b *Backend) postGemm(op string, spec Gemm) error {
	if err := spec.validate(); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	return b.d.Post(func() error { return b.d.matmulOnThread(&spec) })
}

// gemmSplitK says into how many slices of K a GEMM is cut: a weight gradient (A stored K×M,
// B stored K×N, so each slice is a contiguous block of rows of both) whose M×N output has too
// few 128×128 tiles to fill the GPU runs as a batch of split products, each over
// K/split rows, into fp32 scratch that one kernel adds up (gemmFolded). The Llama-3.2-1B k/v
// projection's dW (512×2048 from 16384 tokens: 64 tiles on 132 SMs, split 4) is the case it is
// for. Slices double while the tiles do not cover every SM once.
// split is a power of two up to 8, and every slice keeps at least 1024 rows, a multiple of 8.
func gemmSplitK(m, n, k int, transA, transB bool, sms int) int {
	if !transA || transB || sms <= 0 {
		return 1
	}
	tiles := ((m + 127) / 128) * ((n + 127) / 128)
	split := 1
	for split < 8 && tiles*split < sms {
		next := 2 * split
		if k%next != 0 || k/next < 1024 || (k/next)%8 != 0 {
			break
		}
		split = next
	}
	return split
}

// gemmFolded runs g as split products over slices of K (split = 1: one product) into fp32
// scratch and folds them into C: C = Beta·C + sum of the slices, added in fp32 and rounded once
// to C's dtype (ew_fold_parts). It serves split-K and an accumulating GEMM into bf16.
func (b *Backend) gemmFolded(op string, g gemmCall, dt tensor.DType, pa, pb, pc uintptr, split int) error {
	tmp, err := b.allocScratch(tensor.F32, split*g.M, g.N) // the products overwrite it
	if err != nil {
		return err
	}
	defer b.Free(tmp)
	arg := b.args(op)
	ptmp := arg.ptr("scratch", tmp)
	cc := arg.code("C", g.C)
	if err := arg.err(); err != nil {
		return err
	}
	ks := g.K / split
	h := g
	h.K, h.Beta = ks, 0 // each slice's product overwrites its part of the scratch
	spec := b.gemmSpec(h, dt, pa, pb, ptmp, tmp)
	if split > 1 {
		spec.Batch = split
		spec.StrideA, spec.StrideB, spec.StrideC = int64(ks)*int64(g.M), int64(ks)*int64(g.N), int64(g.M)*int64(g.N)
	}
	if err := b.postGemm(op, spec); err != nil {
		return err
	}
	return b.foldF32(g.C, pc, cc, g.Beta, ptmp, split)
}

// Linear computes out = x @ w^T + bias.
func (b *Backend) Linear(out, x, w, bias T) error {
	const op = "Linear"
	if w.Rank() != 2 {
		return fmt.Errorf("cuda: Linear: w %v must be [O, I]", w)
	}
	O, I := w.Dim(0), w.Dim(1)
	if x.Rank() == 0 || x.Dim(-1) != I {
		return fmt.Errorf("cuda: Linear: x %v must end in I=%d (w %v)", x, I, w)
	}
	M := x.Numel() / I
	if out.Numel() != M*O {
		return fmt.Errorf("cuda: Linear: out %v must hold [%d, %d]", out, M, O)
	}
	if bias.IsNil() {
		return b.gemm(op, gemmCall{A: x, B: w, C: out, M: M, N: O, K: I, TransB: true, Alpha: 1})
	}
	if bias.Numel() != O {
		return fmt.Errorf("cuda: Linear: bias %v must have O=%d elements", bias, O)
	}
	arg := b.args(op)
	po, co := arg.float("out", out)
	pb, cb := arg.float("bias", bias)
	if err := arg.err(); err != nil {
		return err
	}
	if M == 0 {
		return nil
	}
	// The bias is added to the fp32 product before the single rounding to out's dtype.
	acc := out
	if out.DType() != tensor.F32 {
		var err error
		if acc, err = b.allocScratch(tensor.F32, M, O); err != nil { // the product overwrites it
			return err
		}
		defer b.Free(acc)
	}
	if err := b.gemm(op, gemmCall{A: x, B: w, C: acc, M: M, N: O, K: I, TransB: true, Alpha: 1}); err != nil {
		return err
	}
	pacc := arg.ptr("acc", acc)
	if err := arg.err(); err != nil {
		return err
	}
	return b.launch1D("elementwise.cu", "bias_rows_out", int64(M)*int64(O), po, co, pacc, pb, cb, int64(M), int32(O))
}

// LinearBackward computes dX, dW and dB of Linear.
func (b *Backend) LinearBackward(a backend.LinearBackwardArgs) error {
	const op = "LinearBackward"
	O := a.DY.Dim(-1)
	if a.DY.Rank() == 0 || O == 0 {
		return fmt.Errorf("cuda: %s: dY %v must be [M, O]", op, a.DY)
	}
	M := a.DY.Numel() / O
	if !a.DX.IsNil() {
		if a.W.Rank() != 2 || a.W.Dim(0) != O {
			return fmt.Errorf("cuda: %s: W %v must be [O=%d, I]", op, a.W, O)
		}
		I := a.W.Dim(1)
		if a.DX.Numel() != M*I {
			return fmt.Errorf("cuda: %s: dX %v must hold [%d, %d]", op, a.DX, M, I)
		}
		beta := float32(0)
		if a.AccumulateDX {
			beta = 1
		}
		if err := b.gemm(op, gemmCall{A: a.DY, B: a.W, C: a.DX, M: M, N: I, K: O, Alpha: 1, Beta: beta}); err != nil {
			return err
		}
	}
	if !a.DW.IsNil() {
		if a.DW.Rank() != 2 || a.DW.Dim(0) != O {
			return fmt.Errorf("cuda: %s: dW %v must be [O=%d, I]", op, a.DW, O)
		}
		I := a.DW.Dim(1)
		if a.X.Numel() != M*I {
			return fmt.Errorf("cuda: %s: X %v must hold [%d, %d]", op, a.X, M, I)
		}
		if err := b.gemm(op, gemmCall{A: a.DY, B: a.X, C: a.DW, M: O, N: I, K: M, TransA: true, Alpha: 1, Beta: 1}); err != nil {
			return err
		}
	}
	if !a.DB.IsNil() {
		if a.DB.Numel() != O {
			return fmt.Errorf("cuda: %s: dB %v must have O=%d elements", op, a.DB, O)
		}
		arg := b.args(op)
		pdb, cdb := arg.float("dB", a.DB)
		pdy, cdy := arg.float("dY", a.DY)
		if err := arg.err(); err != nil {
			return err
		}
		if M == 0 {
			return nil
		}
		return b.d.Post(func() error {
			acc, err := b.d.allocOnThread(uint64(4 * O))
			if err != nil {
				return err
			}
			defer b.d.alloc.Free(acc.ptr)
			if err := b.d.drv.check("cuMemsetD8Async", b.d.drv.cuMemsetD8Async(acc.ptr, 0, uint64(4*O), b.d.stream)); err != nil {
				return err
			}
			gy := uint32(min(M, 256))
			if err := b.d.launchOnThread("elementwise.cu", "bias_grad_partial", [3]uint32{uint32((O + 255) / 256), gy, 1}, [3]uint32{256, 1, 1}, 0,
				packArgs(acc.ptr, pdy, cdy, int64(M), int32(O))...); err != nil {
				return err
			}
			n := int64(O)
			return b.d.launchOnThread("elementwise.cu", "ew_axpy", grid1D(n, b.d.info.SMs), [3]uint32{256, 1, 1}, 0,
				packArgs(pdb, cdb, float32(1), acc.ptr, int32(tensor.F32), n)...)
		})
	}
	return nil
}
