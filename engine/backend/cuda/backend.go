package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func init() {
	backend.Register("cuda", func(index int) (backend.Backend, error) { return New(index) })
}

// T is a tensor view.
type T = tensor.Tensor

// Backend implements backend.Backend (and backend.AddRMSNormer, backend.AdamWStepper) on one GPU.
// Float tensors may be F32 or BF16 (F16 is refused with an error naming the op); GEMMs need both
// operands in the same dtype. Every method submits its work to the device goroutine and returns
// once it is enqueued; Sync, Download and SumSquares wait for it. Nothing else makes the host wait
// for the GPU (Syncs counts the waits, by op): uploads of up to 1 MiB are queued through pinned
// memory, and index tensors that came in through Upload are validated (Embedding,
// CrossEntropy, attention's boundaries) and sorted (EmbeddingBackward) from a host copy
// (host_int32.go). Index tensors written on the device are checked there instead, at the cost of
// a wait.
type Backend struct {
	d *Device
	// attnMMA selects the tensor-core attention kernels where they apply (bf16, head dim 64 or
	// 128, 16-byte aligned tensors); HALO_CUDA_ATTENTION=simt turns them off.
	attnMMA bool
	// attnWG selects, among those, the Hopper warpgroup kernels (attention_wg.cu, wgmma) on sm_90
	// devices; HALO_CUDA_ATTENTION=mma keeps the mma.sync kernels of attention_tc.cu.
	attnWG bool
	wgOnce sync.Once
	wgErr  error
	// attnFused runs the tensor-core backward as one pass that accumulates dQ with atomic adds
	// (attention_fused.cu) instead of a dQ and a dK/dV kernel; HALO_CUDA_ATTN_BWD=fused turns it
	// on. dq is then not bit-for-bit reproducible from run to run. On an H200 it was slower than
	// the two kernels (Qwen3-0.6B shape 5.0 against 3.9 ms, testdata/gpu-run9): the atomic adds
	// cost more than the recomputed products they replace, so it stays off by default.
	attnFused bool
	mmaOnce   sync.Once
	mmaErr    error
	// scratch holds small per-op device buffers that live as long as the backend.
	flag *Buffer // one int32 for bad-index reports
	// i32 keeps host summaries of uploaded index tensors (host_int32.go).
	i32 i32Records
	// staging is the pinned ring for asynchronous uploads (host_staging.go); device goroutine only.
	staging hostStaging
	// noSplitK turns off split-K weight gradients (HALO_CUDA_GEMM_SPLITK=off). gemmFoldBeta
	// (HALO_CUDA_GEMM_BETA=fold) makes accumulating GEMMs into bf16 round once, through an fp32
	// product folded in by ew_fold_parts (gemmFolded); by default cuBLASLt adds Beta·C itself,
	// which rounds the product to bf16 first (TestGPUGemmBetaRoundsOnce measures both).
	noSplitK, gemmFoldBeta bool
	// emptyUncleared makes Empty skip the zero fill (the default; HALO_CUDA_EMPTY=cleared turns
	// it off).
	emptyUncleared bool
	// attnOrders caches the Hopper attention kernels' block orders on the device, by
	// attnOrderKey (attention_order.go); device goroutine only.
	attnOrders map[uint64]*Buffer
	// marks are the timing events of backend.DeviceTimer (timer.go).
	marks     markPool
	closeOnce sync.Once
}

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.AddRMSNormer = (*Backend)(nil)
	_ backend.AdamWStepper = (*Backend)(nil)
)

// New opens GPU index as a backend.
func New(index int) (*Backend, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	d, err := Open(index)
	if err != nil {
		return nil, err
	}
	flag, err := d.Alloc(64)
	if err != nil {
		d.Close()
		return nil, err
	}
	mode := os.Getenv("HALO_CUDA_ATTENTION")
	return &Backend{d: d, flag: flag, attnMMA: mode != "simt", attnWG: mode != "simt" && mode != "mma" && wgArch(d.info.Arch),
		attnFused: os.Getenv("HALO_CUDA_ATTN_BWD") == "fused", emptyUncleared: os.Getenv("HALO_CUDA_EMPTY") != "cleared",
		noSplitK: os.Getenv("HALO_CUDA_GEMM_SPLITK") == "off", gemmFoldBeta: os.Getenv("HALO_CUDA_GEMM_BETA") == "fold"}, nil
}

// Device returns the underlying device (for diagnostics and events).
func (b *Backend) Device() *Device { return b.d }

// Name is "cuda:N".
func (b *Backend) Name() string { return fmt.Sprintf("cuda:%d", b.d.info.Ordinal) }

// Sync waits for all enqueued work.
func (b *Backend) Sync() error { return b.d.Synchronize() }

// Close releases the pinned upload ring and the device. Later calls do nothing.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		err = errors.Join(b.d.Do(b.closeStagingOnThread), b.d.Do(b.destroyMarksOnThread), b.d.Close())
	})
	return err
}

// ---- memory ----

// Empty returns a tensor whose contents are undefined until written: the block comes from the
// allocator without the posted zero fill. HALO_CUDA_EMPTY=cleared makes it Alloc (zero-filled),
// for comparing against.
func (b *Backend) Empty(dt tensor.DType, shape ...int) (T, error) {
	if !b.emptyUncleared {
		return b.Alloc(dt, shape...)
	}
	if !dt.Valid() {
		return T{}, fmt.Errorf("cuda: Empty: invalid dtype %s", dt)
	}
	return b.allocScratch(dt, shape...)
}

// Alloc returns a zero-filled tensor.
func (b *Backend) Alloc(dt tensor.DType, shape ...int) (T, error) {
	if !dt.Valid() {
		return T{}, fmt.Errorf("cuda: Alloc: invalid dtype %s", dt)
	}
	s := tensor.Shape(shape)
	if err := s.Check(); err != nil {
		return T{}, fmt.Errorf("cuda: Alloc %s%v: %w", dt, shape, err)
	}
	n := uint64(s.Numel()) * uint64(dt.Size())
	if n == 0 {
		n = 1 // a valid, empty tensor still needs a distinct buffer
	}
	buf, err := b.d.Alloc(n) // a cached block needs no trip to the device goroutine
	if err != nil {
		return T{}, fmt.Errorf("cuda: Alloc %s%v: %w", dt, shape, err)
	}
	p := buf.ptr
	if err := b.d.Post(func() error {
		return b.d.drv.check("cuMemsetD8Async", b.d.drv.cuMemsetD8Async(p, 0, n, b.d.stream))
	}); err != nil {
		_ = b.d.alloc.Free(p) // the fill was not queued: nothing uses the block
		return T{}, err
	}
	buf.bytes = uint64(s.Numel()) * uint64(dt.Size())
	if buf.bytes == 0 {
		buf.bytes = 1
	}
	b.i32.invalidate(buf.ptr, buf.bytes) // recycled memory: whatever was recorded there is gone
	return tensor.New(buf, 0, dt, shape...)
}

