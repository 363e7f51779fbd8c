package cuda

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ---- attention ----

const (
	attnRows = 8
	attnTile = 32
	// attnNarrowMaxHD is the widest head dim of attention.cu's attn_fwd, attn_bwd_dq and
	// attn_bwd_dkv (MAXD * 32); wider ones take the *_wide kernels.
	attnNarrowMaxHD = 256
	// attnMaxHD is the widest head dim any attention kernel takes (WMAXD * 32 in attention.cu).
	attnMaxHD = 512
	// attnWideChunk is the head dims per staged chunk of the *_wide kernels (WCH).
	attnWideChunk = 64
)

// simtKernels names the SIMT kernels (attention.cu) for one head dim, with the dynamic shared
// memory of each in bytes.
type simtKernels struct {
	fwd, dq, dkv                   string
	sharedFwd, sharedDQ, sharedDKV uint32
}

// simtAttention picks the SIMT kernels for head dim hd, false above attnMaxHD. Up to
// attnNarrowMaxHD, whole fp32 K/V (or Q/dout) tiles of attnTile rows padded to hd + 1 floats,
// plus the block's rows ([attnRows][hd], one array in the forward, two in the backward); above,
// one [attnTile][attnWideChunk + 1] staging buffer plus the block's rows.
func simtAttention(hd int) (simtKernels, bool) {
	if hd <= 0 || hd > attnMaxHD {
		return simtKernels{}, false
	}
	if hd <= attnNarrowMaxHD {
		P := hd + 1
		return simtKernels{fwd: "attn_fwd", dq: "attn_bwd_dq", dkv: "attn_bwd_dkv",
			sharedFwd: uint32(4 * (2*attnTile*P + attnRows*hd)), sharedDQ: uint32(4 * (2*attnTile*P + 2*attnRows*hd)),
			sharedDKV: uint32(4 * (2*attnTile*P + 2*attnRows*hd))}, true
	}
	stage := attnTile * (attnWideChunk + 1)
	return simtKernels{fwd: "attn_fwd_wide", dq: "attn_bwd_dq_wide", dkv: "attn_bwd_dkv_wide",
		sharedFwd: uint32(4 * (stage + attnRows*hd)), sharedDQ: uint32(4 * (stage + 2*attnRows*hd)),
		sharedDKV: uint32(4 * (stage + 2*attnRows*hd))}, true
}

type attnGeom struct {
	N, Nk, D      int
	NH, NKV, HD   int
	scale         float32
	window        int32
	cuQ, cuK      uintptr
	dt            int32
	pq, pk, pv    uintptr
	simt          simtKernels // the SIMT kernels for HD, where the tensor-core ones do not apply
	hasSeparateCK bool
	// cu is a host copy of the query boundaries (nil with separate key boundaries), for the
	// Hopper kernels' block order (attention_order.go).
	cu []int32
}

