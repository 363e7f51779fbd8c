package cuda

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/rmsnorm.cu: RMSNorm, AddRMSNorm and RMSNormBackward, and how the
// vectorised bf16 kernels are chosen and sized for a row width.

// normVecRowsPerBlock is how many rows a 256-thread block of the vectorised bf16 RMSNorm
// kernels covers for rows of C elements (rmsnorm.cu: L = min(32, C/8) lanes per row), or 0 when
// they do not apply (C not a multiple of 8, or C/8 below 32 and not dividing it).
func normVecRowsPerBlock(C int) int {
	if C <= 0 || C%8 != 0 {
		return 0
	}
	c8 := C / 8
	if c8 >= 32 {
		return 8
	}
	if 32%c8 != 0 {
		return 0
	}
	return 8 * (32 / c8)
}

// normBwdOptions size the vectorised backward (a Backend's normBwd); defaultNormBwdOptions are
// the ones TestGPUMemoryBoundKernels' sweeps measured fastest on an H200.
type normBwdOptions struct {
	// blocksPerSM bounds the grid for rows of up to 1024 elements (blocks per SM); more blocks
	// mean fewer rows per warp but more dW partial rows to add up.
	blocksPerSM int
	// blocksPerSMWide is the bound for rows of more than 1024 elements, whose kernel holds a
	// row's 8 vectors of x, dy and old dx per lane at once and fits one 256-thread block per SM
	// (two with sharedDW).
	blocksPerSMWide int
	// sharedDW selects, for rows of 1024 < C <= 2048, the backward that keeps its weight-
	// gradient partial sums in shared memory (rmsnorm_bwd_bf16x8_c2048s, two blocks per SM) over
	// the one that keeps them in registers (one block per SM).
	sharedDW bool
}

func defaultNormBwdOptions() normBwdOptions {
	return normBwdOptions{blocksPerSM: 2, blocksPerSMWide: 1, sharedDW: true}
}

// normBwdPlan is how the vectorised backward runs for rows of C elements: the kernel (its
// registers hold at most 4, or 8, vectors of 8 per lane; "" when none covers C), its grid bound
// in blocks per SM, and the dynamic shared memory its weight-gradient partial sums take.
type normBwdPlan struct {
	kernel   string
	perSM    int
	dwShared uint32
}

// plan is the vectorised backward for rows of C elements under o.
func (o normBwdOptions) plan(C int) normBwdPlan {
	switch {
	case C <= 1024:
		return normBwdPlan{"rmsnorm_bwd_bf16x8_c1024", o.blocksPerSM, uint32(4 * 8 * max(C, 256))}
	case C > 2048:
		return normBwdPlan{}
	case o.sharedDW:
		// every warp's sums, for 2048 columns
		return normBwdPlan{"rmsnorm_bwd_bf16x8_c2048s", 2 * o.blocksPerSMWide, 4 * 8 * 2048}
	}
	return normBwdPlan{"rmsnorm_bwd_bf16x8_c2048", o.blocksPerSMWide, uint32(4 * 8 * C)}
}

// normRowThreads is the block of the one-block-per-row bf16 kernels (rmsnorm.cu:
// rmsnorm_fwd_bf16x8_row, add_rmsnorm_fwd_bf16x8_row) and normRowVectors the vectors of 8 each
// of their threads holds (RN_ROW_V).
const (
	normRowThreads = 256
	normRowVectors = 8
)

// normRowPerBlock reports whether N rows of C elements, which the warp-per-row kernels would
// cover in blocks of rpb rows, run the one-block-per-row kernels instead: when the warp kernels
// would give the sms SMs fewer than two blocks each (few rows, as in decoding), and the rows are
// wide enough to spread over a block (C >= 1024) and narrow enough for its registers.
func normRowPerBlock(N, C, rpb, sms int) bool {
	if rpb <= 0 || C < 1024 || C/8 > normRowThreads*normRowVectors {
		return false
	}
	return (N+rpb-1)/rpb < 2*max(sms, 1)
}

func normBlock(C int) uint32 {
	switch {
	case C >= 1024:
		return 512
	case C >= 256:
		return 256
	default:
		return 64
	}
}

