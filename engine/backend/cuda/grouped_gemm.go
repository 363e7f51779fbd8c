package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host launcher of kernels/grouped_gemm.cu and, on Hopper, kernels/grouped_gemm_wg.cu:
// backend.Optional.GroupedGEMM.

const groupedFile = "grouped_gemm.cu"

// groupedTile is the CTA tile of the mma.sync kernels (GG_BM = GG_BN in grouped_gemm.cu), and
// groupedShared their dynamic shared memory (GG_SHARED: four buffers of each operand's
// 128 x (32+8) bf16 tile).
const (
	groupedTile   = 128
	groupedShared = 2 * 4 * groupedTile * (32 + 8) * 2
)

// groupedWGVariant is one variant of the warpgroup-MMA kernels (GW_KERNELS in
// grouped_gemm_wg.cu): the kernels' name suffix, the tile's columns and the dynamic shared memory
// (stages of a 16 KiB A tile and a cols x 64 bf16 B tile, and 1 KiB for alignment). Every
// variant takes the mma.sync kernels' arguments; the row tiles are 128 as theirs.
type groupedWGVariant struct {
	suffix string
	cols   int
	shared uint32
	// tma marks the TMA variant: 384 threads (a loading warpgroup and two multiplying ones),
	// the A and B operands passed as tensor maps (groupedTMAMaps).
	tma bool
	// ctas, when set, makes the variant's weight gradient persistent: a grid of at most ctas
	// CTAs a multiprocessor (its __launch_bounds__) that walk all groups' output tiles
	// (groupedGrid's weight-gradient grid is then the tile count it bounds).
	ctas int
}

func wgShared(stages, cols int) uint32 { return uint32(stages*(16384+cols*128) + 1024) }

// groupedWGVariants are the variants by their HALO_CUDA_GROUPED_GEMM names.
var groupedWGVariants = map[string]groupedWGVariant{
	"wg":        {suffix: "", cols: 128, shared: wgShared(4, 128)},
	"wg-n128":   {suffix: "_n128", cols: 128, shared: wgShared(5, 128)},
	"wg-n256":   {suffix: "_n256", cols: 256, shared: wgShared(4, 256)},
	"wg-n128x2": {suffix: "_n128x2", cols: 128, shared: wgShared(3, 128)},
	"wg-tma":    {suffix: "_tma", cols: 256, shared: wgShared(4, 256), tma: true},
	"wg-p":      {suffix: "_p", cols: 128, shared: wgShared(3, 128), ctas: 2},
	"wg-p256":   {suffix: "_p256", cols: 256, shared: wgShared(4, 256), ctas: 1},
}

// defaultGroupedWG is the choice of grouped GEMM kernels on a device of arch when
// HALO_CUDA_GROUPED_GEMM is auto: groupedWGAuto's variant per kind on sm_90, none (mma.sync)
// elsewhere.
func defaultGroupedWG(arch string) string {
	if wgArch(arch) {
		return "auto"
	}
	return ""
}

// groupedWGAuto is the warpgroup-MMA variant each kind runs on by default: of the variants that
// passed TestGPUGroupedGEMM, the fastest in TestGPUGroupedGEMMThroughput for that kind over the
// Qwen3-30B-A3B, OLMoE and Mixtral expert shapes (testdata/gpu-run22): 128x256 tiles for the
// forward, two 128x128 CTAs per multiprocessor for both gradients, whose short reductions (a
// few hundred rows per expert in the weight gradient) leave one CTA's prologue and store
// exposed.
var groupedWGAuto = [...]string{
	backend.GroupedForward:    "wg-n256",
	backend.GroupedInputGrad:  "wg-n128x2",
	backend.GroupedWeightGrad: "wg-n128x2",
}

// groupedWGKernels are the warpgroup-MMA kernels' names per kind, before the variant's suffix.
var groupedWGKernels = [...]string{
	backend.GroupedForward:    "grouped_gemm_wg_fwd",
	backend.GroupedInputGrad:  "grouped_gemm_wg_dx",
	backend.GroupedWeightGrad: "grouped_gemm_wg_dw",
}

// groupedMMAKernels are the mma.sync kernels per kind.
var groupedMMAKernels = [...]string{
	backend.GroupedForward:    "grouped_gemm_mma_fwd",
	backend.GroupedInputGrad:  "grouped_gemm_mma_dx",
	backend.GroupedWeightGrad: "grouped_gemm_mma_dw",
}

// groupedMMA reports whether the mma.sync kernels take a product of sizes d: bf16 operands whose
// rows start on 16-byte boundaries (N_ and K_ multiples of 8, 16-byte aligned tensors), into an
// output that starts on one too (the epilogues store pairs and the accumulating ones read them).
func groupedMMA(d backend.GroupedDims, ca, cb int32, pa, pb, po uintptr) bool {
	return d.N%8 == 0 && po%16 == 0 && vec8(int64(d.K), []int32{ca, cb}, pa, pb)
}

