package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Device is one GPU driven by a goroutine locked to its OS thread, on which the device's primary
// context is current. Every driver call for the device runs on that goroutine: public methods
// submit their work with Do and wait for it. A Device may be used from any goroutine; calls are
// serialised in submission order.
type Device struct {
	info DeviceInfo
	libs *libraries
	drv  *driverAPI
	dev  int32
	ctx  uintptr
	// emulated: the kernels are built as PTX for the older info.KernelArch (HALO_CUDA_ARCH),
	// whose limits launches are held to (arch.go).
	emulated bool
	// q carries work to the device goroutine (queue.go).
	q    *cmdQueue
	once sync.Once

	// The following are touched only on the device goroutine.
	stream  uintptr
	alloc   *cachingAllocator
	modules map[string]*module
	gemm    *gemmState
	closed  bool

	// syncs counts host waits on the device (sync_count.go); safe from any goroutine.
	syncs syncCounter
}

// Open starts the goroutine for GPU ordinal, makes its primary context current there and creates
// the device's compute stream.
func Open(ordinal int) (*Device, error) {
	l := loadLibraries()
	if l.err != nil {
		return nil, l.err
	}
	if ordinal < 0 || ordinal >= l.deviceCount {
		return nil, fmt.Errorf("cuda: device %d does not exist: the driver sees %d device(s) (ordinals 0..%d)", ordinal, l.deviceCount, l.deviceCount-1)
	}
	info, err := queryDevice(l.drv, ordinal)
	if err != nil {
		return nil, err
	}
	if info.Major < 8 {
		return nil, fmt.Errorf("cuda: device %d (%s) is %s; halo-shell's kernels need sm_80 or newer (A100, RTX 30xx/40xx, H100/H200)", ordinal, info.Name, info.Arch)
	}
	karch, emulated, err := kernelArch(info.Arch, swArch.Value())
	if err != nil {
		return nil, err
	}
	info.KernelArch = karch
	d := &Device{info: info, libs: l, drv: l.drv, modules: map[string]*module{}, emulated: emulated}
	d.q = newCmdQueue(fmt.Sprintf("device %d", ordinal), func() bool { return d.closed })
	ready := make(chan error, 1)
	go d.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Device) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(d.q.done)
	if err := d.setup(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for f := range d.q.cmds {
		f()
	}
}