func (b *Backend) attnGeometry(op string, s backend.AttentionShape, q, k, v T) (attnGeom, error) {
	var g attnGeom
	g.NH, g.NKV, g.HD = s.NH, s.NKV, s.HD
	if g.NH <= 0 || g.NKV <= 0 || g.HD <= 0 || g.NH%g.NKV != 0 {
		return g, fmt.Errorf("cuda: %s: NH=%d, NKV=%d, HD=%d: need positive values with NH a multiple of NKV", op, g.NH, g.NKV, g.HD)
	}
	simt, ok := simtAttention(g.HD)
	if !ok {
		return g, fmt.Errorf("cuda: %s: head dim %d is above the attention kernels' limit of %d", op, g.HD, attnMaxHD)
	}
	g.simt = simt
	if q.Numel()%(g.NH*g.HD) != 0 {
		return g, fmt.Errorf("cuda: %s: Q %v must be [N, %d*%d]", op, q, g.NH, g.HD)
	}
	g.N = q.Numel() / (g.NH * g.HD)
	if k.Numel() != v.Numel() || k.Numel()%(g.NKV*g.HD) != 0 {
		return g, fmt.Errorf("cuda: %s: K %v and V %v must be [Nk, %d*%d]", op, k, v, g.NKV, g.HD)
	}
	g.Nk = k.Numel() / (g.NKV * g.HD)
	if q.DType() != k.DType() || q.DType() != v.DType() {
		return g, fmt.Errorf("cuda: %s: Q %v, K %v, V %v must share a dtype", op, q, k, v)
	}
	if s.CuSeqlens.DType() != tensor.I32 || s.CuSeqlens.Numel() < 2 {
		return g, fmt.Errorf("cuda: %s: CuSeqlens %v must be i32 [D+1] with D >= 1", op, s.CuSeqlens)
	}
	g.D = s.CuSeqlens.Numel() - 1
	if !s.CuSeqlensK.IsNil() {
		if s.CuSeqlensK.DType() != tensor.I32 || s.CuSeqlensK.Numel() != g.D+1 {
			return g, fmt.Errorf("cuda: %s: CuSeqlensK %v must be i32 [%d]", op, s.CuSeqlensK, g.D+1)
		}
		g.hasSeparateCK = true
	} else if g.Nk != g.N {
		return g, fmt.Errorf("cuda: %s: K has %d rows but Q has %d: set CuSeqlensK for decoding", op, g.Nk, g.N)
	}
	if s.Window < 0 {
		return g, fmt.Errorf("cuda: %s: window %d must be >= 0", op, s.Window)
	}
	arg := b.args(op)
	g.dt = arg.code("Q", q)
	g.pq, g.pk, g.pv = arg.ptr("Q", q), arg.ptr("K", k), arg.ptr("V", v)
	g.cuQ = arg.ptr("CuSeqlens", s.CuSeqlens)
	g.cuK = g.cuQ
	if g.hasSeparateCK {
		g.cuK = arg.ptr("CuSeqlensK", s.CuSeqlensK)
	}
	if err := arg.err(); err != nil {
		return g, err
	}
	// The boundaries must be well formed: the kernels trust them.
	cu, err := b.checkCuSeqlens(op, "CuSeqlens", g.cuQ, g.D, g.N)
	if err != nil {
		return g, err
	}
	if g.hasSeparateCK {
		if _, err := b.checkCuSeqlens(op, "CuSeqlensK", g.cuK, g.D, g.Nk); err != nil {
			return g, err
		}
	} else {
		g.cu = cu // a record's host copy or a fresh download: never written afterwards
	}
	g.scale = s.Scale
	if g.scale == 0 {
		g.scale = float32(1 / math.Sqrt(float64(g.HD)))
	}
	g.window = int32(min(s.Window, math.MaxInt32))
	return g, nil
}

// attnTiles chooses among the tensor-core kernels' compiled shapes (attention_tc.cu):
//
//	FwdW, FwdMT, FwdBK: warps per forward block, 16-row m-tiles per warp (a block covers
//	16 * FwdW * FwdMT queries) and keys per tile;
//	DQW, DQBK: warps per dQ block (16 queries each) and keys per tile;
//	DKVW, DKVBQ: warps per dK/dV block (16 keys each) and queries per tile.
type attnTiles struct{ FwdW, FwdMT, FwdBK, DQW, DQBK, DKVW, DKVBQ int }

// attnVariants lists the compiled shapes per head dim (the FWD_MMA, BWD_DQ and BWD_DKV
// instantiations): forward {W, MT, BK}, dQ {W, BK}, dK/dV {W, BQ}. attnDefaultTiles holds the
// choice measured fastest on an H200 (TestGPUAttentionTileSweep, testdata/gpu-run*). Blocks of
// 8 warps were measured too (testdata/gpu-run5) and were slower for every kernel but the head
// dim 64 dQ with 64-key tiles, which is kept for comparison.
var (
	attnVariants = map[int]struct {
		fwd            [][3]int
		dq, dkv, fused [][2]int
	}{
		64:  {fwd: [][3]int{{4, 1, 64}, {4, 2, 64}}, dq: [][2]int{{4, 32}, {8, 64}}, dkv: [][2]int{{4, 64}, {8, 64}}, fused: [][2]int{{4, 64}}},
		128: {fwd: [][3]int{{4, 1, 64}, {4, 2, 32}}, dq: [][2]int{{4, 32}}, dkv: [][2]int{{4, 32}}, fused: [][2]int{{4, 32}}},
	}
	attnDefaultTiles = map[int]attnTiles{
		64:  {FwdW: 4, FwdMT: 2, FwdBK: 64, DQW: 4, DQBK: 32, DKVW: 4, DKVBQ: 64},
		128: {FwdW: 4, FwdMT: 1, FwdBK: 64, DQW: 4, DQBK: 32, DKVW: 4, DKVBQ: 32},
	}
)