// allocScratch is Alloc without the zero fill, for buffers the next operation overwrites.
func (b *Backend) allocScratch(dt tensor.DType, shape ...int) (T, error) {
	s := tensor.Shape(shape)
	if err := s.Check(); err != nil {
		return T{}, fmt.Errorf("cuda: scratch %s%v: %w", dt, shape, err)
	}
	n := max(uint64(s.Numel())*uint64(dt.Size()), 1)
	buf, err := b.d.Alloc(n)
	if err != nil {
		return T{}, fmt.Errorf("cuda: scratch %s%v: %w", dt, shape, err)
	}
	b.i32.invalidate(buf.ptr, buf.bytes)
	return tensor.New(buf, 0, dt, shape...)
}

// Free releases a tensor returned by Alloc.
func (b *Backend) Free(t T) error {
	if t.IsNil() {
		return nil
	}
	buf, ok := t.Buffer().(*Buffer)
	if !ok || buf.dev != b.d {
		return fmt.Errorf("cuda: Free %v: not a tensor of %s", t, b.Name())
	}
	if t.Offset() != 0 {
		return fmt.Errorf("cuda: Free %v: a view (offset %d) cannot be freed; free the tensor Alloc returned", t, t.Offset())
	}
	if buf.ptr == 0 {
		return fmt.Errorf("cuda: Free %v: already freed", t)
	}
	b.i32.invalidate(buf.ptr, buf.bytes)
	return buf.Free()
}

// ptr returns the device address of t's first element after checking that t lives on this GPU.
func (b *Backend) ptr(op, arg string, t T) (uintptr, error) {
	if t.IsNil() {
		return 0, fmt.Errorf("cuda: %s: %s is required", op, arg)
	}
	buf, ok := t.Buffer().(*Buffer)
	if !ok || buf.dev != b.d {
		return 0, fmt.Errorf("cuda: %s: %s %v is not on %s", op, arg, t, b.Name())
	}
	if buf.ptr == 0 {
		return 0, fmt.Errorf("cuda: %s: %s %v was freed", op, arg, t)
	}
	return buf.ptr + uintptr(t.Offset()), nil
}

// optPtr is ptr for optional arguments: 0 for the zero tensor.
func (b *Backend) optPtr(op, arg string, t T) (uintptr, error) {
	if t.IsNil() {
		return 0, nil
	}
	return b.ptr(op, arg, t)
}

// fcode is the kernel dtype code of a float tensor.
func fcode(op, arg string, t T) (int32, error) {
	switch t.DType() {
	case tensor.F32, tensor.BF16:
		return int32(t.DType()), nil
	}
	return 0, fmt.Errorf("cuda: %s: %s %v: dtype %s is not supported (use f32 or bf16)", op, arg, t, t.DType())
}

// smallUploadBytes is the largest upload that is copied on the caller's goroutine and posted.
const smallUploadBytes = 64 << 10

// Upload copies host bytes into dst, ordered after the work already queued. Uploads of up to
// 1 MiB return without waiting for the GPU (src may be reused at once); larger ones wait. Those
// of up to smallUploadBytes do not wait for the device goroutine either. The
// values of an I32 dst are remembered on the host (host_int32.go), so that ops validating or
// sorting indices need not read them back.
func (b *Backend) Upload(dst T, src []byte) error {
	p, err := b.ptr("Upload", "dst", dst)
	if err != nil {
		return err
	}
	if int64(len(src)) != dst.Bytes() {
		return fmt.Errorf("cuda: Upload: %d bytes for %v (%d bytes)", len(src), dst, dst.Bytes())
	}
	if len(src) == 0 {
		return nil
	}
	b.i32.invalidate(p, uint64(len(src)))
	if len(src) <= smallUploadBytes {
		// Small uploads (a batch's indices, an expert's routing) are copied here and posted:
		// the caller may reuse src at once and does not wait for the device goroutine.
		own := append([]byte(nil), src...)
		err = b.d.Post(func() error { return b.uploadOnThread(p, own) })
	} else {
		err = b.d.Do(func() error { return b.uploadOnThread(p, src) })
	}
	if err != nil {
		return err
	}
	if dst.DType() == tensor.I32 {
		b.i32.record(p, decodeInt32(src))
	}
	return nil
}

// Download copies src to host bytes after all preceding work.
func (b *Backend) Download(dst []byte, src T) error {
	p, err := b.ptr("Download", "src", src)
	if err != nil {
		return err
	}
	if int64(len(dst)) != src.Bytes() {
		return fmt.Errorf("cuda: Download: %d bytes for %v (%d bytes)", len(dst), src, src.Bytes())
	}
	if len(dst) == 0 {
		return nil
	}
	return b.d.Do(func() error {
		if err := b.d.syncOnThread(); err != nil {
			return err
		}
		return b.d.drv.check("cuMemcpyDtoH_v2", b.d.drv.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), p, uint64(len(dst))))
	})
}

// Copy copies src into dst, converting between F32 and BF16.
func (b *Backend) Copy(dst, src T) error {
	const op = "Copy"
	pd, err := b.ptr(op, "dst", dst)
	if err != nil {
		return err
	}
	ps, err := b.ptr(op, "src", src)
	if err != nil {
		return err
	}
	if dst.Numel() != src.Numel() {
		return fmt.Errorf("cuda: Copy: dst %v and src %v differ in element count", dst, src)
	}
	b.i32.invalidate(pd, uint64(dst.Bytes()))
	if dst.DType() == src.DType() {
		if dst.Bytes() == 0 || pd == ps {
			return nil
		}
		return b.d.Post(func() error {
			return b.d.drv.check("cuMemcpyDtoDAsync_v2", b.d.drv.cuMemcpyDtoDAsync(pd, ps, uint64(dst.Bytes()), b.d.stream))
		})
	}
	cd, err := fcode(op, "dst", dst)
	if err != nil {
		return err
	}
	cs, err := fcode(op, "src", src)
	if err != nil {
		return err
	}
	n := int64(dst.Numel())
	return b.launch1D("elementwise.cu", "ew_convert", n, pd, cd, ps, cs, n)
}

// MemStats reports the caching allocator's statistics.
func (b *Backend) MemStats() backend.MemStats {
	s := b.d.MemStats()
	return backend.MemStats{Allocated: int64(s.Allocated), Reserved: int64(s.Reserved), Peak: int64(s.PeakAllocated), Total: int64(b.d.info.TotalMem)}
}

// ResetPeak sets the peak to the current allocation.
func (b *Backend) ResetPeak() { b.d.ResetPeakMem() }

// ---- kernel launch plumbing ----

