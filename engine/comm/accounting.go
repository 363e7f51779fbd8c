package comm

import (
	"maps"
	"sync"
	"time"
)

// Accounting keeps what every communicator reports about itself: the totals of its collectives
// by kind (Stats) and the recorder that turns each into a profile span (SetRecorder).
// Communicators embed it and wrap each collective in Run.
type Accounting struct {
	mu    sync.Mutex
	stats Stats
	rec   Recorder
}

// SetRecorder implements Communicator.
func (a *Accounting) SetRecorder(r Recorder) {
	a.mu.Lock()
	a.rec = r
	a.mu.Unlock()
}

// Stats implements Communicator.
func (a *Accounting) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stats == nil {
		return Stats{}
	}
	return maps.Clone(a.stats)
}

// Run times fn as one collective of kind over bytes in group, as a span of the recorder when
// one is set, and adds it to the totals (whether or not it failed).
func (a *Accounting) Run(kind, group string, bytes int64, fn func() error) error {
	a.mu.Lock()
	rec := a.rec
	a.mu.Unlock()
	start := time.Now()
	var err error
	if rec != nil {
		err = rec.Collective(kind, group, bytes, fn)
	} else {
		err = fn()
	}
	d := time.Since(start)
	a.mu.Lock()
	if a.stats == nil {
		a.stats = Stats{}
	}
	s := a.stats[kind]
	s.Calls++
	s.Bytes += bytes
	s.Time += d
	a.stats[kind] = s
	a.mu.Unlock()
	return err
}
