package cpu

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"

	"github.com/halo-shell/halo-shell/internal/switches"
)

type T = tensor.Tensor

func init() {
	backend.Register("cpu", func(index int) (backend.Backend, error) {
		if index != 0 {
			return nil, fmt.Errorf("cpu: there is one cpu device (index 0), not %d", index)
		}
		return New(Options{}), nil
	})
}

// Options configure a CPU backend.
type Options struct {
	// Workers is the number of goroutines ops use; 0 means GOMAXPROCS.
	Workers int
	// MemoryLimit caps the bytes Alloc may hand out; 0 means the machine's physical memory
	// (MemTotal of /proc/meminfo, or 1<<40 when unknown). Alloc beyond it fails with an error
	// instead of the Go runtime aborting the process.
	MemoryLimit int64
	// PoisonEmpty fills every tensor Empty returns with NaN (float dtypes) or -2^31 (I32), so
	// that an op that reads an output before writing it, or a caller that asks Empty for a
	// tensor it accumulates into, shows up in results. HALO_CPU_POISON_EMPTY=1 turns it on too
	// (for running a test suite that way).
	PoisonEmpty bool
}

// Backend is the CPU implementation of backend.Backend.
type Backend struct {
	pool     *pool
	limit    int64
	limitWhy string // the setting that capped limit (SetMemoryLimit), for the error message
	poison   bool   // Options.PoisonEmpty

	mu        sync.Mutex
	allocated int64
	peak      int64
	cache     map[int]([][]uint64) // freed storage by word count, reused by Alloc
	cached    int64                // bytes held in cache

	ropeTab ropeCache
}

// maxCached bounds the bytes of freed storage kept for reuse (a step's activations are
// typically freed and allocated again with the same sizes).
func (b *Backend) maxCached() int64 { return min(b.limit/2, 8<<30) }

// EmptyCache returns every cached block to the Go runtime.
func (b *Backend) EmptyCache() {
	b.mu.Lock()
	b.cache, b.cached = nil, 0
	b.mu.Unlock()
}

var (
	_ backend.Backend   = (*Backend)(nil)
	_ tensor.HostBuffer = (*buffer)(nil)
)

// Optional implements backend.Backend: the CPU backend fuses AddRMSNorm, runs AdamW, has
// every mixture-of-experts op (GroupedGEMM, routing, permutation, combine: the reference of the
// device kernels), NF4 dequantisation, dropout, the short convolution, the gated delta rule and the gated delta-net stages around it, and the decoding ops (slotted-cache attention and sampling); it has no device queue to time (ops finish before
// they return), so no Timer.
func (b *Backend) Optional() backend.Optional {
	return backend.Optional{
		AddRMSNorm: b.AddRMSNorm, AdamW: b.AdamW, GroupedGEMM: b.GroupedGEMM,
		MoERoute: b.MoERoute, MoERouteBackward: b.MoERouteBackward,
		MoEPermute: b.MoEPermute, MoEPermuteBackward: b.MoEPermuteBackward,
		MoECombine: b.MoECombine, MoECombineBackward: b.MoECombineBackward,
		SwiGLUPacked: b.SwiGLUPacked, SwiGLUPackedBackward: b.SwiGLUPackedBackward,
		GeGLUPacked: b.GeGLUPacked, GeGLUPackedBackward: b.GeGLUPackedBackward,
		DequantNF4: b.DequantNF4, Dropout: b.Dropout,
		ShortConv: b.ShortConv, ShortConvBackward: b.ShortConvBackward,
		GatedDelta: b.GatedDelta, GatedDeltaBackward: b.GatedDeltaBackward,
		GatedDeltaPrep: b.GatedDeltaPrep, GatedDeltaPrepBackward: b.GatedDeltaPrepBackward,
		GatedRMSNorm: b.GatedRMSNorm, GatedRMSNormBackward: b.GatedRMSNormBackward,
		DecodeAttention: b.DecodeAttention, SampleTokens: b.SampleTokens,
		DSV4: dsv4Ops(b),
	}
}

// New returns a CPU backend.
func New(o Options) *Backend {
	w := o.Workers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	lim := o.MemoryLimit
	if lim <= 0 {
		lim = physicalMemory()
	}
	return &Backend{pool: newPool(w), limit: lim, poison: o.PoisonEmpty || swPoisonEmpty.On()}
}

