package cuda

import (
	"errors"
	"fmt"
	"sync"
)

// cmdQueue carries work to a device goroutine. Do hands over a function and waits for its
// result; Post hands it over and returns at once, so that the caller builds the next op while
// the device goroutine launches this one (two thread wake-ups per op come off the caller's
// path). Both keep one order: everything runs in the order it was queued, so a Do after Posts
// sees their effects, and a tensor freed after an op that reads it is freed after that op is
// enqueued on the stream.
//
// An error returned by a posted function has no caller waiting for it: it is kept, and the next
// Do or Post returns it (once), wrapped so that it says an earlier op failed. The first such
// error wins until it is reported.
type cmdQueue struct {
	cmds chan func()
	done chan struct{}
	// async false makes Post behave as Do (HALO_CUDA_SYNC_OPS=1), for debugging an op's error
	// at its call and for measuring what posting saves.
	async bool

	// closed says, on the device goroutine, whether the device was closed; who names the
	// device in errors.
	closed func() bool
	who    string

	mu  sync.Mutex
	err error
}

// queueDepth bounds the functions posted ahead of the device goroutine; a full queue makes Post
// wait, which keeps a fast caller from running arbitrarily far ahead.
const queueDepth = 1024

func newCmdQueue(who string, closed func() bool) *cmdQueue {
	return &cmdQueue{cmds: make(chan func(), queueDepth), done: make(chan struct{}),
		async: !swSyncOps.Is("1"), closed: closed, who: who}
}

// stopped reports whether the device goroutine has ended (its queue is closed then, and a send
// on it would panic). Ops racing with Close are the caller's error.
func (q *cmdQueue) stopped() bool {
	select {
	case <-q.done:
		return true
	default:
		return false
	}
}

// keep records the error of a posted function (the first one wins).
func (q *cmdQueue) keep(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
}

// take returns and clears the kept error.
func (q *cmdQueue) take() error {
	q.mu.Lock()
	err := q.err
	q.err = nil
	q.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cuda: an earlier queued op failed: %w", err)
	}
	return nil
}

// run calls f on the device goroutine, turning a panic into an error and refusing to run on a
// closed device (closed is read there).
func run(f func() error, closed func() bool, who string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cuda: %s: panic on the device thread: %v", who, r)
		}
	}()
	if closed() {
		return errors.New("cuda: device is closed")
	}
	return f()
}

// do runs f on the device goroutine and waits for it; a kept error of an earlier posted function
// is returned first (f still runs, so that the queue's order and a Close are kept).
func (q *cmdQueue) do(f func() error) error {
	if q.stopped() {
		return errors.New("cuda: device is closed")
	}
	var err error
	ran := make(chan struct{})
	select {
	case <-q.done:
		return errors.New("cuda: device is closed")
	case q.cmds <- func() {
		defer close(ran)
		err = run(f, q.closed, q.who)
	}:
	}
	<-ran
	if kept := q.take(); kept != nil {
		return errors.Join(kept, err)
	}
	return err
}

// post queues f and returns at once (see cmdQueue); with async off it is do.
func (q *cmdQueue) post(f func() error) error {
	if !q.async {
		return q.do(f)
	}
	if err := q.take(); err != nil {
		return err
	}
	if q.stopped() {
		return errors.New("cuda: device is closed")
	}
	select {
	case <-q.done:
		return errors.New("cuda: device is closed")
	case q.cmds <- func() {
		if err := run(f, q.closed, q.who); err != nil {
			q.keep(err)
		}
	}:
	}
	return nil
}

// setAsync switches posting on or off (tests measure both on one device). Call it only while no
// op is in flight from another goroutine.
func (q *cmdQueue) setAsync(on bool) {
	q.mu.Lock()
	q.async = on
	q.mu.Unlock()
}