// attnOverrides replace the attention kernels' measured choices on one Backend, for the GPU
// tests that compare and time the alternatives; the zero value keeps every choice.
type attnOverrides struct {
	// tiles replaces attnDefaultTiles per head dim (the mma.sync kernels).
	tiles map[int]attnTiles
	// wg replaces wgDefault entries (the Hopper kernels), by the same "kind/hd" keys.
	wg map[string]wgKernel
	// bwdOnly runs one part of the backward alone, for timing: "dq" or "dkv" (one of the two
	// kernels; with the Hopper kernels after the per-row pass) or "dl" (that pass alone).
	bwdOnly string
}

// tiles returns the tile shapes for head dim hd: the backend's override when set, else the default.
func (b *Backend) tiles(hd int) attnTiles {
	if t, ok := b.attnOverride.tiles[hd]; ok {
		return t
	}
	return attnDefaultTiles[hd]
}

// checkTiles reports whether t names compiled kernels for head dim hd.
func checkTiles(hd int, t attnTiles) error {
	v, ok := attnVariants[hd]
	if !ok {
		return fmt.Errorf("cuda: no tensor-core attention kernels for head dim %d", hd)
	}
	if !slices.Contains(v.fwd, [3]int{t.FwdW, t.FwdMT, t.FwdBK}) || !slices.Contains(v.dq, [2]int{t.DQW, t.DQBK}) ||
		!slices.Contains(v.dkv, [2]int{t.DKVW, t.DKVBQ}) {
		return fmt.Errorf("cuda: attention tiles %+v are not compiled for head dim %d", t, hd)
	}
	return nil
}

func (t attnTiles) fwdName(hd int) string {
	return fmt.Sprintf("attn_fwd_mma_%d_w%d_m%d_k%d", hd, t.FwdW, t.FwdMT, t.FwdBK)
}
func (t attnTiles) dqName(hd int) string {
	return fmt.Sprintf("attn_bwd_dq_mma_%d_w%d_k%d", hd, t.DQW, t.DQBK)
}

// fusedName is the one-pass backward of the dK/dV tile shape (attention_fused.cu).
func (t attnTiles) fusedName(hd int) string {
	return fmt.Sprintf("attn_bwd_fused_mma_%d_w%d_q%d", hd, t.DKVW, t.DKVBQ)
}

// fusedCompiled reports whether the one-pass backward exists for t's dK/dV shape.
func fusedCompiled(hd int, t attnTiles) bool {
	return slices.Contains(attnVariants[hd].fused, [2]int{t.DKVW, t.DKVBQ})
}

func (t attnTiles) dkvName(hd int) string {
	return fmt.Sprintf("attn_bwd_dkv_mma_%d_w%d_q%d", hd, t.DKVW, t.DKVBQ)
}

// Dynamic shared memory of the tensor-core kernels, in bytes: bf16 tiles with a row stride of
// hd + 8 elements.
//
//	forward: K and V tiles of bk keys, two buffers each, and with mt > 1 the block's Q rows;
//	dQ: K and V tiles of bk keys, two buffers each;
//	dK/dV: the block's 16 * w keys of K and V, two buffers each of bq-query Q and dO tiles, and
//	two buffers of bq lse and bq D values (fp32).
func mmaSharedFwd(hd, w, mt, bk int) uint32 {
	n := 2 * 2 * 2 * bk * (hd + 8)
	if mt > 1 {
		n += 2 * 16 * w * mt * (hd + 8)
	}
	return uint32(n)
}
func mmaSharedDQ(hd, bk int) uint32 { return uint32(2 * 2 * 2 * bk * (hd + 8)) }
func mmaSharedDKV(hd, w, bq int) uint32 {
	return uint32(2*(2*16*w*(hd+8)+2*2*bq*(hd+8)) + 4*2*2*bq)
}

