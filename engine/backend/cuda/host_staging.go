package cuda

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Asynchronous host-to-device copies through pinned staging memory.
//
// A synchronous cuMemcpyHtoD from pageable memory runs on the legacy default stream, so it waits
// for every kernel already queued: an upload in the middle of a step (a batch's ids, the sort
// order of EmbeddingBackward) would stop the host from running ahead of the GPU. Small uploads
// instead go through a ring of pinned host slots: the bytes are copied into a free slot, an
// asynchronous copy is queued on the device's stream (so it is ordered with the kernels around
// it), and an event recorded after it marks when the slot may be reused. The host waits only
// when it is a whole ring of uploads ahead of the GPU (counted as a synchronisation). Larger
// uploads keep the synchronous path.

const (
	stagingSlotBytes = 1 << 20
	stagingSlots     = 16
	cuErrNotReady    = 600 // CUDA_ERROR_NOT_READY
)

// stagingAPI holds the driver entry points the staging ring needs beyond driverAPI's.
type stagingAPI struct {
	memAllocHost    func(p *unsafe.Pointer, bytes uint64) int32
	memFreeHost     func(p unsafe.Pointer) int32
	memcpyHtoDAsync func(dst uintptr, src unsafe.Pointer, bytes uint64, stream uintptr) int32
	eventQuery      func(e uintptr) int32
}

// loadStagingAPI binds the entry points from the already loaded driver (nil when absent).
var loadStagingAPI = sync.OnceValue(func() *stagingAPI {
	handles := []uintptr{purego.RTLD_DEFAULT}
	if h, err := purego.Dlopen("libcuda.so.1", purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
		handles = append(handles, h)
	}
	a := &stagingAPI{}
	for _, b := range []struct {
		fn   any
		name string
	}{
		{&a.memAllocHost, "cuMemAllocHost_v2"},
		{&a.memFreeHost, "cuMemFreeHost"},
		{&a.memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
		{&a.eventQuery, "cuEventQuery"},
	} {
		found := false
		for _, h := range handles {
			if addr, err := purego.Dlsym(h, b.name); err == nil && addr != 0 {
				purego.RegisterFunc(b.fn, addr)
				found = true
				break
			}
		}
		if !found {
			return nil
		}
	}
	return a
})

type stagingSlot struct {
	host  unsafe.Pointer // stagingSlotBytes of pinned memory
	event uintptr
	used  bool // an event has been recorded after the slot's last copy
}

// hostStaging is the ring of pinned slots of one backend; it is touched only on the device
// goroutine.
type hostStaging struct {
	api   *stagingAPI
	slots []stagingSlot
	next  int
	// failed records that pinned memory could not be set up; uploads then stay synchronous.
	failed bool
}

// stagingOnThread returns the ring, creating it on first use; nil when it cannot be had.
func (b *Backend) stagingOnThread() *hostStaging {
	s := &b.staging
	if s.failed {
		return nil
	}
	if s.slots != nil {
		return s
	}
	s.api = loadStagingAPI()
	if s.api == nil || b.d.drv.cuEventCreate == nil {
		s.failed = true
		return nil
	}
	for range stagingSlots {
		var sl stagingSlot
		if s.api.memAllocHost(&sl.host, stagingSlotBytes) != cuSuccess {
			break
		}
		const eventDisableTiming = 2
		if b.d.drv.cuEventCreate(&sl.event, eventDisableTiming) != cuSuccess {
			s.api.memFreeHost(sl.host)
			break
		}
		s.slots = append(s.slots, sl)
	}
	if len(s.slots) == 0 {
		s.failed = true
		return nil
	}
	return s
}

// uploadOnThread copies src to device address p, ordered on the device's stream after all work
// queued before it. Small copies return without waiting for the GPU; src may be reused as soon
// as it returns.
func (b *Backend) uploadOnThread(p uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	drv := b.d.drv
	if len(src) <= stagingSlotBytes {
		if s := b.stagingOnThread(); s != nil {
			sl := &s.slots[s.next]
			s.next = (s.next + 1) % len(s.slots)
			if sl.used {
				switch r := s.api.eventQuery(sl.event); r {
				case cuSuccess:
				case cuErrNotReady:
					b.d.syncs.note()
					if err := drv.check("cuEventSynchronize", drv.cuEventSynchronize(sl.event)); err != nil {
						return err
					}
				default:
					return drv.check("cuEventQuery", r)
				}
			}
			copy(unsafe.Slice((*byte)(sl.host), len(src)), src)
			if err := drv.check("cuMemcpyHtoDAsync_v2", s.api.memcpyHtoDAsync(p, sl.host, uint64(len(src)), b.d.stream)); err != nil {
				return err
			}
			sl.used = true
			return drv.check("cuEventRecord", drv.cuEventRecord(sl.event, b.d.stream))
		}
	}
	if err := b.d.syncOnThread(); err != nil {
		return err
	}
	return drv.check("cuMemcpyHtoD_v2", drv.cuMemcpyHtoD(p, unsafe.Pointer(&src[0]), uint64(len(src))))
}

// closeStagingOnThread waits for the ring's copies and releases it.
func (b *Backend) closeStagingOnThread() error {
	s := &b.staging
	var errs []error
	for _, sl := range s.slots {
		if sl.used {
			errs = append(errs, b.d.drv.check("cuEventSynchronize", b.d.drv.cuEventSynchronize(sl.event)))
		}
		errs = append(errs, b.d.drv.check("cuEventDestroy_v2", b.d.drv.cuEventDestroy(sl.event)))
		errs = append(errs, b.d.drv.check("cuMemFreeHost", s.api.memFreeHost(sl.host)))
	}
	s.slots = nil
	s.failed = true
	return errors.Join(errs...)
}