// packArgs stores each kernel argument in its own 8-byte slot and returns pointers to them.
// Accepted types: uintptr (device pointers), int32, uint32, int64, uint64, float32.
func packArgs(vals ...any) []unsafe.Pointer {
	slots := make([]uint64, len(vals))
	ptrs := make([]unsafe.Pointer, len(vals))
	for i, v := range vals {
		switch x := v.(type) {
		case uintptr:
			slots[i] = uint64(x)
		case int32:
			slots[i] = uint64(uint32(x))
		case uint32:
			slots[i] = uint64(x)
		case int64:
			slots[i] = uint64(x)
		case uint64:
			slots[i] = x
		case float32:
			slots[i] = uint64(math.Float32bits(x))
		case int:
			panic(fmt.Sprintf("cuda: kernel argument %d is a Go int; convert it to int32 or int64", i))
		default:
			panic(fmt.Sprintf("cuda: kernel argument %d has unsupported type %T", i, v))
		}
		ptrs[i] = unsafe.Pointer(&slots[i])
	}
	return ptrs
}

// launch1D runs a grid-stride kernel over n elements.
func (b *Backend) launch1D(file, name string, n int64, args ...any) error {
	if n <= 0 {
		return nil
	}
	p := packArgs(args...)
	return b.d.Post(func() error {
		return b.d.launchOnThread(file, name, grid1D(n, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, p...)
	})
}

func grid1D(n int64, sms int) [3]uint32 {
	blocks := (n + 255) / 256
	if lim := int64(max(sms, 1) * 16); blocks > lim {
		blocks = lim
	}
	return [3]uint32{uint32(blocks), 1, 1}
}

// flagPtr is the device address of the bad-index flag (0 on a backend without one).
func (b *Backend) flagPtr() uintptr {
	if b.flag == nil {
		return 0
	}
	return b.flag.ptr
}

// checkBad reads the int32 "first bad index" flag written by a kernel; it synchronises.
func (b *Backend) resetFlagOnThread(n int64) error {
	return b.d.drv.check("cuMemsetD32Async", b.d.drv.cuMemsetD32Async(b.flag.ptr, uint32(min(n, math.MaxInt32)), 1, b.d.stream))
}

func (b *Backend) readFlagOnThread() (int32, error) {
	if err := b.d.syncOnThread(); err != nil {
		return 0, err
	}
	var v int32
	err := b.d.drv.check("cuMemcpyDtoH_v2", b.d.drv.cuMemcpyDtoH(unsafe.Pointer(&v), b.flag.ptr, 4))
	return v, err
}

// vec8 says whether a kernel may move n bf16 elements 8 at a time: every tensor is bf16, n is a
// multiple of 8 and every address is 16-byte aligned.
func vec8(n int64, codes []int32, ptrs ...uintptr) bool {
	if n%8 != 0 {
		return false
	}
	for _, c := range codes {
		if c != int32(tensor.BF16) {
			return false
		}
	}
	for _, p := range ptrs {
		if p%16 != 0 {
			return false
		}
	}
	return true
}

// ---- elementwise ----

// Fill sets every element of t to v.
func (b *Backend) Fill(t T, v float32) error {
	p, err := b.ptr("Fill", "t", t)
	if err != nil {
		return err
	}
	n := uint64(t.Numel())
	if n == 0 {
		return nil
	}
	b.i32.invalidate(p, uint64(t.Bytes()))
	return b.d.Post(func() error {
		drv := b.d.drv
		switch t.DType() {
		case tensor.F32:
			return drv.check("cuMemsetD32Async", drv.cuMemsetD32Async(p, math.Float32bits(v), n, b.d.stream))
		case tensor.I32:
			return drv.check("cuMemsetD32Async", drv.cuMemsetD32Async(p, uint32(int32(v)), n, b.d.stream))
		case tensor.BF16:
			return drv.check("cuMemsetD16Async", drv.cuMemsetD16Async(p, tensor.F32ToBF16(v), n, b.d.stream))
		case tensor.F16:
			return drv.check("cuMemsetD16Async", drv.cuMemsetD16Async(p, tensor.F32ToF16(v), n, b.d.stream))
		case tensor.U8:
			return drv.check("cuMemsetD8Async", drv.cuMemsetD8Async(p, uint8(v), n, b.d.stream))
		}
		return fmt.Errorf("cuda: Fill: dtype %s is not supported", t.DType())
	})
}

// Add computes out = a + b elementwise.
func (b *Backend) Add(out, x, y T) error {
	const op = "Add"
	if out.Numel() != x.Numel() || out.Numel() != y.Numel() {
		return fmt.Errorf("cuda: Add: out %v, a %v, b %v differ in element count", out, x, y)
	}
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	pa, ca, err := b.fptr(op, "a", x)
	if err != nil {
		return err
	}
	pb, cb, err := b.fptr(op, "b", y)
	if err != nil {
		return err
	}
	n := int64(out.Numel())
	if vec8(n, []int32{co, ca, cb}, po, pa, pb) {
		return b.launch1D("elementwise.cu", "ew_add_bf16x8", n/8, po, pa, pb, n/8)
	}
	return b.launch1D("elementwise.cu", "ew_add", n, po, co, pa, ca, pb, cb, n)
}

// Axpy computes y += alpha*x.
func (b *Backend) Axpy(y T, alpha float32, x T) error {
	const op = "Axpy"
	if y.Numel() != x.Numel() {
		return fmt.Errorf("cuda: Axpy: y %v and x %v differ in element count", y, x)
	}
	py, cy, err := b.fptr(op, "y", y)
	if err != nil {
		return err
	}
	px, cx, err := b.fptr(op, "x", x)
	if err != nil {
		return err
	}
	n := int64(y.Numel())
	return b.launch1D("elementwise.cu", "ew_axpy", n, py, cy, alpha, px, cx, n)
}

// Scale computes t *= alpha.
func (b *Backend) Scale(t T, alpha float32) error {
	p, c, err := b.fptr("Scale", "t", t)
	if err != nil {
		return err
	}
	n := int64(t.Numel())
	return b.launch1D("elementwise.cu", "ew_scale", n, p, c, alpha, n)
}

// ScaleRows computes t[r,:] *= w[r] (w [R] F32).
func (b *Backend) ScaleRows(t, w T) error {
	const op = "ScaleRows"
	p, c, err := b.fptr(op, "t", t)
	if err != nil {
		return err
	}
	cols := int64(t.Shape().Last())
	if cols <= 0 {
		return fmt.Errorf("cuda: %s: t %v has no columns", op, t)
	}
	n := int64(t.Numel())
	if w.DType() != tensor.F32 || int64(w.Numel()) != n/cols {
		return fmt.Errorf("cuda: %s: w %v must be f32 with one element per row of t %v (%d)", op, w, t, n/cols)
	}
	wp, err := b.ptr(op, "w", w)
	if err != nil {
		return err
	}
	return b.launch1D("elementwise.cu", "ew_scale_rows", n, p, c, wp, cols, n)
}

// RowDot computes out[r] = sum_c a[r,c]*b[r,c] in fp32 (out [R] F32), one warp per row.
func (b *Backend) RowDot(out, x, y T) error {
	const op = "RowDot"
	xp, xc, err := b.fptr(op, "a", x)
	if err != nil {
		return err
	}
	yp, yc, err := b.fptr(op, "b", y)
	if err != nil {
		return err
	}
	if !x.Shape().Equal(y.Shape()) {
		return fmt.Errorf("cuda: %s: a %v and b %v differ in shape", op, x, y)
	}
	cols := int64(x.Shape().Last())
	if cols <= 0 {
		return fmt.Errorf("cuda: %s: a %v has no columns", op, x)
	}
	rows := int64(x.Numel()) / cols
	if out.DType() != tensor.F32 || int64(out.Numel()) != rows {
		return fmt.Errorf("cuda: %s: out %v must be f32 with one element per row of a %v (%d)", op, out, x, rows)
	}
	op2, err := b.ptr(op, "out", out)
	if err != nil {
		return err
	}
	return b.launch1D("elementwise.cu", "row_dot", rows*32, op2, xp, xc, yp, yc, rows, cols)
}

// SumSquares returns each tensor's sum of squares, accumulated in fp64 on the device.
func (b *Backend) SumSquares(ts []T) ([]float64, error) {
	out := make([]float64, len(ts))
	if len(ts) == 0 {
		return out, nil
	}
	type job struct {
		p uintptr
		c int32
		n int64
	}
	jobs := make([]job, len(ts))
	for i, t := range ts {
		p, c, err := b.fptr("SumSquares", fmt.Sprintf("ts[%d]", i), t)
		if err != nil {
			return nil, err
		}
		jobs[i] = job{p, c, int64(t.Numel())}
	}
	var acc *Buffer
	err := b.d.Do(func() error {
		var err error
		if acc, err = b.d.allocOnThread(uint64(8 * len(ts))); err != nil {
			return err
		}
		defer b.d.alloc.Free(acc.ptr)
		drv := b.d.drv
		if err := drv.check("cuMemsetD8Async", drv.cuMemsetD8Async(acc.ptr, 0, uint64(8*len(ts)), b.d.stream)); err != nil {
			return err
		}
		for i, j := range jobs {
			if j.n == 0 {
				continue
			}
			if vec8(j.n, []int32{j.c}, j.p) {
				args := packArgs(acc.ptr+uintptr(8*i), j.p, j.n/8)
				if err := b.d.launchOnThread("elementwise.cu", "sum_squares_bf16x8", grid1D(j.n/8, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...); err != nil {
					return err
				}
				continue
			}
			args := packArgs(acc.ptr+uintptr(8*i), j.p, j.c, j.n)
			if err := b.d.launchOnThread("elementwise.cu", "sum_squares", grid1D(j.n, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...); err != nil {
				return err
			}
		}
		if err := b.d.syncOnThread(); err != nil {
			return err
		}
		return drv.check("cuMemcpyDtoH_v2", drv.cuMemcpyDtoH(unsafe.Pointer(&out[0]), acc.ptr, uint64(8*len(ts))))
	})
	return out, err
}

// fptr is ptr plus the float dtype code.
func (b *Backend) fptr(op, arg string, t T) (uintptr, int32, error) {
	p, err := b.ptr(op, arg, t)
	if err != nil {
		return 0, 0, err
	}
	c, err := fcode(op, arg, t)
	return p, c, err
}

// optFptr is fptr for optional arguments.
func (b *Backend) optFptr(op, arg string, t T) (uintptr, int32, error) {
	if t.IsNil() {
		return 0, 0, nil
	}
	return b.fptr(op, arg, t)
}

func i32ptr(b *Backend, op, arg string, t T) (uintptr, error) {
	if !t.IsNil() && t.DType() != tensor.I32 {
		return 0, fmt.Errorf("cuda: %s: %s %v must be i32", op, arg, t)
	}
	return b.ptr(op, arg, t)
}

// rows2D views t as [rows, cols] with cols = its last dimension.
func rows2D(t T) (rows, cols int) {
	if t.Rank() == 0 {
		return 1, 1
	}
	cols = t.Dim(-1)
	if cols == 0 {
		return 0, 0
	}
	return t.Numel() / cols, cols
}

// ---- embedding ----

// Embedding gathers rows of weight by ids.
func (b *Backend) Embedding(out, weight, ids T) error {
	const op = "Embedding"
	if weight.Rank() != 2 {
		return fmt.Errorf("cuda: Embedding: weight %v must be [V, C]", weight)
	}
	V, C := weight.Dim(0), weight.Dim(1)
	N := ids.Numel()
	if out.Numel() != N*C {
		return fmt.Errorf("cuda: Embedding: out %v must hold [%d, %d] for ids %v and weight %v", out, N, C, ids, weight)
	}
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	pw, cw, err := b.fptr(op, "weight", weight)
	if err != nil {
		return err
	}
	pi, err := i32ptr(b, op, "ids", ids)
	if err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	total := int64(N) * int64(C)
	args := packArgs(po, co, pw, cw, pi, int64(N), int32(C), int32(V), b.flagPtr())
	// Uploaded ids are checked on the host; only ids made on the device need the flag read back.
	switch res, at, v := b.i32.checkRange(pi, N, int32(min(V, math.MaxInt32)), false); res {
	case i32Bad:
		return fmt.Errorf("cuda: Embedding: ids[%d] = %d is outside the vocabulary [0, %d)", at, v, V)
	case i32Valid:
		return b.d.Post(func() error {
			return b.d.launchOnThread("embedding.cu", "embedding_fwd", grid1D(total, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...)
		})
	}
	return b.d.Do(func() error {
		if err := b.resetFlagOnThread(int64(N)); err != nil {
			return err
		}
		if err := b.d.launchOnThread("embedding.cu", "embedding_fwd", grid1D(total, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...); err != nil {
			return err
		}
		bad, err := b.readFlagOnThread()
		if err != nil {
			return err
		}
		if int(bad) < N {
			var id int32
			_ = b.d.drv.cuMemcpyDtoH(unsafe.Pointer(&id), pi+uintptr(4*bad), 4)
			return fmt.Errorf("cuda: Embedding: ids[%d] = %d is outside the vocabulary [0, %d)", bad, id, V)
		}
		return nil
	})
}

// EmbeddingBackward scatter-adds dOut rows into dWeight, deterministically.
func (b *Backend) EmbeddingBackward(dWeight, dOut, ids T) error {
	const op = "EmbeddingBackward"
	if dWeight.Rank() != 2 {
		return fmt.Errorf("cuda: %s: dWeight %v must be [V, C]", op, dWeight)
	}
	V, C := dWeight.Dim(0), dWeight.Dim(1)
	N := ids.Numel()
	if dOut.Numel() != N*C {
		return fmt.Errorf("cuda: %s: dOut %v must hold [%d, %d]", op, dOut, N, C)
	}
	pw, cw, err := b.fptr(op, "dWeight", dWeight)
	if err != nil {
		return err
	}
	pd, cd, err := b.fptr(op, "dOut", dOut)
	if err != nil {
		return err
	}
	pi, err := i32ptr(b, op, "ids", ids)
	if err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	// Uploaded ids are sorted from their host copy here, while the device goroutine launches
	// earlier work; others are downloaded first (a wait), on the device goroutine.
	host, known := b.hostInt32(pi, N)
	var meta []byte
	var nOrder, nUniq int
	if known {
		var err error
		if meta, nOrder, nUniq, err = embeddingBackwardMeta(host, V); err != nil {
			return fmt.Errorf("cuda: %s: %w", op, err)
		}
	}
	queue := b.d.Post
	if !known {
		queue = b.d.Do
	}
	return queue(func() error {
		drv := b.d.drv
		if !known {
			if err := b.d.syncOnThread(); err != nil {
				return err
			}
			host := make([]int32, N)
			if err := drv.check("cuMemcpyDtoH_v2", drv.cuMemcpyDtoH(unsafe.Pointer(&host[0]), pi, uint64(4*N))); err != nil {
				return err
			}
			var err error
			if meta, nOrder, nUniq, err = embeddingBackwardMeta(host, V); err != nil {
				return fmt.Errorf("cuda: %s: %w", op, err)
			}
		}
		buf, err := b.d.allocOnThread(uint64(len(meta)))
		if err != nil {
			return err
		}
		defer b.d.alloc.Free(buf.ptr) // freed after the kernel: later work is on the same stream
		if err := b.uploadOnThread(buf.ptr, meta); err != nil {
			return err
		}
		pOrder := buf.ptr
		pUniq := pOrder + uintptr(4*nOrder)
		pSeg := pUniq + uintptr(4*nUniq)
		args := packArgs(pw, cw, pd, cd, pOrder, pUniq, pSeg, int32(C))
		grid := [3]uint32{uint32(nUniq), uint32((C + 127) / 128), 1}
		return b.d.launchOnThread("embedding.cu", "embedding_bwd", grid, [3]uint32{128, 1, 1}, 0, args...)
	})
}

// embeddingBackwardMeta returns what embedding_bwd reads, as little-endian int32 bytes: order
// [N] (token indices sorted by id, stably), uniq [U] (the distinct ids, ascending) and seg [U+1]
// (uniq[u]'s tokens are order[seg[u]:seg[u+1]]). An id outside [0, V) is an error naming it.
func embeddingBackwardMeta(ids []int32, V int) (meta []byte, nOrder, nUniq int, err error) {
	N := len(ids)
	keys := make([]uint64, N)
	for i, id := range ids {
		if id < 0 || int(id) >= V {
			return nil, 0, 0, fmt.Errorf("ids[%d] = %d is outside the vocabulary [0, %d)", i, id, V)
		}
		keys[i] = uint64(id)<<32 | uint64(i) // unique keys: sorting them is a stable sort by id
	}
	slices.Sort(keys)
	nUniq = 0
	for k, key := range keys {
		if k == 0 || key>>32 != keys[k-1]>>32 {
			nUniq++
		}
	}
	meta = make([]byte, 4*(N+2*nUniq+1))
	order, uniq, seg := meta[:4*N], meta[4*N:4*(N+nUniq)], meta[4*(N+nUniq):]
	u := 0
	for k, key := range keys {
		binary.LittleEndian.PutUint32(order[4*k:], uint32(key))
		if k == 0 || key>>32 != keys[k-1]>>32 {
			binary.LittleEndian.PutUint32(uniq[4*u:], uint32(key>>32))
			binary.LittleEndian.PutUint32(seg[4*u:], uint32(k))
			u++
		}
	}
	binary.LittleEndian.PutUint32(seg[4*nUniq:], uint32(N))
	return meta, N, nUniq, nil
}

// ---- matrix products ----

// gemmOperand checks a GEMM input and returns its dtype.
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
	pa, err := b.ptr(op, "A", g.A)
	if err != nil {
		return err
	}
	pb, err := b.ptr(op, "B", g.B)
	if err != nil {
		return err
	}
	pc, err := b.ptr(op, "C", g.C)
	if err != nil {
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
		// the cost of writing and re-reading that scratch (~70 us for a 16384 x 2048 output).
		if split > 1 || (g.Beta != 0 && g.C.DType() == tensor.BF16 && b.gemmFoldBeta) {
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
	ptmp, _ := b.ptr(op, "scratch", tmp)
	cc, err := fcode(op, "C", g.C)
	if err != nil {
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

// foldF32 posts y = beta·y + the sum of parts fp32 slices of y's size at pparts, rounded once
// to y's dtype (ew_fold_parts, vectorised when y, its pointer py and the slices allow).
func (b *Backend) foldF32(y T, py uintptr, cy int32, beta float32, pparts uintptr, parts int) error {
	n := int64(y.Numel())
	if n == 0 {
		return nil
	}
	name, items := "ew_fold_parts", n
	if yAlign := uintptr(4 * y.DType().Size()); n%4 == 0 && pparts%16 == 0 && py%yAlign == 0 {
		name, items = "ew_fold_parts4", n/4
	}
	args := packArgs(py, cy, beta, pparts, int32(parts), n)
	return b.d.Post(func() error {
		return b.d.launchOnThread("elementwise.cu", name, grid1D(items, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...)
	})
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
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	pb, cb, err := b.fptr(op, "bias", bias)
	if err != nil {
		return err
	}
	if M == 0 {
		return nil
	}
	// The bias is added to the fp32 product before the single rounding to out's dtype.
	acc := out
	if out.DType() != tensor.F32 {
		if acc, err = b.allocScratch(tensor.F32, M, O); err != nil { // the product overwrites it
			return err
		}
		defer b.Free(acc)
	}
	if err := b.gemm(op, gemmCall{A: x, B: w, C: acc, M: M, N: O, K: I, TransB: true, Alpha: 1}); err != nil {
		return err
	}
	pacc, _ := b.ptr(op, "acc", acc)
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
		pdb, cdb, err := b.fptr(op, "dB", a.DB)
		if err != nil {
			return err
		}
		pdy, cdy, err := b.fptr(op, "dY", a.DY)
		if err != nil {
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

// ---- normalisation ----

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

// normBwdBlocksPerSM bounds the vectorised backward's grid (blocks per SM); more blocks mean
// fewer rows per warp but more dW partial rows to add up.
var normBwdBlocksPerSM = 2

// normBwdBlocksPerSMWide is the bound for rows of more than 1024 elements, whose kernel holds a
// row's 8 vectors of x, dy and old dx per lane at once and fits one 256-thread block per SM
// (two with normBwdSharedDW).
var normBwdBlocksPerSMWide = 1

// normBwdSharedDW selects, for rows of 1024 < C <= 2048, the backward that keeps its weight-
// gradient partial sums in shared memory (rmsnorm_bwd_bf16x8_c2048s, two blocks per SM) over the
// one that keeps them in registers (one block per SM).
var normBwdSharedDW = true

// normBwdPlan is how the vectorised backward runs for rows of C elements: the kernel (its
// registers hold at most 4, or 8, vectors of 8 per lane; "" when none covers C), its grid bound
// in blocks per SM, and the dynamic shared memory its weight-gradient partial sums take.
type normBwdPlan struct {
	kernel   string
	perSM    int
	dwShared uint32
}

func normBwdVecPlan(C int) normBwdPlan {
	switch {
	case C <= 1024:
		return normBwdPlan{"rmsnorm_bwd_bf16x8_c1024", normBwdBlocksPerSM, uint32(4 * 8 * max(C, 256))}
	case C > 2048:
		return normBwdPlan{}
	case normBwdSharedDW:
		// every warp's sums, for 2048 columns
		return normBwdPlan{"rmsnorm_bwd_bf16x8_c2048s", 2 * normBwdBlocksPerSMWide, 4 * 8 * 2048}
	}
	return normBwdPlan{"rmsnorm_bwd_bf16x8_c2048", normBwdBlocksPerSMWide, uint32(4 * 8 * C)}
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
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	pr, err := b.ptr(op, "rstd", rstd)
	if err != nil {
		return err
	}
	px, cx, err := b.fptr(op, "x", x)
	if err != nil {
		return err
	}
	pw, cw, err := b.fptr(op, "w", w)
	if err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	if rpb := normVecRowsPerBlock(C); rpb > 0 && vec8(int64(C), []int32{co, cx, cw}, po, px, pw) {
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
	pro, cro, err := b.fptr(op, "residualOut", residualOut)
	if err != nil {
		return err
	}
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	pr, err := b.ptr(op, "rstd", rstd)
	if err != nil {
		return err
	}
	px, cx, err := b.fptr(op, "x", x)
	if err != nil {
		return err
	}
	pres, cres, err := b.fptr(op, "residual", residual)
	if err != nil {
		return err
	}
	pw, cw, err := b.fptr(op, "w", w)
	if err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	if rpb := normVecRowsPerBlock(C); rpb > 0 && vec8(int64(C), []int32{cro, co, cx, cres, cw}, pro, po, px, pres, pw) {
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
	pdx, cdx, err := b.fptr(op, "dX", a.DX)
	if err != nil {
		return err
	}
	pdy, cdy, err := b.fptr(op, "dY", a.DY)
	if err != nil {
		return err
	}
	px, cx, err := b.fptr(op, "x", a.X)
	if err != nil {
		return err
	}
	pw, cw, err := b.fptr(op, "w", a.W)
	if err != nil {
		return err
	}
	pr, err := b.ptr(op, "rstd", a.RStd)
	if err != nil {
		return err
	}
	pdw, cdw, err := b.optFptr(op, "dW", a.DW)
	if err != nil {
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
	rpb, plan := normVecRowsPerBlock(C), normBwdVecPlan(C)
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

// ---- rotary embedding ----

// RoPE rotates the first R dims of each head.
func (b *Backend) RoPE(out, x T, a backend.RoPEArgs) error { return b.rope("RoPE", out, x, a, 1) }

// RoPEBackward applies the transpose rotation.
func (b *Backend) RoPEBackward(dX, dY T, a backend.RoPEArgs) error {
	return b.rope("RoPEBackward", dX, dY, a, -1)
}

func (b *Backend) rope(op string, out, x T, a backend.RoPEArgs, sign float32) error {
	H, HD := a.Heads, a.HeadDim
	R := a.RotaryDim
	if R == 0 {
		R = HD
	}
	if H <= 0 || HD <= 0 || R <= 0 || R%2 != 0 || R > HD {
		return fmt.Errorf("cuda: %s: heads %d, head dim %d, rotary dim %d: need heads, head dim > 0 and an even rotary dim <= head dim", op, H, HD, R)
	}
	if x.Numel()%(H*HD) != 0 || out.Numel() != x.Numel() {
		return fmt.Errorf("cuda: %s: x %v and out %v must be [N, %d*%d]", op, x, out, H, HD)
	}
	N := x.Numel() / (H * HD)
	if a.Positions.Numel() != N {
		return fmt.Errorf("cuda: %s: positions %v must have N=%d elements", op, a.Positions, N)
	}
	if a.InvFreq.DType() != tensor.F32 || a.InvFreq.Numel() < R/2 {
		return fmt.Errorf("cuda: %s: inv_freq %v must be f32 with R/2=%d elements", op, a.InvFreq, R/2)
	}
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	px, cx, err := b.fptr(op, "x", x)
	if err != nil {
		return err
	}
	pp, err := i32ptr(b, op, "positions", a.Positions)
	if err != nil {
		return err
	}
	pf, err := b.ptr(op, "inv_freq", a.InvFreq)
	if err != nil {
		return err
	}
	s := a.AttentionScaling
	if s == 0 {
		s = 1
	}
	if R == HD && (HD/2)%4 == 0 && co == int32(tensor.BF16) && cx == int32(tensor.BF16) && po%8 == 0 && px%8 == 0 {
		return b.launch1D("rope.cu", "rope_bf16x4", int64(N)*int64(HD/8), po, px, pp, pf, int64(N), int32(H), int32(HD), s, sign)
	}
	total := int64(N) * int64(H) * int64(HD-R/2)
	return b.launch1D("rope.cu", "rope", total, po, co, px, cx, pp, pf, int64(N), int32(H), int32(HD), int32(R), s, sign)
}

// ---- MLP ----

// SwiGLU computes out = silu(gate) * up.
func (b *Backend) SwiGLU(out, gate, up T) error {
	const op = "SwiGLU"
	if out.Numel() != gate.Numel() || up.Numel() != gate.Numel() {
		return fmt.Errorf("cuda: %s: out %v, gate %v, up %v differ in element count", op, out, gate, up)
	}
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	pg, cg, err := b.fptr(op, "gate", gate)
	if err != nil {
		return err
	}
	pu, cu, err := b.fptr(op, "up", up)
	if err != nil {
		return err
	}
	n := int64(out.Numel())
	if vec8(n, []int32{co, cg, cu}, po, pg, pu) {
		return b.launch1D("swiglu.cu", "swiglu_fwd_bf16x8", n/8, po, pg, pu, n/8)
	}
	return b.launch1D("swiglu.cu", "swiglu_fwd", n, po, co, pg, cg, pu, cu, n)
}

// SwiGLUBackward computes dGate and dUp.
func (b *Backend) SwiGLUBackward(dGate, dUp, dOut, gate, up T) error {
	const op = "SwiGLUBackward"
	n := int64(gate.Numel())
	for _, t := range []T{dGate, dUp, dOut, up} {
		if int64(t.Numel()) != n {
			return fmt.Errorf("cuda: %s: dGate %v, dUp %v, dOut %v, gate %v, up %v differ in element count", op, dGate, dUp, dOut, gate, up)
		}
	}
	pdg, cdg, err := b.fptr(op, "dGate", dGate)
	if err != nil {
		return err
	}
	pdu, cdu, err := b.fptr(op, "dUp", dUp)
	if err != nil {
		return err
	}
	pdo, cdo, err := b.fptr(op, "dOut", dOut)
	if err != nil {
		return err
	}
	pg, cg, err := b.fptr(op, "gate", gate)
	if err != nil {
		return err
	}
	pu, cu, err := b.fptr(op, "up", up)
	if err != nil {
		return err
	}
	if vec8(n, []int32{cdg, cdu, cdo, cg, cu}, pdg, pdu, pdo, pg, pu) {
		return b.launch1D("swiglu.cu", "swiglu_bwd_bf16x8", n/8, pdg, pdu, pdo, pg, pu, n/8)
	}
	return b.launch1D("swiglu.cu", "swiglu_bwd", n, pdg, cdg, pdu, cdu, pdo, cdo, pg, cg, pu, cu, n)
}

// ---- AdamW ----

// AdamW runs one fused AdamW step.
func (b *Backend) AdamW(a backend.AdamWArgs) error {
	const op = "AdamW"
	n := int64(a.Param.Numel())
	for name, t := range map[string]T{"grad": a.Grad, "m": a.M, "v": a.V} {
		if int64(t.Numel()) != n {
			return fmt.Errorf("cuda: %s: %s %v must have %d elements like param %v", op, name, t, n, a.Param)
		}
	}
	if !a.Shadow.IsNil() && int64(a.Shadow.Numel()) != n {
		return fmt.Errorf("cuda: %s: shadow %v must have %d elements", op, a.Shadow, n)
	}
	if a.Step < 1 {
		return fmt.Errorf("cuda: %s: step %d must be >= 1", op, a.Step)
	}
	pp, cp, err := b.fptr(op, "param", a.Param)
	if err != nil {
		return err
	}
	pg, cg, err := b.fptr(op, "grad", a.Grad)
	if err != nil {
		return err
	}
	pm, cm, err := b.fptr(op, "m", a.M)
	if err != nil {
		return err
	}
	pv, cv, err := b.fptr(op, "v", a.V)
	if err != nil {
		return err
	}
	ps, cs, err := b.optFptr(op, "shadow", a.Shadow)
	if err != nil {
		return err
	}
	k := adamwScalarsFor(a)
	st := int32(0)
	if a.Stochastic {
		st = 1
	}
	args := []any{pp, cp, pg, cg, pm, cm, pv, cv, ps, cs, n,
		k.w1, a.Beta2, k.w2, a.Eps, k.decay, k.stepSize, k.bc2Sqrt, k.gradScale, st, a.Seed, uint64(a.Step), a.ParamIndex}
	if adamwVec4(n, [][2]uintptr{{pp, uintptr(cp)}, {pg, uintptr(cg)}, {pm, uintptr(cm)}, {pv, uintptr(cv)}, {ps, uintptr(cs)}}) {
		return b.launch1D("adamw.cu", "adamw_step4", n/4, args...)
	}
	return b.launch1D("adamw.cu", "adamw_step", n, args...)
}

// adamwVec4 says whether adamw_step4 applies: n a multiple of 4 and every (pointer, dtype code)
// pair aligned for a 4-element access (16 bytes for F32, 8 for BF16); a null pointer (no shadow)
// is fine.
func adamwVec4(n int64, ptrs [][2]uintptr) bool {
	if n%4 != 0 {
		return false
	}
	for _, p := range ptrs {
		align := uintptr(8)
		if p[1] == uintptr(tensor.F32) {
			align = 16
		}
		if p[0]%align != 0 {
			return false
		}
	}
	return true
}

// adamwScalars are the per-step constants of the AdamW update.
type adamwScalars struct {
	w1, w2, decay, stepSize, bc2Sqrt, gradScale float32
}

// adamwScalarsFor derives the constants exactly as the CPU backend does (same float64 and float32
// operations; see engine/backend/cpu/adamw.go), and lets AdamWArgs' precise fields override them,
// so that both backends run the same update from the same numbers.
func adamwScalarsFor(a backend.AdamWArgs) adamwScalars {
	k := adamwScalars{gradScale: a.GradScale}
	if k.gradScale == 0 {
		k.gradScale = 1
	}
	b1, b2 := a.Beta1, a.Beta2
	bc1 := 1 - math.Pow(float64(b1), float64(a.Step))
	bc2 := 1 - math.Pow(float64(b2), float64(a.Step))
	k.stepSize = float32(float64(a.LR) / bc1)
	k.bc2Sqrt = float32(math.Sqrt(bc2))
	k.decay = 1 - a.LR*a.WeightDecay
	k.w1, k.w2 = 1-b1, 1-b2
	for _, o := range []struct {
		dst *float32
		v   float32
	}{{&k.stepSize, a.StepSize}, {&k.bc2Sqrt, a.BC2Sqrt}, {&k.decay, a.Decay}, {&k.w1, a.Weight1}, {&k.w2, a.Weight2}} {
		if o.v != 0 {
			*o.dst = o.v
		}
	}
	return k
}

// ---- LM head + loss ----

// crossEntropyChunkBytes bounds the fp32 logits of one chunk. With backward and a bf16 weight
// the chunk's dlogits (bf16) add half as much again: at most 3 GiB of chunk buffers, which for a
// 152k vocabulary is 3328 rows.
const crossEntropyChunkBytes = 2 << 30

// crossEntropyChunkRowAlign is the row multiple of a chunk: the dWeight GEMM has K = rows, and
// cuBLASLt's tiles want K a multiple of 256.
const crossEntropyChunkRowAlign = 256

// crossEntropyChunkRows picks the rows per chunk for N tokens and vocabulary V: the chunks are as
// few as crossEntropyChunkBytes allows and as even as a multiple of 256 rows allows (16384
// tokens of a 152k vocabulary give 5 chunks of 3328 rows and a last one of 3072). It never
// exceeds N, and is at least one row.
func crossEntropyChunkRows(N, V int) int {
	if N <= 0 || V <= 0 {
		return 1
	}
	maxRows := crossEntropyChunkBytes / (4 * V)
	if maxRows >= crossEntropyChunkRowAlign {
		maxRows -= maxRows % crossEntropyChunkRowAlign
	}
	maxRows = max(maxRows, 1)
	if N <= maxRows {
		return N
	}
	chunks := (N + maxRows - 1) / maxRows
	rows := (N + chunks - 1) / chunks
	if maxRows >= crossEntropyChunkRowAlign {
		rows = (rows + crossEntropyChunkRowAlign - 1) / crossEntropyChunkRowAlign * crossEntropyChunkRowAlign
	}
	return min(rows, maxRows, N)
}

// CrossEntropy is the fused LM head and cross-entropy, chunked over tokens (crossEntropyChunkRows:
// multiples of 256 rows, at most 2 GiB of fp32 logits). Scratch memory while it runs: the chunk's
// fp32 logits, with backward its dlogits in the weight's dtype (at most 3 GiB together), and
// with a bf16 DWeight an fp32 [V, C] accumulator (0.6 GiB for a 152k x 1024 head) that is added
// to DWeight once at the end.
func (b *Backend) CrossEntropy(a backend.CrossEntropyArgs) error {
	const op = "CrossEntropy"
	if a.Weight.Rank() != 2 {
		return fmt.Errorf("cuda: %s: Weight %v must be [V, C]", op, a.Weight)
	}
	V, C := a.Weight.Dim(0), a.Weight.Dim(1)
	if a.Hidden.Rank() == 0 || a.Hidden.Dim(-1) != C {
		return fmt.Errorf("cuda: %s: Hidden %v must end in C=%d", op, a.Hidden, C)
	}
	N := a.Hidden.Numel() / C
	if a.Targets.Numel() != N {
		return fmt.Errorf("cuda: %s: Targets %v must have N=%d elements", op, a.Targets, N)
	}
	if _, err := gemmDType(op, a.Hidden, a.Weight); err != nil {
		return err
	}
	pt, err := i32ptr(b, op, "Targets", a.Targets)
	if err != nil {
		return err
	}
	var pLoss, pLP uintptr
	if !a.Loss.IsNil() {
		if a.Loss.DType() != tensor.F32 || a.Loss.Numel() != N {
			return fmt.Errorf("cuda: %s: Loss %v must be f32 [%d]", op, a.Loss, N)
		}
		if pLoss, err = b.ptr(op, "Loss", a.Loss); err != nil {
			return err
		}
	}
	if !a.LogProb.IsNil() {
		if a.LogProb.DType() != tensor.F32 || a.LogProb.Numel() != N {
			return fmt.Errorf("cuda: %s: LogProb %v must be f32 [%d]", op, a.LogProb, N)
		}
		if pLP, err = b.ptr(op, "LogProb", a.LogProb); err != nil {
			return err
		}
	}
	if !a.DHidden.IsNil() && (a.DHidden.Numel() != N*C || a.DHidden.DType() != a.Hidden.DType()) {
		return fmt.Errorf("cuda: %s: DHidden %v must match Hidden %v", op, a.DHidden, a.Hidden)
	}
	if !a.DWeight.IsNil() && a.DWeight.Numel() != V*C {
		return fmt.Errorf("cuda: %s: DWeight %v must be [%d, %d]", op, a.DWeight, V, C)
	}
	backward := !a.DHidden.IsNil() || !a.DWeight.IsNil()
	if N == 0 {
		return nil
	}
	// Uploaded targets are checked on the host; only targets made on the device need the flag.
	check, at, v := b.i32.checkRange(pt, N, int32(min(V, math.MaxInt32)), true)
	if check == i32Bad {
		return fmt.Errorf("cuda: %s: Targets[%d] = %d is outside the vocabulary [0, %d) and is not the ignore index %d", op, at, v, V, backend.IgnoreIndex)
	}
	rows := a.ChunkRows
	if rows <= 0 {
		rows = crossEntropyChunkRows(N, V)
	}
	rows = min(rows, N)
	hidden2D, err := a.Hidden.Reshape(N, C)
	if err != nil {
		return err
	}
	var dHidden2D T
	if !a.DHidden.IsNil() {
		if dHidden2D, err = a.DHidden.Reshape(N, C); err != nil {
			return err
		}
	}
	var dWeight2D, dWeightAcc T
	foldDWeight := false
	if !a.DWeight.IsNil() {
		if dWeight2D, err = a.DWeight.Reshape(V, C); err != nil {
			return err
		}
		dWeightAcc = dWeight2D
		if a.DWeight.DType() != tensor.F32 {
			// Chunks accumulate into an fp32 [V, C] buffer that is added to DWeight once at the
			// end: one rounding to DWeight's dtype, and no per-chunk conversion pass. The first
			// chunk's product overwrites it, so it needs no zero fill.
			if dWeightAcc, err = b.allocScratch(tensor.F32, V, C); err != nil {
				return err
			}
			defer b.Free(dWeightAcc)
			foldDWeight = true
		}
	}
	// Chunk buffers, overwritten by each chunk: fp32 logits, and (backward) dlogits in the
	// weight's dtype.
	logits, err := b.allocScratch(tensor.F32, rows, V)
	if err != nil {
		return err
	}
	defer b.Free(logits)
	dlogits := logits
	if backward && a.Weight.DType() != tensor.F32 {
		if dlogits, err = b.allocScratch(a.Weight.DType(), rows, V); err != nil {
			return err
		}
		defer b.Free(dlogits)
	}
	pLogits, _ := b.ptr(op, "logits", logits)
	pDL, cDL, _ := b.fptr(op, "dlogits", dlogits)
	if check == i32Unknown {
		if err := b.d.Do(func() error { return b.resetFlagOnThread(int64(N)) }); err != nil {
			return err
		}
	}
	for r0 := 0; r0 < N; r0 += rows {
		r := min(rows, N-r0)
		h, err := hidden2D.Rows(r0, r0+r)
		if err != nil {
			return err
		}
		lg, _ := logits.Rows(0, r)
		if err := b.gemm(op, gemmCall{A: h, B: a.Weight, C: lg, M: r, N: V, K: C, TransB: true, Alpha: 1}); err != nil {
			return err
		}
		var dlp uintptr
		if backward {
			dlp = pDL
		}
		args := packArgs(pLogits, pt, pLoss, pLP, dlp, cDL, a.GradScale, int64(r0), int32(V), int32(backend.IgnoreIndex), b.flagPtr())
		if err := b.d.Post(func() error {
			return b.d.launchOnThread("crossentropy.cu", "ce_rows", [3]uint32{uint32(r), 1, 1}, [3]uint32{512, 1, 1}, 0, args...)
		}); err != nil {
			return err
		}
		if !backward {
			continue
		}
		dl, _ := dlogits.Rows(0, r)
		if !dHidden2D.IsNil() {
			dh, _ := dHidden2D.Rows(r0, r0+r)
			if err := b.gemm(op, gemmCall{A: dl, B: a.Weight, C: dh, M: r, N: C, K: V, Alpha: 1}); err != nil {
				return err
			}
		}
		if !dWeightAcc.IsNil() {
			beta := float32(1)
			if foldDWeight && r0 == 0 {
				beta = 0 // the scratch accumulator starts with the first chunk's product
			}
			if err := b.gemm(op, gemmCall{A: dl, B: h, C: dWeightAcc, M: V, N: C, K: r, TransA: true, Alpha: 1, Beta: beta}); err != nil {
				return err
			}
		}
	}
	if foldDWeight {
		pdw, cdw, err := b.fptr(op, "DWeight", dWeight2D)
		if err != nil {
			return err
		}
		pacc, _ := b.ptr(op, "dWeightAcc", dWeightAcc)
		if err := b.foldF32(dWeight2D, pdw, cdw, 1, pacc, 1); err != nil {
			return err
		}
	}
	if check == i32Valid {
		return nil
	}
	var bad int32
	if err := b.d.Do(func() error {
		var err error
		bad, err = b.readFlagOnThread()
		return err
	}); err != nil {
		return err
	}
	if int(bad) < N {
		tg, _ := a.Targets.View(int(bad), 1)
		v, _ := backend.ToInt32(b, tg)
		got := int32(0)
		if len(v) == 1 {
			got = v[0]
		}
		return fmt.Errorf("cuda: %s: Targets[%d] = %d is outside the vocabulary [0, %d) and is not the ignore index %d", op, bad, got, V, backend.IgnoreIndex)
	}
	return nil
}