// mmaSharedFused is mmaSharedDKV plus the block's dS tile, 16 * w keys by bq + 8 bf16.
func mmaSharedFused(hd, w, bq int) uint32 { return mmaSharedDKV(hd, w, bq) + uint32(2*16*w*(bq+8)) }

// useMMA reports whether the tensor-core kernels apply: bf16 tensors, head dim 64 or 128 and
// every pointer 16-byte aligned (they load 16 bytes at a time).
// If attention_tc.cu cannot be built for this device, the kernels of attention.cu are used and
// the reason is logged once (MMAError returns it).
func (b *Backend) useMMA(g attnGeom, extra ...uintptr) bool {
	if !b.attnMMA || g.dt != int32(tensor.BF16) || (g.HD != 64 && g.HD != 128) {
		return false
	}
	for _, p := range append([]uintptr{g.pq, g.pk, g.pv}, extra...) {
		if p%16 != 0 {
			return false
		}
	}
	b.mmaOnce.Do(func() {
		b.mmaErr = b.d.Do(func() error {
			_, err := b.d.function("attention_tc.cu", b.tiles(g.HD).fwdName(g.HD))
			return err
		})
		if b.mmaErr != nil {
			slog.Warn("cuda: tensor-core attention unavailable; using the SIMT kernels", "device", b.Name(), "error", b.mmaErr)
		}
	})
	return b.mmaErr == nil
}

// useWG reports whether the Hopper warpgroup kernels (attention_wg.cu) run: on sm_90 devices
// unless HALO_CUDA_ATTENTION=mma, once they have compiled; if they cannot be built, the mma.sync
// kernels of attention_tc.cu are used and the reason is logged once (WGError returns it). The
// caller has checked useMMA.
func (b *Backend) useWG() bool {
	if !b.attnWG {
		return false
	}
	b.wgOnce.Do(func() {
		b.wgErr = b.d.Do(func() error {
			_, err := b.d.function(wgKernelFile, b.wgPick("fwd", 64).Name())
			return err
		})
		if b.wgErr != nil {
			slog.Warn("cuda: Hopper attention kernels unavailable; using the mma.sync kernels", "device", b.Name(), "error", b.wgErr)
		}
	})
	return b.wgErr == nil
}

// WGError is why the Hopper attention kernels could not be built (nil when they were, have not
// been needed yet, or do not apply to this device).
func (b *Backend) WGError() error { return b.wgErr }

// wgKernel is one compiled kernel of attention_wg.cu: kind "fwd", "dq" or "dkv", head dim, keys
// per tile (the forward's BK; 64 elsewhere) and the blocks per multiprocessor its register budget
// is compiled for (1: no cap).
type wgKernel struct {
	Kind           string
	HD, BK, Blocks int
}

// Name is the kernel's entry point.
func (k wgKernel) Name() string {
	if k.Kind == "fwd" {
		return fmt.Sprintf("attn_fwd_wg_%d", k.HD) + k.suffix()
	}
	return fmt.Sprintf("attn_bwd_%s_wg_%d", k.Kind, k.HD) + k.suffix()
}

// suffix is the part of the name after the head dim (the SUF argument of its WG_* line):
// _k<BK> for a forward with other than 64-key tiles, _b<Blocks> for a register cap.
func (k wgKernel) suffix() string {
	s := ""
	if k.Kind == "fwd" && k.BK != wgRows {
		s += fmt.Sprintf("_k%d", k.BK)
	}
	if k.Blocks > 1 {
		s += fmt.Sprintf("_b%d", k.Blocks)
	}
	return s
}

// Shared is the kernel's dynamic shared memory: 64-row bf16 tiles (one of Q and two buffers each
// of BK-row K and V tiles in the forward; Q and dO, and two buffers each of K and V for dQ; K and
// V, two buffers each of Q and dO, and two buffers of 64 lse and D values for dK/dV), plus 1024
// bytes to align the tiles to the 1024-byte boundaries wgmma's swizzle needs.
func (k wgKernel) Shared() uint32 {
	tile := wgRows * k.HD * 2
	switch k.Kind {
	case "fwd":
		return uint32(1024 + tile + 4*k.BK*k.HD*2)
	case "dq":
		return uint32(1024 + 6*tile)
	default:
		return uint32(1024 + 6*tile + 4*wgRows*4)
	}
}