// SetMemoryLimit implements backend.MemoryLimiter: Alloc refuses past limit bytes from now on.
func (b *Backend) SetMemoryLimit(limit int64, why string) error {
	if limit <= 0 {
		return fmt.Errorf("cpu: %s: memory limit %d bytes must be positive", why, limit)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.allocated > limit {
		return fmt.Errorf("cpu: %s: cannot cap memory at %d bytes, %d are already allocated", why, limit, b.allocated)
	}
	if b.cached > 0 {
		b.cache, b.cached = nil, 0
	}
	b.limit, b.limitWhy = limit, why
	return nil
}

var swPoisonEmpty = switches.Register(switches.Switch{Name: "HALO_CPU_POISON_EMPTY", Kind: switches.Debug,
	Values: []string{"1"},
	Doc:    "1 fills every CPU Empty tensor with NaN, so a kernel that reads scratch before writing it shows up as NaN in the results."})

func physicalMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			fs := strings.Fields(s.Text())
			if len(fs) >= 2 && fs[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(fs[1], 10, 64); err == nil && kb > 0 {
					return kb * 1024
				}
			}
		}
	}
	return 1 << 40
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Workers returns the number of goroutines ops run on.
func (b *Backend) Workers() int { return b.pool.n }

// Sync returns nil: CPU ops complete before they return.
func (b *Backend) Sync() error { return nil }

// Close stops the worker goroutines. Tensors stay readable by the garbage collector but the
// backend may not be used afterwards.
func (b *Backend) Close() error {
	b.pool.close()
	return nil
}

// buffer is host memory, 64-byte aligned, zeroed at allocation.
// A buffer is one allocation handed out by Alloc. Its storage may be recycled after Free, but
// the buffer value itself never is, so stale tensors still see that they were freed.
type buffer struct {
	words []uint64
	data  []byte
	size  int64
	freed atomic.Bool
}

func (u *buffer) Len() int64     { return u.size }
func (u *buffer) Device() string { return "cpu" }
func (u *buffer) Host() []byte   { return u.data }

// Alloc returns a zeroed tensor.
func (b *Backend) Alloc(dt tensor.DType, shape ...int) (T, error) { return b.alloc(dt, true, shape) }

// Empty returns a tensor with undefined contents (zeros when new, a freed tensor's bytes when
// reused; NaN or -2^31 with Options.PoisonEmpty).
func (b *Backend) Empty(dt tensor.DType, shape ...int) (T, error) {
	t, err := b.alloc(dt, false, shape)
	if err != nil || !b.poison {
		return t, err
	}
	words := t.Buffer().(*buffer).words
	var fill uint64
	switch dt {
	case tensor.F32:
		fill = 0x7fc000007fc00000
	case tensor.BF16:
		fill = 0x7fc07fc07fc07fc0
	case tensor.I32:
		fill = 0x8000000080000000
	default:
		fill = 0xffffffffffffffff
	}
	for i := range words {
		words[i] = fill
	}
	return t, nil
}

func (b *Backend) alloc(dt tensor.DType, zero bool, shape []int) (T, error) {
	if !dt.Valid() {
		return T{}, fmt.Errorf("cpu: alloc %v: invalid dtype %v", shape, dt)
	}
	if err := tensor.Shape(shape).Check(); err != nil {
		return T{}, fmt.Errorf("cpu: alloc: %w", err)
	}
	n := int64(tensor.Shape(shape).Numel()) * int64(dt.Size())
	nw := int((n+7)/8 + 1)
	b.mu.Lock()
	if b.allocated+b.cached+n > b.limit && b.cached > 0 {
		b.cache, b.cached = nil, 0 // give cached storage back before exceeding the limit
	}
	if b.allocated+n > b.limit {
		used := b.allocated
		b.mu.Unlock()
		why := ""
		if b.limitWhy != "" {
			why = " set by " + b.limitWhy
		}
		return T{}, fmt.Errorf("cpu: out of memory: alloc %s%v needs %d bytes, %d of the %d byte limit%s are in use (free tensors or use smaller batches)",
			dt, shape, n, used, b.limit, why)
	}
	b.allocated += n
	if b.allocated > b.peak {
		b.peak = b.allocated
	}
	var words []uint64
	if list := b.cache[nw]; len(list) > 0 {
		words = list[len(list)-1]
		b.cache[nw] = list[:len(list)-1]
		b.cached -= int64(nw) * 8
	}
	b.mu.Unlock()
	if words == nil {
		words = make([]uint64, nw)
	} else if zero {
		clear(words)
	}
	data := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)[:n]
	buf := &buffer{words: words, data: data, size: n}
	return tensor.New(buf, 0, dt, shape...)
}