// groupedGrid is the launch grid of a tensor-core kernel of kind for sizes d, whose tiles have
// 128 rows and cols columns: column tiles in x; row tiles in y, for the bound ceil(S/128) + G on
// the per-group tiles of the row kinds, or the N_ tiles with the groups in z for the weight
// gradient.
func groupedGrid(kind backend.GroupedKind, d backend.GroupedDims, cols int) ([3]uint32, error) {
	tiles := func(n, t int) int64 { return (int64(n) + int64(t) - 1) / int64(t) }
	var g [3]int64
	switch kind {
	case backend.GroupedForward:
		g = [3]int64{tiles(d.N, cols), tiles(d.S, groupedTile) + int64(d.G), 1}
	case backend.GroupedInputGrad:
		g = [3]int64{tiles(d.K, cols), tiles(d.S, groupedTile) + int64(d.G), 1}
	default:
		g = [3]int64{tiles(d.K, cols), tiles(d.N, groupedTile), int64(d.G)}
	}
	if g[0] > math.MaxInt32 || g[1] > 65535 || g[2] > 65535 {
		return [3]uint32{}, fmt.Errorf("grid %v exceeds the launch limits (2^31-1, 65535, 65535)", g)
	}
	return [3]uint32{uint32(g[0]), uint32(g[1]), uint32(g[2])}, nil
}

// persistentGrid is the one-dimensional grid of a persistent weight gradient whose tiles
// would take grid: one CTA a tile up to ctas a multiprocessor of sms.
func persistentGrid(grid [3]uint32, sms, ctas int) [3]uint32 {
	tiles := uint64(grid[0]) * uint64(grid[1]) * uint64(grid[2])
	n := uint64(max(sms, 1) * max(ctas, 1))
	return [3]uint32{uint32(max(min(tiles, n), 1)), 1, 1}
}

// GroupedGEMM implements backend.Optional.GroupedGEMM: one launch for all groups, the groups'
// rows found on the device from Offsets (never read here). bf16 operands with 16-byte aligned
// rows take the tensor-core kernels (the warpgroup-MMA variant groupedWG names, else mma.sync); other
// float operands the scalar kernel.
func (b *Backend) GroupedGEMM(a backend.GroupedGEMMArgs) error {
	d, err := a.Dims()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	op := "grouped-gemm " + a.Kind.String()
	arg := b.args(op)
	po, co := arg.float("Out", a.Out)
	pa, ca := arg.float("A", a.A)
	pb, cb := arg.float("B", a.B)
	poff := arg.i32("Offsets", a.Offsets)
	if err := arg.err(); err != nil {
		return err
	}
	if d.S > math.MaxInt32 || d.N > math.MaxInt32/groupedTile || d.K > math.MaxInt32/groupedTile {
		return fmt.Errorf("cuda: %s: sizes S=%d N_=%d K_=%d exceed the kernels' 32-bit indices", op, d.S, d.N, d.K)
	}
	if a.Out.Numel() == 0 {
		return nil
	}
	if b.groupedWG == groupedCublas {
		return b.groupedPerGroup(op, a, d)
	}
	acc := int32(0)
	if a.Accumulate {
		acc = 1
	}
	if groupedMMA(d, ca, cb, pa, pb, po) {
		file, name, shared, cols := groupedFile, groupedMMAKernels[a.Kind], uint32(groupedShared), groupedTile
		variant := b.groupedWG
		if variant == "auto" {
			variant = groupedWGAuto[a.Kind]
		}
		if groupedWGVariants[variant].tma && d.S == 0 {
			// A tensor map cannot describe a tensor of no rows; with no rows the weight gradient
			// is zeros (or Out kept, accumulating), which the pointer-based kernels write.
			variant = "wg"
		}
		if variant != "" {
			v, ok := groupedWGVariants[variant]
			if !ok {
				return fmt.Errorf("cuda: %s: no warpgroup-MMA variant %q", op, variant)
			}
			file, name, shared, cols = groupedWGFile, groupedWGKernels[a.Kind]+v.suffix, v.shared, v.cols
		}
		grid, err := groupedGrid(a.Kind, d, cols)
		if err != nil {
			return fmt.Errorf("cuda: %s: %w", op, err)
		}
		if c := groupedWGVariants[variant].ctas; c > 0 && a.Kind == backend.GroupedWeightGrad {
			grid = persistentGrid(grid, b.d.info.SMs, c)
		}
		if groupedWGVariants[variant].tma {
			sa, sb := groupedTMAMaps(a.Kind, d)
			return b.d.Post(func() error {
				ma, err := b.d.drv.encodeTMA(sa, pa)
				if err != nil {
					return fmt.Errorf("cuda: %s: A: %w", op, err)
				}
				mb, err := b.d.drv.encodeTMA(sb, pb)
				if err != nil {
					return fmt.Errorf("cuda: %s: B: %w", op, err)
				}
				args := append([]unsafe.Pointer{ma.ptr(), mb.ptr()}, packArgs(po, co, poff, int32(d.G), int32(d.N), int32(d.K), acc)...)
				return b.d.launchOnThread(file, name, grid, [3]uint32{384, 1, 1}, shared, args...)
			})
		}
		args := packArgs(po, co, pa, pb, poff, int32(d.G), int32(d.N), int32(d.K), acc)
		return b.d.Post(func() error {
			return b.d.launchOnThread(file, name, grid, [3]uint32{256, 1, 1}, shared, args...)
		})
	}
	n := int64(a.Out.Numel())
	return b.launch1D(groupedFile, "grouped_gemm_simt", n, int32(a.Kind), po, co, pa, ca, pb, cb, poff,
		int32(d.G), int64(d.S), int32(d.N), int32(d.K), acc)
}