// wgKernels lists the compiled kernels (the WG_* instantiations of attention_wg.cu).
// wgDefault holds the one each (kind, head dim) runs, chosen from TestGPUAttentionWGSweep on an
// H200 at 4 x 4096 tokens (testdata/README.md: gpu-run13, gpu-run18): at head dim 64 the
// forward and dQ capped for 4 blocks per multiprocessor and dK/dV capped for 3. The other forms
// stay compiled for the sweep. The capped dQ fits 128 registers without spilling since its
// copies use wg_copier (before, it spilled and was slower). Every kernel multiplies the block's
// fixed operand (Q in the forward; Q and dO in dQ; K and V in dK/dV) from its shared tile:
// taking it from registers was slower in each (gpu-run16), so shared-memory bandwidth is not
// what bounds them.
var (
	wgKernels = []wgKernel{
		{"fwd", 64, 64, 1}, {"fwd", 128, 64, 1}, {"fwd", 64, 128, 1}, {"fwd", 64, 64, 4}, {"fwd", 64, 128, 3},
		{"dq", 64, 64, 1}, {"dq", 128, 64, 1}, {"dq", 64, 64, 4},
		{"dkv", 64, 64, 1}, {"dkv", 128, 64, 1}, {"dkv", 64, 64, 3},
	}
	wgDefault = map[string]wgKernel{
		"fwd/64": {"fwd", 64, 64, 4}, "fwd/128": {"fwd", 128, 64, 1},
		"dq/64": {"dq", 64, 64, 4}, "dq/128": {"dq", 128, 64, 1},
		"dkv/64": {"dkv", 64, 64, 3}, "dkv/128": {"dkv", 128, 64, 1},
	}
)

// wgPick is the kernel of kind for head dim hd: the backend's override when set, else the
// default.
func (b *Backend) wgPick(kind string, hd int) wgKernel {
	key := fmt.Sprintf("%s/%d", kind, hd)
	if k, ok := b.attnOverride.wg[key]; ok {
		return k
	}
	return wgDefault[key]
}

// wgRows is the rows a block of attention_wg.cu owns (one warpgroup, 16 rows per warp), and the
// rows of its Q, dO, dQ-side K/V and dK/dV-side Q/dO tiles.
const wgRows = 64

// MMAError is why the tensor-core attention kernels could not be built (nil when they were, or
// have not been needed yet).
func (b *Backend) MMAError() error { return b.mmaErr }

// checkCuSeqlens checks 0 = cu[0] <= ... <= cu[D] = n. Boundaries uploaded from the host are
// checked against the host copy kept at upload (no synchronisation); others are downloaded.
func (b *Backend) checkCuSeqlens(op, name string, p uintptr, D, n int) ([]int32, error) {
	cu, ok := b.hostInt32(p, D+1)
	if !ok {
		cu = make([]int32, D+1)
		err := b.d.Do(func() error {
			if err := b.d.syncOnThread(); err != nil {
				return err
			}
			return b.d.drv.check("cuMemcpyDtoH_v2", b.d.drv.cuMemcpyDtoH(unsafe.Pointer(&cu[0]), p, uint64(4*(D+1))))
		})
		if err != nil {
			return nil, err
		}
	}
	if cu[0] != 0 || int(cu[D]) != n {
		return nil, fmt.Errorf("cuda: %s: %s must start at 0 and end at %d, got %d and %d", op, name, n, cu[0], cu[D])
	}
	for i := 1; i <= D; i++ {
		if cu[i] < cu[i-1] {
			return nil, fmt.Errorf("cuda: %s: %s[%d] = %d is below %s[%d] = %d", op, name, i, cu[i], name, i-1, cu[i-1])
		}
	}
	return cu, nil
}

