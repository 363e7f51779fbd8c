package cuda

import (
	"errors"
	"sync"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
)

var _ backend.DeviceTimer = (*Backend)(nil)

// markPool keeps the timing events behind backend.DeviceTimer's marks for reuse.
type markPool struct {
	mu   sync.Mutex
	free []uintptr
	all  []uintptr
}

// Mark records a timing event on the device's stream (posted: it does not wait) and returns it.
func (b *Backend) Mark() (backend.TimeMark, error) {
	b.marks.mu.Lock()
	var h uintptr
	if n := len(b.marks.free); n > 0 {
		h = b.marks.free[n-1]
		b.marks.free = b.marks.free[:n-1]
	}
	b.marks.mu.Unlock()
	if h == 0 {
		e, err := b.d.NewEvent()
		if err != nil {
			return 0, err
		}
		h = e.h
		b.marks.mu.Lock()
		b.marks.all = append(b.marks.all, h)
		b.marks.mu.Unlock()
	}
	e := h
	if err := b.d.Post(func() error { return b.d.drv.check("cuEventRecord", b.d.drv.cuEventRecord(e, b.d.stream)) }); err != nil {
		b.Release(backend.TimeMark(h))
		return 0, err
	}
	return backend.TimeMark(h), nil
}

// Elapsed waits for to and returns the device time from from to to.
func (b *Backend) Elapsed(from, to backend.TimeMark) (time.Duration, error) {
	if from == 0 || to == 0 {
		return 0, errors.New("cuda: Elapsed: a mark is missing")
	}
	var ms float32
	err := b.d.Do(func() error {
		var err error
		ms, err = b.d.elapsedOnThread(uintptr(from), uintptr(to))
		return err
	})
	return time.Duration(float64(ms) * float64(time.Millisecond)), err
}

// Release returns marks to the pool.
func (b *Backend) Release(marks ...backend.TimeMark) {
	b.marks.mu.Lock()
	for _, m := range marks {
		if m != 0 {
			b.marks.free = append(b.marks.free, uintptr(m))
		}
	}
	b.marks.mu.Unlock()
}

// destroyMarksOnThread destroys every timing event the pool created.
func (b *Backend) destroyMarksOnThread() error {
	b.marks.mu.Lock()
	all := b.marks.all
	b.marks.all, b.marks.free = nil, nil
	b.marks.mu.Unlock()
	var errs []error
	for _, h := range all {
		errs = append(errs, b.d.drv.check("cuEventDestroy_v2", b.d.drv.cuEventDestroy(h)))
	}
	return errors.Join(errs...)
}