func (d *Device) setup() error {
	drv := d.drv
	if err := drv.check("cuDeviceGet", drv.cuDeviceGet(&d.dev, int32(d.info.Ordinal))); err != nil {
		return err
	}
	if err := drv.check("cuDevicePrimaryCtxRetain", drv.cuPrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return err
	}
	if err := drv.check("cuCtxSetCurrent", drv.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	// A blocking stream (flags 0) is ordered with the legacy default stream, on which the
	// synchronous host-to-device copies of pageable memory finish their DMA after returning.
	const streamDefault = 0
	if err := drv.check("cuStreamCreate", drv.cuStreamCreate(&d.stream, streamDefault)); err != nil {
		return err
	}
	var free, total uint64
	if err := drv.check("cuMemGetInfo_v2", drv.cuMemGetInfo(&free, &total)); err != nil {
		return err
	}
	d.info.FreeMem = free
	d.alloc = newCachingAllocator(driverMemory{drv})
	return nil
}

// Do runs f on the device's goroutine and waits for it. f must not call Do (it would wait on
// itself); methods whose names end in "OnThread" are the ones f may call. An error of an earlier
// Post is returned with f's (cmdQueue).
func (d *Device) Do(f func() error) error {
	return d.q.do(f)
}

// Post queues f to run on the device's goroutine after everything queued before it and returns
// without waiting; f's error is returned by the next Do or Post. It is for work whose result
// the caller does not read (kernel launches on the stream). With HALO_CUDA_SYNC_OPS=1 it waits,
// as Do does.
func (d *Device) Post(f func() error) error {
	return d.q.post(f)
}

// Info describes the device (free memory as of Open).
func (d *Device) Info() DeviceInfo { return d.info }

// Close waits for queued work, frees every cached block and releases the context.
func (d *Device) Close() error {
	var err error
	d.once.Do(func() {
		err = d.Do(func() error {
			var errs []error
			errs = append(errs, d.drv.check("cuStreamSynchronize", d.drv.cuStreamSynchronize(d.stream)))
			if d.gemm != nil {
				errs = append(errs, d.gemm.close(d))
			}
			for _, m := range d.modules {
				errs = append(errs, d.drv.check("cuModuleUnload", d.drv.cuModuleUnload(m.handle)))
			}
			for p := range d.alloc.live {
				errs = append(errs, d.alloc.Free(p))
			}
			errs = append(errs, d.alloc.EmptyCache())
			errs = append(errs, d.drv.check("cuStreamDestroy_v2", d.drv.cuStreamDestroy(d.stream)))
			errs = append(errs, d.drv.check("cuDevicePrimaryCtxRelease", d.drv.cuPrimaryCtxRelease(d.dev)))
			d.closed = true
			return errors.Join(errs...)
		})
		close(d.q.cmds)
		<-d.q.done
	})
	return err
}

// Synchronize waits for all work queued on the device's stream and reports any error a kernel
// raised asynchronously.
func (d *Device) Synchronize() error {
	return d.Do(func() error { return d.syncOnThread() })
}

func (d *Device) syncOnThread() error {
	d.syncs.note()
	return d.drv.check("cuStreamSynchronize", d.drv.cuStreamSynchronize(d.stream))
}

// MemStats returns the caching allocator's statistics.
func (d *Device) MemStats() MemStats {
	var s MemStats
	_ = d.Do(func() error { s = d.alloc.Stats(); return nil })
	return s
}

// ResetPeakMem sets the peak statistics to the current values.
func (d *Device) ResetPeakMem() {
	_ = d.Do(func() error { d.alloc.ResetPeak(); return nil })
}

// EmptyCache returns cached free blocks to the driver.
func (d *Device) EmptyCache() error {
	return d.Do(func() error {
		if err := d.syncOnThread(); err != nil {
			return err
		}
		return d.alloc.EmptyCache()
	})
}

// MemInfo is the driver's free and total memory for the device.
func (d *Device) MemInfo() (free, total uint64, err error) {
	err = d.Do(func() error { return d.drv.check("cuMemGetInfo_v2", d.drv.cuMemGetInfo(&free, &total)) })
	return
}

// driverMemory allocates with cuMemAlloc_v2; it runs on the device goroutine.
type driverMemory struct{ drv *driverAPI }

func (m driverMemory) alloc(n uint64) (uintptr, error) {
	var p uintptr
	r := m.drv.cuMemAlloc(&p, n)
	if r == cuErrOutOfMemory {
		return 0, fmt.Errorf("%w (cuMemAlloc_v2 of %d bytes)", errOutOfMemory, n)
	}
	if err := m.drv.check("cuMemAlloc_v2", r); err != nil {
		return 0, err
	}
	return p, nil
}

func (m driverMemory) free(p uintptr) error { return m.drv.check("cuMemFree_v2", m.drv.cuMemFree(p)) }

// Buffer is a block of device memory from the device's caching allocator.
type Buffer struct {
	dev   *Device
	ptr   uintptr
	bytes uint64
}

// Ptr is the device address.
func (b *Buffer) Ptr() uintptr { return b.ptr }

// Bytes is the requested size.
func (b *Buffer) Bytes() uint64 { return b.bytes }

// Alloc returns an uninitialised buffer of n bytes.
func (d *Device) Alloc(n uint64) (*Buffer, error) {
	if p, ok := d.alloc.Cached(n); ok {
		return &Buffer{dev: d, ptr: p, bytes: n}, nil
	}
	var b *Buffer
	err := d.Do(func() error {
		var err error
		b, err = d.allocOnThread(n)
		return err
	})
	if err != nil {
		if b != nil {
			_ = d.alloc.Free(b.ptr) // allocated, but an earlier queued op's error is returned
		}
		return nil, err
	}
	return b, nil
}

func (d *Device) allocOnThread(n uint64) (*Buffer, error) {
	p, err := d.alloc.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", d.info.Ordinal, err)
	}
	return &Buffer{dev: d, ptr: p, bytes: n}, nil
}

// Free returns the buffer to the device's cache. Work already queued on the device's stream that
// uses it completes first, because later allocations run on the same stream.
func (b *Buffer) Free() error {
	if b == nil || b.ptr == 0 {
		return nil
	}
	p := b.ptr
	b.ptr = 0
	return b.dev.Post(func() error { return b.dev.alloc.Free(p) })
}