// Attention runs causal GQA attention over packed documents.
func (b *Backend) Attention(a backend.AttentionArgs) error {
	const op = "Attention"
	g, err := b.attnGeometry(op, a.AttentionShape, a.Q, a.K, a.V)
	if err != nil {
		return err
	}
	if a.Out.Numel() != a.Q.Numel() || a.Out.DType() != a.Q.DType() {
		return fmt.Errorf("cuda: %s: Out %v must match Q %v", op, a.Out, a.Q)
	}
	if !a.LSE.IsNil() && (a.LSE.DType() != tensor.F32 || a.LSE.Numel() != g.N*g.NH) {
		return fmt.Errorf("cuda: %s: LSE %v must be f32 [%d, %d]", op, a.LSE, g.N, g.NH)
	}
	arg := b.args(op)
	po, pl := arg.ptr("Out", a.Out), arg.opt("LSE", a.LSE)
	if err := arg.err(); err != nil {
		return err
	}
	if g.N == 0 {
		return nil
	}
	if b.useMMA(g, po) {
		args := packArgs(po, pl, g.pq, g.pk, g.pv, g.cuQ, g.cuK, int32(g.D), int64(g.N), int32(g.NH), int32(g.NKV), g.scale, g.window)
		if b.useWG() {
			grid := [3]uint32{uint32((g.N + wgRows - 1) / wgRows * g.NH), 1, 1}
			return b.d.Post(func() error {
				order, err := b.attnOrderOnThread(g.cu, int(g.window), false)
				if err != nil {
					return err
				}
				k := b.wgPick("fwd", g.HD)
				return b.d.launchOnThread(wgKernelFile, k.Name(), grid, [3]uint32{128, 1, 1}, k.Shared(), append(args, packArgs(order)...)...)
			})
		}
		t := b.tiles(g.HD)
		if err := checkTiles(g.HD, t); err != nil {
			return err
		}
		rows := 16 * t.FwdW * t.FwdMT
		grid := [3]uint32{uint32((g.N + rows - 1) / rows), uint32(g.NH), 1}
		shared := mmaSharedFwd(g.HD, t.FwdW, t.FwdMT, t.FwdBK)
		return b.d.Post(func() error {
			return b.d.launchOnThread("attention_tc.cu", t.fwdName(g.HD), grid, [3]uint32{uint32(32 * t.FwdW), 1, 1}, shared, args...)
		})
	}
	args := packArgs(po, pl, g.pq, g.pk, g.pv, g.dt, g.cuQ, g.cuK, int32(g.D), int64(g.N), int32(g.NH), int32(g.NKV), int32(g.HD), g.scale, g.window)
	grid := [3]uint32{uint32((g.N + attnRows - 1) / attnRows), uint32(g.NH), 1}
	return b.d.Post(func() error {
		return b.d.launchOnThread("attention.cu", g.simt.fwd, grid, [3]uint32{32 * attnRows, 1, 1}, g.simt.sharedFwd, args...)
	})
}