// groupedCublas is the HALO_CUDA_GROUPED_GEMM value that runs each group as its own cuBLASLt
// GEMM (groupedPerGroup).
const groupedCublas = "cublas"

// checkGroupOffsets checks the groups' row offsets read to the host: G+1 of them rising from 0 to S.
func checkGroupOffsets(offs []int32, g, s int) error {
	if len(offs) != g+1 {
		return fmt.Errorf("%d offsets for %d groups; want G+1", len(offs), g)
	}
	if offs[0] != 0 || int(offs[g]) != s {
		return fmt.Errorf("offsets run from %d to %d; want 0 to the %d rows", offs[0], offs[g], s)
	}
	for i := 1; i <= g; i++ {
		if offs[i] < offs[i-1] {
			return fmt.Errorf("offsets %d and %d of groups %d and %d fall; they must not decrease", offs[i-1], offs[i], i-1, i)
		}
	}
	return nil
}

// groupedPerGroup runs a grouped product as one cuBLASLt GEMM per group (HALO_CUDA_GROUPED_GEMM
// =cublas): the offsets are read to the host first, which waits for the work that made them.
// Products accumulate in fp32 and round once into Out, an accumulating bf16 Out included
// (FoldBeta), as GroupedGEMMArgs states; an empty group's weight gradient is zeros (or Out
// kept, accumulating).
func (b *Backend) groupedPerGroup(op string, a backend.GroupedGEMMArgs, d backend.GroupedDims) error {
	offs, err := backend.ToInt32(b, a.Offsets)
	if err != nil {
		return fmt.Errorf("cuda: %s: offsets: %w", op, err)
	}
	if err := checkGroupOffsets(offs, d.G, d.S); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	beta := float32(0)
	if a.Accumulate {
		beta = 1
	}
	view := func(t T, g, rows, cols int) (T, error) { return t.View(g*rows*cols, rows, cols) }
	for g := 0; g < d.G; g++ {
		r0, r1 := int(offs[g]), int(offs[g+1])
		n := r1 - r0
		var call gemmCall
		var err error
		switch a.Kind {
		case backend.GroupedForward, backend.GroupedInputGrad:
			if n == 0 {
				continue
			}
			k, cols := d.K, d.N // forward: [n, K_] x [N_, K_]^T -> [n, N_]
			if a.Kind == backend.GroupedInputGrad {
				k, cols = d.N, d.K // input grad: [n, N_] x [N_, K_] -> [n, K_]
			}
			var ag, bg, og T
			if ag, err = a.A.View(r0*k, n, k); err == nil {
				if bg, err = view(a.B, g, d.N, d.K); err == nil {
					og, err = a.Out.View(r0*cols, n, cols)
				}
			}
			call = gemmCall{A: ag, B: bg, C: og, M: n, N: cols, K: k, TransB: a.Kind == backend.GroupedForward,
				Alpha: 1, Beta: beta, FoldBeta: true}
		default: // weight grad: [n, N_]^T x [n, K_] -> [N_, K_]
			og, verr := view(a.Out, g, d.N, d.K)
			if verr != nil {
				return fmt.Errorf("cuda: %s: group %d: %w", op, g, verr)
			}
			if n == 0 {
				if !a.Accumulate {
					if err := b.Fill(og, 0); err != nil {
						return err
					}
				}
				continue
			}
			var ag, bg T
			if ag, err = a.A.View(r0*d.N, n, d.N); err == nil {
				bg, err = a.B.View(r0*d.K, n, d.K)
			}
			call = gemmCall{A: ag, B: bg, C: og, M: d.N, N: d.K, K: n, TransA: true, Alpha: 1, Beta: beta, FoldBeta: true}
		}
		if err != nil {
			return fmt.Errorf("cuda: %s: group %d: %w", op, g, err)
		}
		if err := b.gemm(op, call); err != nil {
			return err
		}
	}
	return nil
}