// Upload copies host bytes into b (synchronously, after the stream's queued work).
func (b *Buffer) Upload(src []byte) error {
	if uint64(len(src)) > b.bytes {
		return fmt.Errorf("cuda: upload of %d bytes into a %d-byte buffer", len(src), b.bytes)
	}
	if len(src) == 0 {
		return nil
	}
	d := b.dev
	return d.Do(func() error {
		if err := d.syncOnThread(); err != nil {
			return err
		}
		return d.drv.check("cuMemcpyHtoD_v2", d.drv.cuMemcpyHtoD(b.ptr, unsafe.Pointer(&src[0]), uint64(len(src))))
	})
}

// Download copies the first len(dst) bytes of b to the host after the stream's queued work.
func (b *Buffer) Download(dst []byte) error {
	if uint64(len(dst)) > b.bytes {
		return fmt.Errorf("cuda: download of %d bytes from a %d-byte buffer", len(dst), b.bytes)
	}
	if len(dst) == 0 {
		return nil
	}
	d := b.dev
	return d.Do(func() error {
		if err := d.syncOnThread(); err != nil {
			return err
		}
		return d.drv.check("cuMemcpyDtoH_v2", d.drv.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), b.ptr, uint64(len(dst))))
	})
}

// Memset sets every byte of b to v, on the device's stream.
func (b *Buffer) Memset(v byte) error {
	d := b.dev
	return d.Do(func() error {
		return d.drv.check("cuMemsetD8Async", d.drv.cuMemsetD8Async(b.ptr, v, b.bytes, d.stream))
	})
}

// CopyFrom copies n bytes from src to b on the device's stream.
func (b *Buffer) CopyFrom(src *Buffer, n uint64) error {
	if n > b.bytes || n > src.bytes {
		return fmt.Errorf("cuda: device copy of %d bytes between buffers of %d and %d bytes", n, src.bytes, b.bytes)
	}
	d := b.dev
	return d.Do(func() error {
		return d.drv.check("cuMemcpyDtoDAsync_v2", d.drv.cuMemcpyDtoDAsync(b.ptr, src.ptr, n, d.stream))
	})
}

// Event is a CUDA event for timing work on the device's stream.
type Event struct {
	dev *Device
	h   uintptr
}

// NewEvent creates an event.
func (d *Device) NewEvent() (*Event, error) {
	e := &Event{dev: d}
	err := d.Do(func() error { return d.drv.check("cuEventCreate", d.drv.cuEventCreate(&e.h, 0)) })
	return e, err
}

// elapsedOnThread waits for the event end and returns the milliseconds from start to end.
func (d *Device) elapsedOnThread(start, end uintptr) (float32, error) {
	d.syncs.note()
	if err := d.drv.check("cuEventSynchronize", d.drv.cuEventSynchronize(end)); err != nil {
		return 0, err
	}
	var ms float32
	err := d.drv.check("cuEventElapsedTime", d.drv.cuEventElapsedTime(&ms, start, end))
	return ms, err
}

// Record records the event on the device's stream.
func (e *Event) Record() error {
	d := e.dev
	return d.Do(func() error { return d.drv.check("cuEventRecord", d.drv.cuEventRecord(e.h, d.stream)) })
}

// ElapsedMs waits for end and returns the milliseconds between e and end.
func (e *Event) ElapsedMs(end *Event) (float32, error) {
	d := e.dev
	var ms float32
	err := d.Do(func() error {
		var err error
		ms, err = d.elapsedOnThread(e.h, end.h)
		return err
	})
	return ms, err
}

// Destroy releases the event.
func (e *Event) Destroy() error {
	d := e.dev
	return d.Do(func() error { return d.drv.check("cuEventDestroy_v2", d.drv.cuEventDestroy(e.h)) })
}

// Len is the buffer's size in bytes (tensor.Buffer).
func (b *Buffer) Len() int64 { return int64(b.bytes) }

// Device names the GPU holding the buffer (tensor.Buffer).
func (b *Buffer) Device() string { return fmt.Sprintf("cuda:%d", b.dev.info.Ordinal) }