// AttentionBackward computes dQ, dK and dV.
func (b *Backend) AttentionBackward(a backend.AttentionBackwardArgs) error {
	const op = "AttentionBackward"
	g, err := b.attnGeometry(op, a.AttentionShape, a.Q, a.K, a.V)
	if err != nil {
		return err
	}
	if g.hasSeparateCK || g.Nk != g.N {
		return errors.New("cuda: AttentionBackward: separate key boundaries (CuSeqlensK) are not supported in backward")
	}
	for name, t := range map[string]T{"DQ": a.DQ, "DOut": a.DOut, "Out": a.Out} {
		if t.Numel() != a.Q.Numel() || t.DType() != a.Q.DType() {
			return fmt.Errorf("cuda: %s: %s %v must match Q %v", op, name, t, a.Q)
		}
	}
	for name, t := range map[string]T{"DK": a.DK, "DV": a.DV} {
		if t.Numel() != a.K.Numel() || t.DType() != a.K.DType() {
			return fmt.Errorf("cuda: %s: %s %v must match K %v", op, name, t, a.K)
		}
	}
	if a.LSE.DType() != tensor.F32 || a.LSE.Numel() != g.N*g.NH {
		return fmt.Errorf("cuda: %s: LSE %v must be f32 [%d, %d]", op, a.LSE, g.N, g.NH)
	}
	arg := b.args(op)
	ptrs := map[string]uintptr{"DQ": arg.ptr("DQ", a.DQ), "DK": arg.ptr("DK", a.DK), "DV": arg.ptr("DV", a.DV),
		"DOut": arg.ptr("DOut", a.DOut), "Out": arg.ptr("Out", a.Out), "LSE": arg.ptr("LSE", a.LSE)}
	if err := arg.err(); err != nil {
		return err
	}
	if g.N == 0 {
		return nil
	}
	mma := b.useMMA(g, ptrs["DQ"], ptrs["DK"], ptrs["DV"], ptrs["DOut"], ptrs["Out"])
	wg := mma && !b.attnFused && b.useWG()
	return b.d.Post(func() error {
		if wg {
			return b.wgBackwardOnThread(g, ptrs)
		}
		dvec, err := b.d.allocOnThread(uint64(4 * g.N * g.NH))
		if err != nil {
			return err
		}
		defer b.d.alloc.Free(dvec.ptr)
		warps := int64(g.N) * int64(g.NH)
		if err := b.d.launchOnThread("attention.cu", "attn_bwd_dot", [3]uint32{uint32((warps*32 + 255) / 256), 1, 1}, [3]uint32{256, 1, 1}, 0,
			packArgs(dvec.ptr, ptrs["DOut"], ptrs["Out"], g.dt, int64(g.N), int32(g.NH), int32(g.HD))...); err != nil {
			return err
		}
		if mma {
			common := []any{g.pq, g.pk, g.pv, ptrs["DOut"], ptrs["LSE"], dvec.ptr, g.cuQ, int32(g.D), int64(g.N), int32(g.NH), int32(g.NKV), g.scale, g.window}
			t := b.tiles(g.HD)
			if err := checkTiles(g.HD, t); err != nil {
				return err
			}
			if b.attnFused && b.attnOverride.bwdOnly == "" && fusedCompiled(g.HD, t) {
				return b.fusedBackwardOnThread(g, t, ptrs, common)
			}
			if b.attnOverride.bwdOnly != "dkv" {
				rows := 16 * t.DQW
				grid := [3]uint32{uint32((g.N + rows - 1) / rows), uint32(g.NH), 1}
				if err := b.d.launchOnThread("attention_tc.cu", t.dqName(g.HD), grid, [3]uint32{uint32(32 * t.DQW), 1, 1},
					mmaSharedDQ(g.HD, t.DQBK), packArgs(append([]any{ptrs["DQ"]}, common...)...)...); err != nil {
					return err
				}
			}
			if b.attnOverride.bwdOnly == "dq" {
				return nil
			}
			rows := 16 * t.DKVW
			grid := [3]uint32{uint32((g.N + rows - 1) / rows), uint32(g.NKV), 1}
			return b.d.launchOnThread("attention_tc.cu", t.dkvName(g.HD), grid, [3]uint32{uint32(32 * t.DKVW), 1, 1},
				mmaSharedDKV(g.HD, t.DKVW, t.DKVBQ), packArgs(append([]any{ptrs["DK"], ptrs["DV"]}, common...)...)...)
		}
		rows := uint32((g.N + attnRows - 1) / attnRows)
		if err := b.d.launchOnThread("attention.cu", g.simt.dq, [3]uint32{rows, uint32(g.NH), 1}, [3]uint32{32 * attnRows, 1, 1}, g.simt.sharedDQ,
			packArgs(ptrs["DQ"], g.pq, g.pk, g.pv, ptrs["DOut"], g.dt, ptrs["LSE"], dvec.ptr, g.cuQ, int32(g.D), int64(g.N),
				int32(g.NH), int32(g.NKV), int32(g.HD), g.scale, g.window)...); err != nil {
			return err
		}
		return b.d.launchOnThread("attention.cu", g.simt.dkv, [3]uint32{rows, uint32(g.NKV), 1}, [3]uint32{32 * attnRows, 1, 1}, g.simt.sharedDKV,
			packArgs(ptrs["DK"], ptrs["DV"], g.pq, g.pk, g.pv, ptrs["DOut"], g.dt, ptrs["LSE"], dvec.ptr, g.cuQ, int32(g.D), int64(g.N),
				int32(g.NH), int32(g.NKV), int32(g.HD), g.scale, g.window)...)
	})
}

