package cuda

import (
	"maps"
	"runtime"
	"strings"
	"sync"
)

// syncCounter counts the times a device makes the host wait for its stream (stream, context and
// event synchronisations), and for each the operation that asked: the outermost method of
// Backend, Device, Buffer or Event found on the device goroutine's stack when the wait happens.
// A training step that lets the host run ahead of the GPU makes none between its first op and
// the download of its loss.
type syncCounter struct {
	mu    sync.Mutex
	total int64
	byOp  map[string]int64
	last  string
}

// SyncStats are a device's host synchronisations since it was opened.
type SyncStats struct {
	Total int64 `json:"total"`
	// ByOp counts them by the operation that waited, e.g. "Download", "Embedding",
	// "Device.Synchronize".
	ByOp map[string]int64 `json:"by_op"`
	// Last names the operation of the most recent one.
	Last string `json:"last,omitempty"`
}

// note records one synchronisation under the op found on the call stack; it runs on the device
// goroutine, just before the wait.
func (c *syncCounter) note() { c.noteOp(syncCaller()) }

// noteOp records one synchronisation under a given op name (the caller's own tag rather than the
// op found on the stack); it runs on the device goroutine, just before the wait.
func (c *syncCounter) noteOp(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total++
	if c.byOp == nil {
		c.byOp = map[string]int64{}
	}
	c.byOp[op]++
	c.last = op
}

func (c *syncCounter) stats() SyncStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return SyncStats{Total: c.total, ByOp: maps.Clone(c.byOp), Last: c.last}
}

// Syncs returns how many times the device made the host wait, and for which operations. It may
// be called from any goroutine.
func (d *Device) Syncs() SyncStats { return d.syncs.stats() }

// Syncs is the device's synchronisation count (see Device.Syncs).
func (b *Backend) Syncs() SyncStats { return b.d.Syncs() }

// HostSyncs implements backend.SyncCounter (Optional.Syncs): the total of Syncs, without the
// per-op map.
func (b *Backend) HostSyncs() int64 {
	c := &b.d.syncs
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

const pkgPath = "github.com/halo-shell/halo-shell/engine/backend/cuda."

// syncCaller names the operation on the current goroutine's stack that asked for a wait.
func syncCaller() string {
	var pcs [64]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	var names []string
	for {
		f, more := frames.Next()
		names = append(names, f.Function)
		if !more {
			break
		}
	}
	return opFromFrames(names)
}

// opFromFrames picks the operation from function names listed innermost first: the outermost
// Backend method if any, else the outermost Device, Buffer or Event method other than the device
// goroutine's own plumbing (loop, Do); closure suffixes are dropped.
func opFromFrames(funcs []string) string {
	backendOp, deviceOp := "", ""
	for _, f := range funcs {
		rest, ok := strings.CutPrefix(f, pkgPath)
		if !ok {
			continue
		}
		recv, method, ok := strings.Cut(rest, ").")
		if !ok || !strings.HasPrefix(recv, "(*") {
			continue
		}
		recv = strings.TrimPrefix(recv, "(*")
		method, _, _ = strings.Cut(method, ".")
		switch recv {
		case "Backend":
			backendOp = method
		case "Device", "Buffer", "Event":
			if method != "loop" && method != "Do" {
				deviceOp = recv + "." + method
			}
		}
	}
	switch {
	case backendOp != "":
		return backendOp
	case deviceOp != "":
		return deviceOp
	}
	return "unknown"
}