// Free releases a tensor returned by Alloc.
func (b *Backend) Free(t T) error {
	if t.IsNil() {
		return nil
	}
	buf, ok := t.Buffer().(*buffer)
	if !ok {
		return fmt.Errorf("cpu: free %v: tensor does not belong to the cpu backend", t)
	}
	if buf.freed.Load() {
		return fmt.Errorf("cpu: free %v: already freed", t)
	}
	if t.Offset() != 0 || t.Bytes() != buf.Len() {
		return fmt.Errorf("cpu: free %v: tensor is a view; free the tensor Alloc returned", t)
	}
	if buf.freed.Swap(true) {
		return fmt.Errorf("cpu: free %v: already freed", t)
	}
	b.mu.Lock()
	b.allocated -= buf.Len()
	if sz := int64(len(buf.words)) * 8; b.cached+sz <= b.maxCached() {
		if b.cache == nil {
			b.cache = map[int][][]uint64{}
		}
		b.cache[len(buf.words)] = append(b.cache[len(buf.words)], buf.words)
		b.cached += sz
	}
	b.mu.Unlock()
	buf.words, buf.data = nil, nil
	return nil
}

// MemStats reports bytes in live tensors; Reserved adds the freed storage kept for reuse.
func (b *Backend) MemStats() backend.MemStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.MemStats{Allocated: b.allocated, Reserved: b.allocated + b.cached, Peak: b.peak, Total: b.limit}
}

// ResetPeak sets the peak to the current allocation.
func (b *Backend) ResetPeak() {
	b.mu.Lock()
	b.peak = b.allocated
	b.mu.Unlock()
}

// hostBytes returns the bytes of t's view, checking that t is a live cpu tensor.
func hostBytes(op, name string, t T) ([]byte, error) {
	if t.IsNil() {
		return nil, fmt.Errorf("cpu: %s: %s is missing", op, name)
	}
	buf, ok := t.Buffer().(*buffer)
	if !ok {
		return nil, fmt.Errorf("cpu: %s: %s %v is not a cpu tensor", op, name, t)
	}
	if buf.freed.Load() {
		return nil, fmt.Errorf("cpu: %s: %s %v was freed", op, name, t)
	}
	return buf.data[t.Offset() : t.Offset()+t.Bytes()], nil
}

// Upload copies raw bytes into dst.
func (b *Backend) Upload(dst T, src []byte) error {
	d, err := hostBytes("upload", "dst", dst)
	if err != nil {
		return err
	}
	if len(src) != len(d) {
		return fmt.Errorf("cpu: upload into %v: got %d bytes, want %d", dst, len(src), len(d))
	}
	copy(d, src)
	return nil
}

// Download copies dst's raw bytes out.
func (b *Backend) Download(dst []byte, src T) error {
	s, err := hostBytes("download", "src", src)
	if err != nil {
		return err
	}
	if len(dst) != len(s) {
		return fmt.Errorf("cpu: download of %v: got a %d byte destination, want %d", src, len(dst), len(s))
	}
	copy(dst, s)
	return nil
}

// pool runs chunks of work on n goroutines (the caller plus n-1 workers).
type pool struct {
	n     int
	tasks chan func()
	once  sync.Once
}

func newPool(n int) *pool {
	p := &pool{n: n, tasks: make(chan func(), n)}
	for i := 1; i < n; i++ {
		go func() {
			for f := range p.tasks {
				f()
			}
		}()
	}
	return p
}

func (p *pool) close() { p.once.Do(func() { close(p.tasks) }) }

// run calls fn(c) for every chunk c in [0, chunks), spread over the pool. It returns when all
// chunks are done. The caller works too, and only waits for chunks that were claimed, so nested
// use cannot deadlock.
func (p *pool) run(chunks int, fn func(c int)) {
	if chunks <= 0 {
		return
	}
	if chunks == 1 || p.n == 1 {
		for c := 0; c < chunks; c++ {
			fn(c)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	wg.Add(chunks)
	work := func() {
		for {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return
			}
			fn(c)
			wg.Done()
		}
	}
	for i := 1; i < min(p.n, chunks); i++ {
		select {
		case p.tasks <- work:
		default: // every worker busy: the caller and whoever is free share the chunks
		}
	}
	work()
	wg.Wait()
}

// rows splits n items into chunks of size per, calling fn(lo, hi) for each chunk in parallel.
func (p *pool) rows(n, per int, fn func(lo, hi int)) {
	if per < 1 {
		per = 1
	}
	chunks := (n + per - 1) / per
	p.run(chunks, func(c int) {
		lo := c * per
		fn(lo, min(lo+per, n))
	})
}