// wgBackwardOnThread runs the Hopper dQ and dK/dV kernels (attention_wg.cu) after the pass that
// writes their per-row terms (dl). attnOverride.bwdOnly runs a part, for timing: "dl" (the pass
// alone), "dq" or "dkv" (each after the pass). The pass is separate because computing the terms
// in the dQ kernel instead, while its tiles copy, was slower (testdata/README.md, gpu-run18).
func (b *Backend) wgBackwardOnThread(g attnGeom, ptrs map[string]uintptr) error {
	dl, err := b.d.allocOnThread(uint64(8 * g.N * g.NH))
	if err != nil {
		return err
	}
	defer b.d.alloc.Free(dl.ptr) // freed after the kernels: later work is on the same stream
	rowsPerBlock := 256 / (g.HD / 8)
	if err := b.d.launchOnThread(wgKernelFile, fmt.Sprintf("attn_bwd_dl_wg_%d", g.HD),
		[3]uint32{uint32((g.N + rowsPerBlock - 1) / rowsPerBlock), uint32(g.NH), 1}, [3]uint32{256, 1, 1}, 0,
		packArgs(dl.ptr, ptrs["DOut"], ptrs["Out"], ptrs["LSE"], int64(g.N), int32(g.NH))...); err != nil {
		return err
	}
	if b.attnOverride.bwdOnly == "dl" {
		return nil
	}
	common := []any{g.pq, g.pk, g.pv, ptrs["DOut"], dl.ptr, g.cuQ, int32(g.D), int64(g.N), int32(g.NH), int32(g.NKV), g.scale, g.window}
	blocks := (g.N + wgRows - 1) / wgRows
	if b.attnOverride.bwdOnly != "dkv" {
		order, err := b.attnOrderOnThread(g.cu, int(g.window), false)
		if err != nil {
			return err
		}
		k := b.wgPick("dq", g.HD)
		if err := b.d.launchOnThread(wgKernelFile, k.Name(), [3]uint32{uint32(blocks * g.NH), 1, 1}, [3]uint32{128, 1, 1},
			k.Shared(), packArgs(append(append([]any{ptrs["DQ"]}, common...), order)...)...); err != nil {
			return err
		}
	}
	if b.attnOverride.bwdOnly == "dq" {
		return nil
	}
	order, err := b.attnOrderOnThread(g.cu, int(g.window), true)
	if err != nil {
		return err
	}
	k := b.wgPick("dkv", g.HD)
	return b.d.launchOnThread(wgKernelFile, k.Name(), [3]uint32{uint32(blocks * g.NKV), 1, 1}, [3]uint32{128, 1, 1},
		k.Shared(), packArgs(append(append([]any{ptrs["DK"], ptrs["DV"]}, common...), order)...)...)
}

// fusedBackwardOnThread runs the one-pass backward (attention_fused.cu): dK and dV as the dK/dV
// kernel writes them, dQ accumulated in fp32 with atomic adds and then rounded into DQ.
func (b *Backend) fusedBackwardOnThread(g attnGeom, t attnTiles, ptrs map[string]uintptr, common []any) error {
	n := int64(g.N) * int64(g.NH) * int64(g.HD)
	acc, err := b.d.allocOnThread(uint64(4 * n))
	if err != nil {
		return err
	}
	defer b.d.alloc.Free(acc.ptr) // freed after the kernels: later work is on the same stream
	if err := b.d.drv.check("cuMemsetD8Async", b.d.drv.cuMemsetD8Async(acc.ptr, 0, uint64(4*n), b.d.stream)); err != nil {
		return err
	}
	rows := 16 * t.DKVW
	grid := [3]uint32{uint32((g.N + rows - 1) / rows), uint32(g.NKV), 1}
	if err := b.d.launchOnThread("attention_fused.cu", t.fusedName(g.HD), grid, [3]uint32{uint32(32 * t.DKVW), 1, 1},
		mmaSharedFused(g.HD, t.DKVW, t.DKVBQ), packArgs(append([]any{ptrs["DK"], ptrs["DV"], acc.ptr}, common...)...)...); err != nil {
		return err
	}
	return b.d.launchOnThread("attention_fused.cu", "attn_dq_from_acc", grid1D(n, b.d.info.SMs), [3]uint32{256, 1, 1}, 0,
		packArgs(ptrs["DQ"], acc.ptr, g.scale, n)...)
}