// RMSNorm normalises each row of x.
func (b *Backend) RMSNorm(out, rstd, x, w T, eps float32) error {
	const op = "RMSNorm"
	N, C, err := normShapes(op, out, rstd, x, w)
	if err != nil {
		return err
	}
	arg := b.args(op)
	po, co := arg.float("out", out)
	pr := arg.ptr("rstd", rstd)
	px, cx := arg.float("x", x)
	pw, cw := arg.float("w", w)
	if err := arg.err(); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	if rpb := normVecRowsPerBlock(C); rpb > 0 && vec8(int64(C), []int32{co, cx, cw}, po, px, pw) {
		if normRowPerBlock(N, C, rpb, b.d.info.SMs) {
			args := packArgs(po, pr, px, pw, int32(C), eps)
			return b.d.Post(func() error {
				return b.d.launchOnThread("rmsnorm.cu", "rmsnorm_fwd_bf16x8_row", [3]uint32{uint32(N), 1, 1}, [3]uint32{normRowThreads, 1, 1}, 0, args...)
			})
		}
		args := packArgs(po, pr, px, pw, int64(N), int32(C), eps)
		return b.d.Post(func() error {
			return b.d.launchOnThread("rmsnorm.cu", "rmsnorm_fwd_bf16x8", [3]uint32{uint32((N + rpb - 1) / rpb), 1, 1}, [3]uint32{256, 1, 1}, 0, args...)
		})
	}
	args := packArgs(po, co, pr, px, cx, pw, cw, int32(C), eps)
	return b.d.Post(func() error {
		return b.d.launchOnThread("rmsnorm.cu", "rmsnorm_fwd", [3]uint32{uint32(N), 1, 1}, [3]uint32{normBlock(C), 1, 1}, 0, args...)
	})
}

func normShapes(op string, out, rstd, x, w T) (N, C int, err error) {
	if w.Rank() != 1 {
		return 0, 0, fmt.Errorf("cuda: %s: w %v must be [C]", op, w)
	}
	C = w.Dim(0)
	if x.Rank() == 0 || x.Dim(-1) != C {
		return 0, 0, fmt.Errorf("cuda: %s: x %v must end in C=%d", op, x, C)
	}
	N = x.Numel() / C
	if out.Numel() != x.Numel() {
		return 0, 0, fmt.Errorf("cuda: %s: out %v must match x %v", op, out, x)
	}
	if rstd.DType() != tensor.F32 || rstd.Numel() != N {
		return 0, 0, fmt.Errorf("cuda: %s: rstd %v must be f32 [%d]", op, rstd, N)
	}
	if N > math.MaxInt32 {
		return 0, 0, fmt.Errorf("cuda: %s: %d rows exceed the kernel's limit", op, N)
	}
	return N, C, nil
}

// AddRMSNorm fuses residualOut = x + residual with RMSNorm(residualOut).
func (b *Backend) AddRMSNorm(residualOut, out, rstd, x, residual, w T, eps float32) error {
	const op = "AddRMSNorm"
	N, C, err := normShapes(op, out, rstd, x, w)
	if err != nil {
		return err
	}
	if residualOut.Numel() != x.Numel() || residual.Numel() != x.Numel() {
		return fmt.Errorf("cuda: %s: residualOut %v and residual %v must match x %v", op, residualOut, residual, x)
	}
	arg := b.args(op)
	pro, cro := arg.float("residualOut", residualOut)
	po, co := arg.float("out", out)
	pr := arg.ptr("rstd", rstd)
	px, cx := arg.float("x", x)
	pres, cres := arg.float("residual", residual)
	pw, cw := arg.float("w", w)
	if err := arg.err(); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	if rpb := normVecRowsPerBlock(C); rpb > 0 && vec8(int64(C), []int32{cro, co, cx, cres, cw}, pro, po, px, pres, pw) {
		if normRowPerBlock(N, C, rpb, b.d.info.SMs) {
			args := packArgs(pro, po, pr, px, pres, pw, int32(C), eps)
			return b.d.Post(func() error {
				return b.d.launchOnThread("rmsnorm.cu", "add_rmsnorm_fwd_bf16x8_row", [3]uint32{uint32(N), 1, 1}, [3]uint32{normRowThreads, 1, 1}, 0, args...)
			})
		}
		args := packArgs(pro, po, pr, px, pres, pw, int64(N), int32(C), eps)
		return b.d.Post(func() error {
			return b.d.launchOnThread("rmsnorm.cu", "add_rmsnorm_fwd_bf16x8", [3]uint32{uint32((N + rpb - 1) / rpb), 1, 1}, [3]uint32{256, 1, 1}, 0, args...)
		})
	}
	args := packArgs(pro, cro, po, co, pr, px, cx, pres, cres, pw, cw, int32(C), eps)
	return b.d.Post(func() error {
		return b.d.launchOnThread("rmsnorm.cu", "add_rmsnorm_fwd", [3]uint32{uint32(N), 1, 1}, [3]uint32{normBlock(C), 1, 1}, 0, args...)
	})
}

