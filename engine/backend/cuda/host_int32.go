package cuda

import (
	"encoding/binary"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host summaries of uploaded I32 tensors.
//
// Index tensors (token ids, targets, positions, document boundaries) reach the device through
// Upload, so the host already knows their values. Ops that must validate them (Embedding,
// CrossEntropy, attention's document boundaries) or need them on the host (EmbeddingBackward's
// sort) read the record kept here instead of downloading the tensor, which would make the host
// wait for every queued kernel. A record is keyed by device address and length and dropped as
// soon as the memory may change: Free, Alloc of memory that overlaps it, Copy or Fill into it,
// another Upload over it, or NoteDeviceWrite (for writers outside this package, such as
// collectives). The one kernel of this package that writes an I32 tensor, SampleTokens', writes
// ids it guarantees to lie in [0, V), and its launcher records that range (no host copy). When no
// record exists (ids made on the device otherwise), the ops fall back to checking on the device
// and reading a flag back.

const (
	// hostInt32CopyMax is the largest upload (in elements) whose values are kept on the host;
	// larger ones keep only their range.
	hostInt32CopyMax = 64 << 10
	// hostInt32MaxRecords bounds the records (and so the host memory, at most 256 x 256 KiB);
	// the oldest is dropped first.
	hostInt32MaxRecords = 256
)

// i32Summary describes the values of one uploaded I32 range [p, p+4n).
type i32Summary struct {
	p   uintptr
	n   int
	seq uint64
	// min and max over every element.
	min, max int32
	// minValid and maxValid ignore backend.IgnoreIndex; hasValid is false when every element is
	// the ignore index (or n is 0).
	minValid, maxValid int32
	hasValid           bool
	// host is a copy of the values when n <= hostInt32CopyMax, else nil.
	host []int32
}

// summarizeInt32 computes the summary of vals (not its address); the summary keeps vals itself
// as its host copy when it is small enough, so the caller hands it over.
func summarizeInt32(vals []int32) i32Summary {
	s := i32Summary{n: len(vals)}
	for i, v := range vals {
		if i == 0 {
			s.min, s.max = v, v
		}
		s.min, s.max = min(s.min, v), max(s.max, v)
		if v == backend.IgnoreIndex {
			continue
		}
		if !s.hasValid {
			s.minValid, s.maxValid, s.hasValid = v, v, true
		}
		s.minValid, s.maxValid = min(s.minValid, v), max(s.maxValid, v)
	}
	if len(vals) <= hostInt32CopyMax {
		s.host = vals[:len(vals):len(vals)]
		if s.host == nil {
			s.host = []int32{}
		}
	}
	return s
}

// end is one past the record's last byte.
func (s *i32Summary) end() uintptr { return s.p + uintptr(4*s.n) }

// i32Records is the set of live summaries of one backend. It is safe for concurrent use.
type i32Records struct {
	mu   sync.Mutex
	recs map[uintptr]*i32Summary // by start address
	seq  uint64
}

// record replaces whatever is known about [p, p+4*len(vals)) with vals' summary. vals is kept
// (not copied) and must not change afterwards.
func (r *i32Records) record(p uintptr, vals []int32) {
	s := summarizeInt32(vals)
	s.p = p
	r.mu.Lock()
	defer r.mu.Unlock()
	r.invalidateLocked(p, uint64(4*len(vals)))
	if r.recs == nil {
		r.recs = map[uintptr]*i32Summary{}
	}
	r.seq++
	s.seq = r.seq
	r.recs[p] = &s
	r.evictLocked()
}

// evictLocked drops the oldest records past hostInt32MaxRecords.
func (r *i32Records) evictLocked() {
	for len(r.recs) > hostInt32MaxRecords {
		var oldest *i32Summary
		for _, x := range r.recs {
			if oldest == nil || x.seq < oldest.seq {
				oldest = x
			}
		}
		delete(r.recs, oldest.p)
	}
}

// recordRange replaces whatever is known about [p, p+4n) with a range and no host copy, for an
// I32 tensor that a kernel of this package writes with values it guarantees to lie in [lo, hi].
func (r *i32Records) recordRange(p uintptr, n int, lo, hi int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.invalidateLocked(p, uint64(4*n))
	if r.recs == nil {
		r.recs = map[uintptr]*i32Summary{}
	}
	r.seq++
	r.recs[p] = &i32Summary{p: p, n: n, seq: r.seq, min: lo, max: hi, minValid: lo, maxValid: hi, hasValid: n > 0}
	r.evictLocked()
}

// invalidate drops every record overlapping [p, p+bytes).
func (r *i32Records) invalidate(p uintptr, bytes uint64) {
	r.mu.Lock()
	r.invalidateLocked(p, bytes)
	r.mu.Unlock()
}

func (r *i32Records) invalidateLocked(p uintptr, bytes uint64) {
	if len(r.recs) == 0 {
		return
	}
	if bytes == 0 {
		bytes = 1
	}
	end := p + uintptr(bytes)
	for k, s := range r.recs {
		if s.p < end && p < s.end() {
			delete(r.recs, k)
		}
	}
}

// lookup returns the summary of the record holding all of [p, p+4n), and the element offset of
// p within it.
func (r *i32Records) lookup(p uintptr, n int) (s i32Summary, off int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x, found := r.recs[p]; found && x.n >= n {
		return *x, 0, true
	}
	for _, x := range r.recs {
		if p >= x.p && (p-x.p)%4 == 0 && p+uintptr(4*n) <= x.end() {
			return *x, int((p - x.p) / 4), true
		}
	}
	return i32Summary{}, 0, false
}

// values returns the host copy of [p, p+4n) when one is known.
func (r *i32Records) values(p uintptr, n int) ([]int32, bool) {
	s, off, ok := r.lookup(p, n)
	if !ok || s.host == nil {
		return nil, false
	}
	return s.host[off : off+n : off+n], true
}

// len is the number of live records.
func (r *i32Records) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// i32Check is the outcome of validating an index range on the host.
type i32Check int

const (
	i32Unknown i32Check = iota // no record: check on the device
	i32Valid                   // every element is acceptable
	i32Bad                     // element badAt is not; its value is badVal
)

// checkRange validates the n elements at p against [0, limit), ignoring backend.IgnoreIndex when
// allowIgnore. It reports i32Bad with the first offending element only when the host copy is
// known; a summary whose range fails without a copy gives i32Unknown (the device finds the
// element).
func (r *i32Records) checkRange(p uintptr, n int, limit int32, allowIgnore bool) (res i32Check, badAt int, badVal int32) {
	s, off, ok := r.lookup(p, n)
	if !ok {
		return i32Unknown, 0, 0
	}
	if (off == 0 && s.n == n) || s.host == nil {
		// The whole record's range bounds every sub-range.
		lo, hi, has := s.min, s.max, s.n > 0
		if allowIgnore {
			lo, hi, has = s.minValid, s.maxValid, s.hasValid
		}
		if !has || (lo >= 0 && hi < limit) {
			return i32Valid, 0, 0
		}
		if s.host == nil {
			return i32Unknown, 0, 0
		}
	}
	for i, v := range s.host[off : off+n] {
		if allowIgnore && v == backend.IgnoreIndex {
			continue
		}
		if v < 0 || v >= limit {
			return i32Bad, i, v
		}
	}
	return i32Valid, 0, 0
}

// decodeInt32 reads little-endian int32 values.
func decodeInt32(src []byte) []int32 {
	out := make([]int32, len(src)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return out
}

// hostInt32 returns the host copy of the n int32 values at device address p when they were
// uploaded through Upload and nothing may have written them since; ok is false otherwise (the
// caller then downloads them). The slice must not be modified.
func (b *Backend) hostInt32(p uintptr, n int) ([]int32, bool) { return b.i32.values(p, n) }

// NoteDeviceWrite tells the backend that t's memory was written by something other than its
// own methods (a collective, a library enqueuing on the device's stream), so any host copy of an
// index tensor held there is stale. Callers that write I32 tensors behind the backend's back must
// call it before the write is enqueued.
func (b *Backend) NoteDeviceWrite(t T) {
	if t.IsNil() {
		return
	}
	buf, ok := t.Buffer().(*Buffer)
	if !ok || buf.ptr == 0 {
		return
	}
	b.i32.invalidate(buf.ptr+uintptr(t.Offset()), uint64(t.Bytes()))
}
