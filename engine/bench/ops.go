package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The operations MeasureOp times, with the sizes each takes (OpRequest.Sizes).
const (
	OpGEMM           = "gemm"             // M N K: C[M,N] = A[M,K] @ B[K,N]
	OpCopy           = "copy"             // bytes: a device-to-device copy (rounded up to whole elements)
	OpLaunch         = "launch"           // none: Scale on a single element, the cost of issuing one op
	OpAddRMSNorm     = "add_rmsnorm"      // N C: Optional().AddRMSNorm, the fused residual add and RMSNorm
	OpAddThenRMSNorm = "add_then_rmsnorm" // N C: Add, then RMSNorm (the fallback of the fused op)
	OpAttention      = "attention"        // T NH HD: causal attention forward over one sequence of T tokens
	OpInfo           = "info"             // none: the device only, nothing is timed
)

// opSizes names the sizes of each op, in order.
var opSizes = map[string][]string{
	OpGEMM: {"M", "N", "K"}, OpCopy: {"bytes"}, OpLaunch: nil, OpAddRMSNorm: {"N", "C"},
	OpAddThenRMSNorm: {"N", "C"}, OpAttention: {"T", "NH", "HD"}, OpInfo: nil,
}

// Ops returns the op names MeasureOp knows, sorted.
func Ops() []string {
	var ks []string
	for k := range opSizes {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// maxOpsPerSample bounds the ops of one timed sample.
const maxOpsPerSample = 1 << 16

// MaxOpBytes bounds the device memory one measurement allocates (16 GiB), and the device's
// capacity bounds it further where the backend reports one.
const MaxOpBytes = 16 << 30

// OpRequest is one measurement.
type OpRequest struct {
	Op    string
	Sizes []int64
	// DType is the element type of the operands: F32 (the default, for the zero value) or BF16.
	DType tensor.DType
	// Repeats is the number of timed samples (default 5).
	Repeats int
	// MinSample is the least time one sample runs (default 10ms): ops are repeated back to
	// back until a sample lasts that long, so that the host clock and the final sync are a
	// small part of it.
	MinSample time.Duration
	// MaxTotal bounds the timed part of the measurement (default 2s): fewer samples are taken
	// when one op is slower than MaxTotal/Repeats.
	MaxTotal time.Duration
	// Args are real-valued arguments, for the callers that route the numerics experiments
	// (MeasureRounding, MeasureRoPE) through one request; MeasureOp ignores them.
	Args []float64
}

// OpResult is what a measurement found. Times are per op.
type OpResult struct {
	Device       string
	Op           string
	Sizes        []int64
	DType        tensor.DType
	Samples      []time.Duration // per-op time of each sample
	Median       time.Duration
	OpsPerSample int
	// FLOPs and Bytes are the work of one op: floating-point operations and the least bytes
	// it must read and write in device memory (each operand once).
	FLOPs, Bytes float64
	// DeviceMemory is the device's capacity (0 when unknown); HostThreads the process's
	// GOMAXPROCS.
	DeviceMemory int64
	HostThreads  int
	// Props are the device's sizes (SMs and L2 of a GPU, workers and last-level cache of the
	// CPU), zero where the backend does not report them.
	Props backend.DeviceProps
	// DeviceFastest is the fastest per-op time the device itself took, read from device marks
	// around a batch of ops queued behind a long copy, so that the host's cost of issuing each
	// op is hidden (0 on backends without a device timer, whose ops run as they are issued).
	// For an op shorter than its launch it is what the op costs inside a stream of work, where
	// the sample times are the launch rate.
	DeviceFastest time.Duration
}

// TFLOPS is FLOPs per median time, in TFLOP/s (0 when the op does no arithmetic).
func (r OpResult) TFLOPS() float64 {
	if r.Median <= 0 {
		return 0
	}
	return r.FLOPs / r.Median.Seconds() / 1e12
}

// GBPerS is Bytes per median time, in GB/s (1e9 bytes).
func (r OpResult) GBPerS() float64 {
	if r.Median <= 0 {
		return 0
	}
	return r.Bytes / r.Median.Seconds() / 1e9
}

// ErrNoFusedOp is returned (wrapped) when a fused op is asked of a backend that lacks it.
var ErrNoFusedOp = errors.New("bench: the backend has no such fused op")

// ErrBadOp is returned (wrapped) for an unknown op, wrong sizes, a bad dtype or sizes too
// large for the device.
var ErrBadOp = errors.New("bench: bad measurement request")

func badOp(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadOp, fmt.Sprintf(format, args...))
}

// MeasureOp times one op on b at the sizes of r: it allocates the operands (filled with
// small constants), runs the op once untimed, calibrates how many ops one sample holds, then
// times Repeats samples, each ops back to back followed by one Sync (so on an asynchronous
// device a sample is the device's throughput of that op, launch costs included). It frees
// what it allocated. It must be called from the goroutine that owns b.
func MeasureOp(ctx context.Context, b backend.Backend, r OpRequest) (OpResult, error) {
	names, ok := opSizes[r.Op]
	if !ok {
		return OpResult{}, badOp("unknown op %q (known: %s)", r.Op, strings.Join(Ops(), ", "))
	}
	if len(r.Sizes) != len(names) {
		want := "no sizes"
		if len(names) > 0 {
			want = strings.Join(names, " ")
		}
		return OpResult{}, badOp("op %s takes %s, got %d sizes %v", r.Op, want, len(r.Sizes), r.Sizes)
	}
	for i, s := range r.Sizes {
		if s <= 0 || s > 1<<34 {
			return OpResult{}, badOp("op %s: size %s = %d: want 1 .. 2^34", r.Op, names[i], s)
		}
	}
	if r.DType == tensor.Invalid {
		r.DType = tensor.F32
	}
	switch r.DType {
	case tensor.F32, tensor.BF16:
	default:
		return OpResult{}, badOp("op %s: dtype %s: want f32 or bf16", r.Op, r.DType)
	}
	if r.Repeats <= 0 {
		r.Repeats = 5
	}
	r.Repeats = min(r.Repeats, 1000)
	if r.MinSample <= 0 {
		r.MinSample = 10 * time.Millisecond
	}
	if r.MaxTotal <= 0 {
		r.MaxTotal = 2 * time.Second
	}
	res := OpResult{Device: b.Name(), Op: r.Op, Sizes: slices.Clone(r.Sizes), DType: r.DType,
		DeviceMemory: b.MemStats().Total, HostThreads: runtime.GOMAXPROCS(0), Props: backend.PropsOf(b)}
	if r.Op == OpInfo {
		return res, nil
	}
	o := &opRun{b: b, dt: r.DType}
	defer o.free()
	run, err := o.prepare(r.Op, r.Sizes, &res)
	if err != nil {
		return OpResult{}, err
	}
	if err := run(); err != nil {
		return OpResult{}, fmt.Errorf("bench: op %s %v: %w", r.Op, r.Sizes, err)
	}
	if err := b.Sync(); err != nil {
		return OpResult{}, fmt.Errorf("bench: op %s %v: %w", r.Op, r.Sizes, err)
	}
	// Calibrate: time one op, then size the batch from the time per op until a whole batch
	// lasts MinSample (a few rounds: the first ops of a cold device run slower).
	n := 1
	one, err := timeOps(b, run, n)
	if err != nil {
		return OpResult{}, fmt.Errorf("bench: op %s %v: %w", r.Op, r.Sizes, err)
	}
	for round := 0; one*time.Duration(n) < r.MinSample && n < maxOpsPerSample && round < 4; round++ {
		n = min(maxOpsPerSample, max(2*n, int(r.MinSample/max(one, time.Nanosecond))+1))
		if one, err = timeOps(b, run, n); err != nil {
			return OpResult{}, fmt.Errorf("bench: op %s %v: %w", r.Op, r.Sizes, err)
		}
	}
	repeats := r.Repeats
	if per := one * time.Duration(n); per > 0 {
		repeats = max(1, min(repeats, int(r.MaxTotal/per)))
	}
	res.OpsPerSample = n
	for range repeats {
		if err := ctx.Err(); err != nil {
			return OpResult{}, fmt.Errorf("bench: op %s: %w", r.Op, err)
		}
		d, err := timeOps(b, run, n)
		if err != nil {
			return OpResult{}, fmt.Errorf("bench: op %s %v: %w", r.Op, r.Sizes, err)
		}
		res.Samples = append(res.Samples, d)
	}
	if t := b.Optional().Timer; t != nil {
		// Each device sample runs deviceBatch+1 ops and a copy; MaxTotal bounds them too.
		samples := max(1, min(repeats, int(r.MaxTotal/(time.Duration(deviceBatch+1)*max(one, time.Nanosecond)))))
		if res.DeviceFastest, err = o.deviceTime(t, run, samples); err != nil {
			return OpResult{}, fmt.Errorf("bench: op %s %v: device time: %w", r.Op, r.Sizes, err)
		}
	}
	s := slices.Clone(res.Samples)
	slices.Sort(s)
	res.Median = s[len(s)/2]
	if len(s)%2 == 0 {
		res.Median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return res, nil
}

// timeOps runs n ops back to back and a Sync, and returns the time per op.
func timeOps(b backend.Backend, run func() error, n int) (time.Duration, error) {
	start := time.Now()
	for range n {
		if err := run(); err != nil {
			return 0, err
		}
	}
	if err := b.Sync(); err != nil {
		return 0, err
	}
	return time.Since(start) / time.Duration(n), nil
}

// deviceBatch is the ops between the marks of one device-timed sample, and busyBytes the
// copy queued ahead of them: long enough (tens of microseconds at several TB/s) that the host
// has issued the marks and the ops before the device reaches them, so that they run back to
// back.
const (
	deviceBatch = 8
	busyBytes   = 256 << 20
)

// deviceTime returns the fastest device time per op over samples batches: each batch is
// queued behind a copy of busyBytes, one op (to warm caches after the copy), then deviceBatch
// ops between two marks. It returns 0 (no device time) when the copy's buffers do not fit the
// measurement's budget beside the op's operands.
func (o *opRun) deviceTime(t backend.DeviceTimer, run func() error, samples int) (time.Duration, error) {
	n := busyBytes / o.dt.Size()
	src, err := o.tensor("busy copy", o.dt, 1, n)
	if errors.Is(err, ErrBadOp) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	dst, err := o.tensor("busy copy", o.dt, 0, n)
	if errors.Is(err, ErrBadOp) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var best time.Duration
	for range samples {
		if err := o.b.Copy(dst, src); err != nil {
			return 0, err
		}
		if err := run(); err != nil {
			return 0, err
		}
		from, err := t.Mark()
		if err != nil {
			return 0, err
		}
		for range deviceBatch {
			if err = run(); err != nil {
				break
			}
		}
		var to backend.TimeMark
		if err == nil {
			to, err = t.Mark()
		}
		var d time.Duration
		if err == nil {
			d, err = t.Elapsed(from, to)
		}
		t.Release(from, to)
		if err != nil {
			return 0, err
		}
		if per := d / deviceBatch; best == 0 || per < best {
			best = per
		}
	}
	return best, nil
}

// opRun holds the operands of one measurement.
type opRun struct {
	b     backend.Backend
	dt    tensor.DType
	alloc []tensor.Tensor
	bytes int64
}

func (o *opRun) free() {
	for _, t := range o.alloc {
		_ = o.b.Free(t)
	}
}

// budget checks that n more bytes fit in MaxOpBytes and the device.
func (o *opRun) budget(op string, n int64) error {
	o.bytes += n
	limit := int64(MaxOpBytes)
	if total := o.b.MemStats().Total; total > 0 {
		limit = min(limit, total/2)
	}
	if o.bytes > limit {
		return badOp("op %s needs %s of operands, more than this measurement may take on %s (%s)",
			op, humanBytes(o.bytes), o.b.Name(), humanBytes(limit))
	}
	return nil
}

func humanBytes(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// tensor allocates a tensor filled with v.
func (o *opRun) tensor(op string, dt tensor.DType, v float32, shape ...int) (tensor.Tensor, error) {
	n := int64(dt.Size())
	for _, s := range shape {
		n *= int64(s)
	}
	if err := o.budget(op, n); err != nil {
		return tensor.Tensor{}, err
	}
	t, err := o.b.Alloc(dt, shape...)
	if err != nil {
		return tensor.Tensor{}, fmt.Errorf("bench: op %s: %w", op, err)
	}
	o.alloc = append(o.alloc, t)
	if v != 0 {
		if err := o.b.Fill(t, v); err != nil {
			return tensor.Tensor{}, fmt.Errorf("bench: op %s: %w", op, err)
		}
	}
	return t, nil
}

// prepare allocates the operands of op and returns the function that runs it once; it sets
// res's FLOPs and Bytes.
func (o *opRun) prepare(op string, sz []int64, res *OpResult) (func() error, error) {
	b, dt := o.b, o.dt
	es := float64(dt.Size())
	var ts []tensor.Tensor
	alloc := func(dt tensor.DType, v float32, shape ...int) error {
		t, err := o.tensor(op, dt, v, shape...)
		ts = append(ts, t)
		return err
	}
	switch op {
	case OpGEMM:
		m, n, k := int(sz[0]), int(sz[1]), int(sz[2])
		for _, s := range [][2]int{{m, k}, {k, n}, {m, n}} {
			if err := alloc(dt, 0.01, s[0], s[1]); err != nil {
				return nil, err
			}
		}
		res.FLOPs = 2 * float64(m) * float64(n) * float64(k)
		res.Bytes = es * (float64(m)*float64(k) + float64(k)*float64(n) + float64(m)*float64(n))
		args := backend.GEMMArgs{A: ts[0], B: ts[1], C: ts[2], Alpha: 1}
		return func() error { return b.GEMM(args) }, nil
	case OpCopy:
		n := int((sz[0] + int64(dt.Size()) - 1) / int64(dt.Size()))
		if err := alloc(dt, 1, n); err != nil {
			return nil, err
		}
		if err := alloc(dt, 0, n); err != nil {
			return nil, err
		}
		res.Bytes = 2 * es * float64(n)
		return func() error { return b.Copy(ts[1], ts[0]) }, nil
	case OpLaunch:
		if err := alloc(dt, 1, 1); err != nil {
			return nil, err
		}
		res.FLOPs, res.Bytes = 1, 2*es
		return func() error { return b.Scale(ts[0], 1) }, nil
	case OpAddRMSNorm, OpAddThenRMSNorm:
		n, c := int(sz[0]), int(sz[1])
		for range 4 { // x, residual (also residualOut), out
			if err := alloc(dt, 0.5, n, c); err != nil {
				return nil, err
			}
		}
		if err := alloc(dt, 1, c); err != nil { // w
			return nil, err
		}
		if err := alloc(tensor.F32, 0, n); err != nil { // rstd
			return nil, err
		}
		x, resid, resOut, out, w, rstd := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5]
		nc := float64(n) * float64(c)
		// Per element: the add, the square and sum, and the scale by rstd and w.
		res.FLOPs = 5 * nc
		if op == OpAddRMSNorm {
			fused := b.Optional().AddRMSNorm
			if fused == nil {
				return nil, fmt.Errorf("%w: %s has no AddRMSNorm (Optional); measure %s instead", ErrNoFusedOp, b.Name(), OpAddThenRMSNorm)
			}
			// Reads x and residual, writes residualOut and out.
			res.Bytes = 4*es*nc + es*float64(c) + 4*float64(n)
			return func() error { return fused(resOut, out, rstd, x, resid, w, 1e-6) }, nil
		}
		// Add reads two and writes one; RMSNorm reads the sum back and writes out.
		res.Bytes = 5*es*nc + es*float64(c) + 4*float64(n)
		return func() error {
			if err := b.Add(resOut, x, resid); err != nil {
				return err
			}
			return b.RMSNorm(out, rstd, resOut, w, 1e-6)
		}, nil
	case OpAttention:
		t, nh, hd := int(sz[0]), int(sz[1]), int(sz[2])
		for range 4 { // q, k, v, out
			if err := alloc(dt, 0.1, t, nh*hd); err != nil {
				return nil, err
			}
		}
		if err := alloc(tensor.F32, 0, t, nh); err != nil { // lse
			return nil, err
		}
		if err := alloc(tensor.I32, 0, 2); err != nil {
			return nil, err
		}
		cu := ts[5]
		if err := b.Upload(cu, tensor.EncodeInt32([]int32{0, int32(t)})); err != nil {
			return nil, fmt.Errorf("bench: op %s: %w", op, err)
		}
		// Causal: QK^T and PV each 2*T*T*HD per head, halved by the mask.
		res.FLOPs = 2 * float64(t) * float64(t) * float64(nh) * float64(hd)
		res.Bytes = 4*es*float64(t)*float64(nh*hd) + 4*float64(t)*float64(nh)
		args := backend.AttentionArgs{
			AttentionShape: backend.AttentionShape{CuSeqlens: cu, MaxSeqLen: t, NH: nh, NKV: nh, HD: hd},
			Q:              ts[0], K: ts[1], V: ts[2], Out: ts[3], LSE: ts[4],
		}
		return func() error { return b.Attention(args) }, nil
	}
	return nil, badOp("unknown op %q", op)
}