// RMSNormBackward computes dX and dW of RMSNorm.
func (b *Backend) RMSNormBackward(a backend.RMSNormBackwardArgs) error {
	const op = "RMSNormBackward"
	N, C, err := normShapes(op, a.DX, a.RStd, a.X, a.W)
	if err != nil {
		return err
	}
	if a.DY.Numel() != a.X.Numel() {
		return fmt.Errorf("cuda: %s: dY %v must match x %v", op, a.DY, a.X)
	}
	if tensor.SameBuffer(a.DX, a.DY) {
		return fmt.Errorf("cuda: %s: dX may not alias dY", op)
	}
	arg := b.args(op)
	pdx, cdx := arg.float("dX", a.DX)
	pdy, cdy := arg.float("dY", a.DY)
	px, cx := arg.float("x", a.X)
	pw, cw := arg.float("w", a.W)
	pr := arg.ptr("rstd", a.RStd)
	pdw, cdw := arg.optFloat("dW", a.DW)
	if err := arg.err(); err != nil {
		return err
	}
	if !a.DW.IsNil() && a.DW.Numel() != C {
		return fmt.Errorf("cuda: %s: dW %v must be [%d]", op, a.DW, C)
	}
	if N == 0 {
		return nil
	}
	acc := int32(0)
	if a.AccumulateDX {
		acc = 1
	}
	shared := uint32(0)
	if pdw != 0 {
		shared = uint32(4 * C)
	}
	rpb, plan := normVecRowsPerBlock(C), b.normBwd.plan(C)
	vec := rpb > 0 && plan.kernel != "" && vec8(int64(C), []int32{cdx, cdy, cx, cw}, pdx, pdy, px, pw)
	if int(shared) > b.d.info.MaxSharedPerBlock-1024 {
		return fmt.Errorf("cuda: %s: C=%d is too wide for the weight-gradient kernel (needs %d bytes of shared memory, device has %d)", op, C, shared, b.d.info.MaxSharedPerBlock)
	}
	return b.d.Post(func() error {
		if vec {
			// Each block stores its dW partial sums as one row of part [blocks, C]; one more
			// kernel adds the rows into dW.
			blocks := min((N+rpb-1)/rpb, b.d.info.SMs*plan.perSM)
			var part uintptr
			vshared := uint32(0)
			if pdw != 0 {
				vshared = plan.dwShared
				if int(vshared) > b.d.info.MaxSharedPerBlock {
					return fmt.Errorf("cuda: %s: C=%d is too wide for the weight-gradient kernel (needs %d bytes of shared memory, device has %d)", op, C, vshared, b.d.info.MaxSharedPerBlock)
				}
				buf, err := b.d.allocOnThread(uint64(4 * C * blocks))
				if err != nil {
					return err
				}
				defer b.d.alloc.Free(buf.ptr)
				part = buf.ptr
			}
			args := packArgs(pdx, part, pdy, px, pw, pr, int64(N), int32(C), acc)
			if err := b.d.launchOnThread("rmsnorm.cu", plan.kernel, [3]uint32{uint32(blocks), 1, 1}, [3]uint32{256, 1, 1}, vshared, args...); err != nil {
				return err
			}
			if pdw == 0 {
				return nil
			}
			return b.d.launchOnThread("rmsnorm.cu", "rmsnorm_dw_reduce", [3]uint32{uint32((C + 31) / 32), 1, 1}, [3]uint32{256, 1, 1}, 0,
				packArgs(pdw, cdw, part, int32(blocks), int32(C))...)
		}
		var accBuf uintptr
		if pdw != 0 {
			buf, err := b.d.allocOnThread(uint64(4 * C))
			if err != nil {
				return err
			}
			defer b.d.alloc.Free(buf.ptr)
			accBuf = buf.ptr
			if err := b.d.drv.check("cuMemsetD8Async", b.d.drv.cuMemsetD8Async(accBuf, 0, uint64(4*C), b.d.stream)); err != nil {
				return err
			}
		}
		blocks := uint32(min(N, b.d.info.SMs*4))
		args := packArgs(pdx, cdx, accBuf, pdy, cdy, px, cx, pw, cw, pr, int64(N), int32(C), acc)
		if err := b.d.launchOnThread("rmsnorm.cu", "rmsnorm_bwd", [3]uint32{blocks, 1, 1}, [3]uint32{normBlock(C), 1, 1}, shared, args...); err != nil {
			return err
		}
		if pdw == 0 {
			return nil
		}
		n := int64(C)
		return b.d.launchOnThread("elementwise.cu", "ew_axpy", grid1D(n, b.d.info.SMs), [3]uint32{256, 1, 1}, 0,
			packArgs(pdw, cdw, float32(1), accBuf, int32(tensor.F32), n)...)
	})
}
