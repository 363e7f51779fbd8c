package cuda

import (
	"errors"
	"fmt"
	"math"
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

// Backend implements backend.Backend (with every backend.Optional capability, fused.go) on one GPU.
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
	// backendOptions are the implementation choices it was made with (optionsFromSwitches); the
	// GPU tests change them on their backend to compare and time the alternatives.
	backendOptions
	wgOnce  sync.Once
	wgErr   error
	mmaOnce sync.Once
	mmaErr  error
	// scratch holds small per-op device buffers that live as long as the backend.
	flag *Buffer // one int32 for bad-index reports
	// i32 keeps host summaries of uploaded index tensors (host_int32.go).
	i32 i32Records
	// staging is the pinned ring for asynchronous uploads (host_staging.go); device goroutine only.
	staging hostStaging
	// attnOrders caches the Hopper attention kernels' block orders on the device, by
	// attnOrderKey (attention_order.go); device goroutine only.
	attnOrders map[uint64]*Buffer
	// marks are the timing events of backend.DeviceTimer (timer.go).
	marks     markPool
	closeOnce sync.Once
}

var (
	_ backend.Backend = (*Backend)(nil)
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
	o, err := optionsFromSwitches(d.info.KernelArch)
	if err != nil {
		flag.Free()
		d.Close()
		return nil, err
	}
	return &Backend{d: d, flag: flag, backendOptions: o}, nil
}

// backendOptions are the implementation choices of a Backend. Each alternative computes the
// same result within the tolerance its GPU test states; the defaults were chosen from
// measurements on an H200 (testdata/README.md).
type backendOptions struct {
	// attnMMA selects the tensor-core attention kernels where they apply (bf16, head dim 64 or
	// 128, 16-byte aligned tensors); HALO_CUDA_ATTENTION=simt turns them off.
	attnMMA bool
	// attnWG selects, among those, the Hopper warpgroup kernels (attention_wg.cu, wgmma) on sm_90
	// devices; HALO_CUDA_ATTENTION=mma keeps the mma.sync kernels of attention_tc.cu.
	attnWG bool
	// attnFused runs the mma.sync backward as one pass that accumulates dQ with atomic adds
	// (attention_fused.cu) instead of a dQ and a dK/dV kernel; HALO_CUDA_ATTN_BWD=fused turns it
	// on. dq is then not bit-for-bit reproducible from run to run. It is off by default because
	// it is slower than the two kernels on an H200 (testdata/README.md, gpu-run9): the atomic
	// adds cost more than the recomputed products they replace.
	attnFused bool
	// noSplitK turns off split-K weight gradients (HALO_CUDA_GEMM_SPLITK=off). gemmFoldBeta
	// (HALO_CUDA_GEMM_BETA=fold) makes accumulating GEMMs into bf16 round once, through an fp32
	// product folded in by ew_fold_parts (gemmFolded); by default cuBLASLt adds Beta·C itself,
	// which rounds the product to bf16 first (TestGPUGemmBetaRoundsOnce measures both).
	noSplitK, gemmFoldBeta bool
	// emptyUncleared makes Empty skip the zero fill (the default; HALO_CUDA_EMPTY=cleared turns
	// it off).
	emptyUncleared bool
	// moeKernels makes Optional offer the MoE routing, permutation, combine and packed SwiGLU
	// ops (unless HALO_CUDA_MOE_KERNELS=off); without them engine/nn runs MoE blocks as the routed
	// composition. The methods themselves are always there, for their GPU tests.
	moeKernels bool
	// groupedWG names the Hopper warpgroup-MMA variant (a key of groupedWGVariants) that runs
	// the grouped expert GEMMs, or "auto" for each kind's of groupedWGAuto (sm_90's default);
	// empty runs them on the mma.sync kernels.
	groupedWG string
	// normBwd sizes the vectorised RMSNorm backward (rmsnorm.go).
	normBwd normBwdOptions
	// attnOverride replaces the attention kernels' measured choices (attention.go); the zero
	// value, which New sets, keeps them.
	attnOverride attnOverrides
}

// defaultBackendOptions are the choices with every switch unset, on a device of architecture
// arch ("sm_90").
func defaultBackendOptions(arch string) backendOptions {
	return backendOptions{attnMMA: true, attnWG: wgArch(arch), emptyUncleared: true, moeKernels: true, groupedWG: defaultGroupedWG(arch), normBwd: defaultNormBwdOptions()}
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
