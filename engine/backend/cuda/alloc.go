package cuda

import (
	"errors"
	"fmt"
	"sync"
)

// rawMemory is what the caching allocator takes memory from: the driver on a device.
type rawMemory interface {
	alloc(bytes uint64) (uintptr, error)
	free(ptr uintptr) error
}

// errOutOfMemory marks a failed raw allocation that freeing cached blocks may cure.
var errOutOfMemory = errors.New("out of device memory")

// MemStats are a device's memory statistics, in bytes.
type MemStats struct {
	// Allocated is the size (rounded to its size class) of every live buffer.
	Allocated uint64 `json:"allocated"`
	// Reserved is what the allocator holds from the driver: live buffers plus cached free blocks.
	Reserved uint64 `json:"reserved"`
	// PeakAllocated and PeakReserved are the maxima since the last ResetPeak.
	PeakAllocated uint64 `json:"peak_allocated"`
	PeakReserved  uint64 `json:"peak_reserved"`
	// Allocs counts allocations; CacheHits those served from a free list.
	Allocs    uint64 `json:"allocs"`
	CacheHits uint64 `json:"cache_hits"`
}

const (
	smallClassStep = 512     // sizes below smallLimit round up to a multiple of this
	smallLimit     = 1 << 20 // 1 MiB
	largeClassStep = 2 << 20 // larger sizes round up to a multiple of 2 MiB
)

// sizeClass rounds a request up to the size the allocator hands out.
func sizeClass(n uint64) uint64 {
	if n < smallLimit {
		return (n + smallClassStep - 1) / smallClassStep * smallClassStep
	}
	return (n + largeClassStep - 1) / largeClassStep * largeClassStep
}

// cachingAllocator keeps freed blocks on per-size-class free lists and reuses them, so steady
// state training makes no driver allocation calls. It is not safe for concurrent use: a device's
// allocator is used only from the device's goroutine.
type cachingAllocator struct {
	// mu guards the fields below: cached blocks are handed out on any goroutine (Cached), raw
	// allocations and frees happen on the device goroutine with mu held.
	mu    sync.Mutex
	raw   rawMemory
	free  map[uint64][]uintptr
	live  map[uintptr]uint64 // pointer -> size class
	stats MemStats
	// limit, when nonzero, caps Reserved (tests and memory budgets); limitWhy names the
	// setting that chose it, for the error message.
	limit    uint64
	limitWhy string
}

// memLimit is the cap, 0 for none.
func (a *cachingAllocator) memLimit() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limit
}

// setLimit caps Reserved at limit bytes from now on; it fails if more is already reserved.
func (a *cachingAllocator) setLimit(limit uint64, why string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stats.Reserved > limit {
		return fmt.Errorf("cuda: %s: cannot cap memory at %d bytes, %d are already reserved", why, limit, a.stats.Reserved)
	}
	a.limit, a.limitWhy = limit, why
	return nil
}

func newCachingAllocator(raw rawMemory) *cachingAllocator {
	return &cachingAllocator{raw: raw, free: map[uint64][]uintptr{}, live: map[uintptr]uint64{}}
}

// Alloc returns a block of at least n bytes. On out-of-memory it returns every cached block to
// the driver and tries once more before failing with the statistics in the message.
func (a *cachingAllocator) Alloc(n uint64) (uintptr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n == 0 {
		return 0, errors.New("cuda: allocate: zero bytes requested")
	}
	if n > 1<<46 {
		return 0, fmt.Errorf("cuda: allocate: %d bytes is beyond any device", n)
	}
	c := sizeClass(n)
	a.stats.Allocs++
	if l := a.free[c]; len(l) > 0 {
		p := l[len(l)-1]
		a.free[c] = l[:len(l)-1]
		a.stats.CacheHits++
		a.markLive(p, c)
		return p, nil
	}
	p, err := a.rawAlloc(c)
	if errors.Is(err, errOutOfMemory) && a.cachedBytes() > 0 {
		if ferr := a.emptyCache(); ferr != nil {
			return 0, ferr
		}
		p, err = a.rawAlloc(c)
	}
	if err != nil {
		return 0, fmt.Errorf("cuda: allocate %d bytes (class %d): %w (allocated %d, reserved %d, peak %d bytes): reduce the batch or sequence length", n, c, err, a.stats.Allocated, a.stats.Reserved, a.stats.PeakAllocated)
	}
	a.stats.Reserved += c
	a.stats.PeakReserved = max(a.stats.PeakReserved, a.stats.Reserved)
	a.markLive(p, c)
	return p, nil
}

// Cached returns a cached free block of at least n bytes, or false when its size class has
// none (the caller then allocates on the device goroutine). It may run on any goroutine: a
// block is on a free list only once the Free of its last user has run on the device
// goroutine, after that user's kernels were enqueued, so work on the block's next user, queued
// later on the same stream, runs after them.
func (a *cachingAllocator) Cached(n uint64) (uintptr, bool) {
	if n == 0 || n > 1<<46 {
		return 0, false
	}
	c := sizeClass(n)
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.free[c]
	if len(l) == 0 {
		return 0, false
	}
	p := l[len(l)-1]
	a.free[c] = l[:len(l)-1]
	a.stats.Allocs++
	a.stats.CacheHits++
	a.markLive(p, c)
	return p, true
}

func (a *cachingAllocator) rawAlloc(c uint64) (uintptr, error) {
	if a.limit > 0 && a.stats.Reserved+c > a.limit {
		why := ""
		if a.limitWhy != "" {
			why = " set by " + a.limitWhy
		}
		return 0, fmt.Errorf("%w: limit of %d bytes%s reached", errOutOfMemory, a.limit, why)
	}
	return a.raw.alloc(c)
}

func (a *cachingAllocator) markLive(p uintptr, c uint64) {
	a.live[p] = c
	a.stats.Allocated += c
	a.stats.PeakAllocated = max(a.stats.PeakAllocated, a.stats.Allocated)
}

// Free puts a block back on its free list. Freeing a pointer the allocator did not hand out (or
// freeing twice) is an error.
func (a *cachingAllocator) Free(p uintptr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.live[p]
	if !ok {
		return fmt.Errorf("cuda: free of %#x: not a live allocation (double free?)", p)
	}
	delete(a.live, p)
	a.stats.Allocated -= c
	a.free[c] = append(a.free[c], p)
	return nil
}

func (a *cachingAllocator) cachedBytes() uint64 {
	var n uint64
	for c, l := range a.free {
		n += c * uint64(len(l))
	}
	return n
}

// EmptyCache returns every cached free block to the driver.
func (a *cachingAllocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.emptyCache()
}

func (a *cachingAllocator) emptyCache() error {
	var errs []error
	for c, l := range a.free {
		for _, p := range l {
			if err := a.raw.free(p); err != nil {
				errs = append(errs, err)
				continue
			}
			a.stats.Reserved -= c
		}
		delete(a.free, c)
	}
	return errors.Join(errs...)
}

// Stats returns the current statistics.
func (a *cachingAllocator) Stats() MemStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// ResetPeak sets the peaks to the current values.
func (a *cachingAllocator) ResetPeak() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.PeakAllocated = a.stats.Allocated
	a.stats.PeakReserved = a.stats.Reserved
}
