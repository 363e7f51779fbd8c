package profile

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/internal/profilekeys"
)

// Op classes: every backend op belongs to exactly one. The names are internal/profilekeys',
// which clients share.
const (
	ClassMatmul        = profilekeys.ClassMatmul
	ClassExpertGEMM    = profilekeys.ClassExpertGEMM
	ClassAttention     = profilekeys.ClassAttention
	ClassNorm          = profilekeys.ClassNorm
	ClassRoPE          = profilekeys.ClassRoPE
	ClassEmbedding     = profilekeys.ClassEmbedding
	ClassMLPActivation = profilekeys.ClassMLPActivation
	ClassLoss          = profilekeys.ClassLoss
	ClassRouter        = profilekeys.ClassRouter
	ClassPermute       = profilekeys.ClassPermute
	ClassCombine       = profilekeys.ClassCombine
	ClassOptimizer     = profilekeys.ClassOptimizer
	ClassOther         = profilekeys.ClassOther
)

// Classes lists the op classes in display order.
var Classes = profilekeys.Classes

// Collective kinds, for communication spans (internal/profilekeys' names).
const (
	CommAllToAllDispatch = profilekeys.CommAllToAllDispatch
	CommAllToAllCombine  = profilekeys.CommAllToAllCombine
	CommAllGather        = profilekeys.CommAllGather
	CommReduceScatter    = profilekeys.CommReduceScatter
	CommAllReduce        = profilekeys.CommAllReduce
	CommBroadcast        = profilekeys.CommBroadcast
	CommP2P              = profilekeys.CommP2P
	CommBarrier          = profilekeys.CommBarrier
)

// CommKinds lists the collective kinds in display order.
var CommKinds = profilekeys.CommKinds

// Span is one timed piece of work inside a step.
type Span struct {
	Name  string        // op or collective name, e.g. "LinearBackward", "all_reduce"
	Class string        // op class (compute) or collective kind (communication)
	Comm  bool          // a collective rather than a compute op
	Start time.Duration // from the start of the step
	Dur   time.Duration
	Bytes int64 // bytes of the operands (0 when unknown)
	FLOPs int64 // floating-point operations (0 when not counted)
	Group string
}

// Step is the accounting of one profiled step.
type Step struct {
	Step    int                      // step number (as the caller numbers it)
	Wall    time.Duration            // measured wall time of the step
	Compute map[string]time.Duration // by op class
	Comm    map[string]time.Duration // by collective kind (empty on one device)
	// CommBytes is the bytes of this device's operands in each collective kind (what it
	// contributes, as comm.Stats counts them; empty on one device).
	CommBytes map[string]int64
	Host      time.Duration // Wall minus every span: host work and idle
	Ops       int
	// Syncs counts the times the host waited for the device during the step: the device's
	// own count when its backend has a SyncCounter (Optional.Syncs: every stream, event and
	// download wait), else the downloads and Syncs that passed through the wrapper. Waits of
	// the profiler itself (the fallback's Sync after each op, reading the device times at
	// EndStep) are not counted.
	Syncs int64
	Bytes int64
	FLOPs int64
	Spans []Span // kept only when the recorder keeps spans (for traces)
	// DroppedSpans counts spans not kept because the step had more than MaxSpans.
	DroppedSpans int
}

// Sum is the total of the parts: every compute class, every collective kind and host time. It
// equals Wall unless the spans overlapped or exceeded the wall time, in which case Host is 0
// and Sum exceeds Wall.
func (s Step) Sum() time.Duration {
	t := s.Host
	for _, d := range s.Compute {
		t += d
	}
	for _, d := range s.Comm {
		t += d
	}
	return t
}

// MaxSpans bounds the spans one step keeps for a trace; beyond it only the totals grow.
const MaxSpans = 1 << 18

// Recorder collects spans while on. BeginStep, Record and EndStep are called from the goroutine
// that runs the step (the device's goroutine); Enable, Enabled and Steps may be called from any
// goroutine.
type Recorder struct {
	mode      atomic.Uint32 // modeRecord | modeCapture; 0 is the fast path
	keepSpans atomic.Bool
	acts      []Activation // guarded by mu

	// timer, when set (TimeOnDevice), times ops on the device while a step is recorded: inStep
	// says one is; marked holds its ops' marks until EndStep reads them.
	timer    atomic.Pointer[deviceTimerBox]
	inStep   atomic.Bool
	stepMark backend.TimeMark
	marked   []markedSpan

	// syncs, when set (Wrap found an Optional.Syncs), is the device's count of host waits;
	// syncsAt is its value when the current step began. waits counts the downloads and Syncs
	// through the wrapper during the current step (the fallback).
	syncs   atomic.Pointer[syncCounterBox]
	syncsAt int64
	waits   atomic.Int64

	mu      sync.Mutex
	cur     *Step
	start   time.Time
	steps   []Step
	opTimes map[string]time.Duration // since ResetOpTimes, for the trainer's per-step split
}

const (
	modeRecord  = 1 << iota // record spans
	modeCapture             // summarise forward outputs
)

type deviceTimerBox struct{ t backend.DeviceTimer }

type syncCounterBox struct{ c backend.SyncCounter }

// CountSyncs makes the recorder report each step's host waits from c (a device's own count,
// backend.Optional.Syncs); nil counts the downloads and Syncs through the wrapper instead.
// Wrap calls it when the inner backend has a SyncCounter and the recorder has none yet.
func (r *Recorder) CountSyncs(c backend.SyncCounter) {
	if c == nil {
		r.syncs.Store(nil)
		return
	}
	r.syncs.Store(&syncCounterBox{c})
}

// noteWait counts one host wait of the wrapper (a download or a Sync) in the current step.
func (r *Recorder) noteWait() {
	if r.mode.Load()&modeRecord != 0 && r.syncs.Load() == nil {
		r.waits.Add(1)
	}
}

// markedSpan is a span whose duration lies between two device marks.
type markedSpan struct {
	sp       Span
	from, to backend.TimeMark
}

// TimeOnDevice makes the recorder time the ops of recorded steps on the device with t (the
// backend the profiled backend wraps, when it implements backend.DeviceTimer): ops no longer wait
// for the device one by one, so a profiled step runs as fast as an unprofiled one and each span
// is the op's time on the device rather than its host round trip. Spans outside a step, and
// collectives, keep the host clock. A nil t restores host timing.
func (r *Recorder) TimeOnDevice(t backend.DeviceTimer) {
	if t == nil {
		r.timer.Store(nil)
		return
	}
	r.timer.Store(&deviceTimerBox{t})
}

// DeviceTimed reports whether TimeOnDevice set a timer.
func (r *Recorder) DeviceTimed() bool { return r.timer.Load() != nil }

// deviceTimer is the timer to use for an op now: set, recording, inside a step.
func (r *Recorder) deviceTimer() backend.DeviceTimer {
	if r.mode.Load()&modeRecord == 0 || !r.inStep.Load() {
		return nil
	}
	if b := r.timer.Load(); b != nil {
		return b.t
	}
	return nil
}

// recordMarked takes the end mark of sp, which started at from, and keeps sp for EndStep; false
// when no step is being timed on the device or the mark cannot be taken (the caller then times
// sp on the host).
func (r *Recorder) recordMarked(sp Span, from backend.TimeMark) bool {
	t := r.deviceTimer()
	if t == nil {
		return false
	}
	to, err := t.Mark()
	if err != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil || r.stepMark == 0 {
		t.Release(to)
		return false
	}
	r.marked = append(r.marked, markedSpan{sp, from, to})
	return true
}

// release hands back a mark that will not be read (zero is no mark).
func (r *Recorder) release(m backend.TimeMark) {
	if m == 0 {
		return
	}
	if b := r.timer.Load(); b != nil {
		b.t.Release(m)
	}
}

// NewRecorder returns a recorder that is off.
func NewRecorder() *Recorder { return &Recorder{opTimes: map[string]time.Duration{}} }

// Enable turns recording on or off; keepSpans keeps every span of each step (for Trace).
func (r *Recorder) Enable(on, keepSpans bool) {
	r.keepSpans.Store(keepSpans)
	for {
		old := r.mode.Load()
		m := old &^ modeRecord
		if on {
			m |= modeRecord
		}
		if r.mode.CompareAndSwap(old, m) {
			return
		}
	}
}

// Enabled reports whether recording is on.
func (r *Recorder) Enabled() bool { return r.mode.Load()&modeRecord != 0 }

// BeginStep starts accounting step n (a no-op while off).
func (r *Recorder) BeginStep(n int) {
	if !r.Enabled() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur = &Step{Step: n, Compute: map[string]time.Duration{}, Comm: map[string]time.Duration{}, CommBytes: map[string]int64{}}
	r.waits.Store(0)
	if c := r.syncs.Load(); c != nil {
		r.syncsAt = c.c.HostSyncs()
	}
	r.releaseMarksLocked()
	if b := r.timer.Load(); b != nil {
		if m, err := b.t.Mark(); err == nil {
			r.stepMark = m
			r.inStep.Store(true)
		}
	}
	r.start = time.Now()
}

// releaseMarksLocked hands back the marks of the current step's device-timed spans unread.
func (r *Recorder) releaseMarksLocked() {
	r.inStep.Store(false)
	b := r.timer.Load()
	if b != nil {
		for _, m := range r.marked {
			b.t.Release(m.from, m.to)
		}
		if r.stepMark != 0 {
			b.t.Release(r.stepMark)
		}
	}
	r.marked, r.stepMark = nil, 0
}

// resolveMarksLocked waits for the device to finish the current step's marked spans, notes the
// time it did (returned: the step's end), then reads the spans' device times and adds them to
// the step; a span whose marks cannot be read is dropped and counted in the step's DroppedSpans.
func (r *Recorder) resolveMarksLocked() time.Time {
	b := r.timer.Load()
	if b == nil || len(r.marked) == 0 {
		r.releaseMarksLocked()
		return time.Now()
	}
	_, _ = b.t.Elapsed(r.stepMark, r.marked[len(r.marked)-1].to) // waits for the last op
	end := time.Now()
	for _, m := range r.marked {
		sp := m.sp
		d, err := b.t.Elapsed(m.from, m.to)
		if err != nil {
			r.cur.DroppedSpans++
			continue
		}
		sp.Dur = d
		var at time.Duration
		if r.keepSpans.Load() {
			at, _ = b.t.Elapsed(r.stepMark, m.from)
		}
		r.addLocked(sp, at)
	}
	r.releaseMarksLocked()
	return end
}

// EndStep finishes the current step: its wall time is the time since BeginStep and its host
// time the part of it no span covers. It returns the step and keeps it for Steps; ok is false
// when no step was begun.
//
// With device timing (TimeOnDevice) it first waits for the device to finish the step's ops and
// reads their times; the wall time runs to the end of that work (reading the times is not
// counted). A span whose marks cannot be read is dropped (Step.DroppedSpans counts it).
func (r *Recorder) EndStep() (Step, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		r.releaseMarksLocked()
		return Step{}, false
	}
	syncs := r.waits.Load()
	if c := r.syncs.Load(); c != nil {
		syncs = c.c.HostSyncs() - r.syncsAt // before the waits of reading the marks
	}
	end := r.resolveMarksLocked() // reading the marks afterwards is not part of the step
	s := *r.cur
	s.Syncs = syncs
	r.cur = nil
	s.Wall = end.Sub(r.start)
	var covered time.Duration
	for _, d := range s.Compute {
		covered += d
	}
	for _, d := range s.Comm {
		covered += d
	}
	s.Host = max(0, s.Wall-covered)
	r.steps = append(r.steps, s)
	return s, true
}

// AbortStep drops the current step (it failed).
func (r *Recorder) AbortStep() {
	r.mu.Lock()
	r.cur = nil
	r.releaseMarksLocked()
	r.mu.Unlock()
}

// Steps returns the steps ended since the last call and forgets them.
func (r *Recorder) Steps() []Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.steps
	r.steps = nil
	return s
}

// Record adds a span that started at start and lasted dur. Spans outside a step count only
// toward OpTimes.
func (r *Recorder) Record(sp Span, start time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addLocked(sp, start.Sub(r.start))
}

// addLocked adds sp, which started at in the current step, to OpTimes and to the step.
func (r *Recorder) addLocked(sp Span, at time.Duration) {
	if !sp.Comm {
		r.opTimes[sp.Class] += sp.Dur
	} else {
		r.opTimes["comm."+sp.Class] += sp.Dur
	}
	s := r.cur
	if s == nil {
		return
	}
	if sp.Comm {
		s.Comm[sp.Class] += sp.Dur
		if s.CommBytes == nil {
			s.CommBytes = map[string]int64{}
		}
		s.CommBytes[sp.Class] += sp.Bytes
	} else {
		s.Compute[sp.Class] += sp.Dur
	}
	s.Ops++
	s.Bytes += sp.Bytes
	s.FLOPs += sp.FLOPs
	if r.keepSpans.Load() {
		if len(s.Spans) < MaxSpans {
			sp.Start = at
			s.Spans = append(s.Spans, sp)
		} else {
			s.DroppedSpans++
		}
	}
}

// Collective times fn as a communication span of the given kind while recording is on, and
// just runs it otherwise. Communicators call it around each collective.
func (r *Recorder) Collective(kind, group string, bytes int64, fn func() error) error {
	if !r.Enabled() {
		return fn()
	}
	start := time.Now()
	err := fn()
	r.Record(Span{Name: kind, Class: kind, Comm: true, Dur: time.Since(start), Bytes: bytes, Group: group}, start)
	return err
}

// OpTimes returns compute time per op class (and "comm.KIND" per collective kind) since the
// last ResetOpTimes; engine/train's OpTimer capability, so that step metrics carry the split
// while profiling is on.
func (r *Recorder) OpTimes() map[string]time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]time.Duration, len(r.opTimes))
	for k, v := range r.opTimes {
		m[k] = v
	}
	return m
}

// ResetOpTimes clears OpTimes.
func (r *Recorder) ResetOpTimes() {
	r.mu.Lock()
	clear(r.opTimes)
	r.mu.Unlock()
}

// traceEvent is one Chrome trace event ("X": a complete event with a duration).
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`  // microseconds
	Dur  float64        `json:"dur"` // microseconds
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// Trace tracks in a trace: steps, compute ops, collectives.
const (
	traceTidStep    = 1
	traceTidCompute = 2
	traceTidComm    = 3
)

// WriteTrace writes steps as a Chrome/Perfetto trace (JSON object format, loadable in
// ui.perfetto.dev and chrome://tracing): one track of steps, one of compute ops and one of
// collectives, the steps laid end to end.
func WriteTrace(w io.Writer, steps []Step) error {
	evs := []traceEvent{}
	meta := func(tid int, name string) {
		evs = append(evs, traceEvent{Name: "thread_name", Ph: "M", Pid: 1, Tid: tid, Args: map[string]any{"name": name}})
	}
	evs = append(evs, traceEvent{Name: "process_name", Ph: "M", Pid: 1, Args: map[string]any{"name": "halo-shell"}})
	meta(traceTidStep, "steps")
	meta(traceTidCompute, "compute")
	meta(traceTidComm, "communication")
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	var off time.Duration
	for _, s := range steps {
		args := map[string]any{"host_us": us(s.Host), "ops": s.Ops}
		for _, c := range sortedKeys(s.Compute) {
			args[c+"_us"] = us(s.Compute[c])
		}
		for _, c := range sortedKeys(s.Comm) {
			args["comm_"+c+"_us"] = us(s.Comm[c])
		}
		evs = append(evs, traceEvent{Name: fmt.Sprintf("step %d", s.Step), Cat: "step", Ph: "X", Ts: us(off), Dur: us(s.Wall), Pid: 1, Tid: traceTidStep, Args: args})
		for _, sp := range s.Spans {
			tid := traceTidCompute
			if sp.Comm {
				tid = traceTidComm
			}
			var a map[string]any
			if sp.Bytes > 0 || sp.FLOPs > 0 || sp.Group != "" {
				a = map[string]any{}
				if sp.Bytes > 0 {
					a["bytes"] = sp.Bytes
				}
				if sp.FLOPs > 0 {
					a["flops"] = sp.FLOPs
				}
				if sp.Group != "" {
					a["group"] = sp.Group
				}
			}
			evs = append(evs, traceEvent{Name: sp.Name, Cat: sp.Class, Ph: "X", Ts: us(off + sp.Start), Dur: us(sp.Dur), Pid: 1, Tid: tid, Args: a})
		}
		off += s.Wall
	}
	enc := json.NewEncoder(w)
	return enc.Encode(struct {
		TraceEvents     []traceEvent `json:"traceEvents"`
		DisplayTimeUnit string       `json:"displayTimeUnit"`
	}{evs, "ms"})
}

func sortedKeys(m map[string]time.Duration) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Activation summarises the output of one forward op.
type Activation struct {
	Seq    int    // order among the captured ops, from 0
	Op     string // op name, e.g. "Linear", "Attention", "Add"
	Class  string
	Shape  []int
	Mean   float64
	Std    float64
	RMS    float64
	MaxAbs float64
	NaN    int64
	Inf    int64
}

// StartCapture summarises the output of every forward op from now until the loss op (the end
// of the forward pass) or StopCapture, dropping what an earlier capture kept.
func (r *Recorder) StartCapture() {
	r.mu.Lock()
	r.acts = nil
	r.mu.Unlock()
	for {
		old := r.mode.Load()
		if r.mode.CompareAndSwap(old, old|modeCapture) {
			return
		}
	}
}

func (r *Recorder) stopCapture() {
	for {
		old := r.mode.Load()
		if r.mode.CompareAndSwap(old, old&^modeCapture) {
			return
		}
	}
}

// StopCapture ends a capture and returns the activations it summarised.
func (r *Recorder) StopCapture() []Activation {
	r.stopCapture()
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.acts
	r.acts = nil
	return a
}

// Summary holds the statistics of a tensor's finite values; NaN and Inf values are counted
// apart and left out of the others.
type Summary struct {
	Mean, Std, RMS, MaxAbs float64
	NaN, Inf               int64
}

// Summarize computes the Summary of v in float64.
func Summarize(v []float32) Summary {
	var s Summary
	var sum, sq float64
	n := 0
	for _, x := range v {
		f := float64(x)
		switch {
		case math.IsNaN(f):
			s.NaN++
			continue
		case math.IsInf(f, 0):
			s.Inf++
			continue
		}
		n++
		sum += f
		sq += f * f
		s.MaxAbs = max(s.MaxAbs, math.Abs(f))
	}
	if n > 0 {
		s.Mean = sum / float64(n)
		s.RMS = math.Sqrt(sq / float64(n))
		s.Std = math.Sqrt(max(0, sq/float64(n)-s.Mean*s.Mean))
	}
	return s
}

// maxActivations bounds one capture.
const maxActivations = 1 << 16

func (r *Recorder) addActivation(op, class string, shape []int, v []float32) {
	st := Summarize(v)
	a := Activation{Op: op, Class: class, Shape: append([]int(nil), shape...),
		Mean: st.Mean, Std: st.Std, RMS: st.RMS, MaxAbs: st.MaxAbs, NaN: st.NaN, Inf: st.Inf}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.acts) < maxActivations {
		a.Seq = len(r.acts)
		r.acts = append(r.acts, a)
	}
}

// MeanSteps merges one step's accounting from several devices (the ranks of a parallel plan):
// wall, host, per-class compute and per-kind communication times and bytes are the means over
// devices, op, sync, byte and FLOP counts the sums, and the spans (and their drop count) the first device's.
// One step is returned as it is.
func MeanSteps(steps []Step) Step {
	if len(steps) == 1 {
		return steps[0]
	}
	n := time.Duration(len(steps))
	out := Step{Step: steps[0].Step, Compute: map[string]time.Duration{}, Comm: map[string]time.Duration{}, CommBytes: map[string]int64{},
		Spans: steps[0].Spans, DroppedSpans: steps[0].DroppedSpans}
	for _, s := range steps {
		out.Wall += s.Wall
		out.Host += s.Host
		for k, d := range s.Compute {
			out.Compute[k] += d
		}
		for k, d := range s.Comm {
			out.Comm[k] += d
		}
		for k, b := range s.CommBytes {
			out.CommBytes[k] += b
		}
		out.Ops += s.Ops
		out.Syncs += s.Syncs
		out.Bytes += s.Bytes
		out.FLOPs += s.FLOPs
	}
	out.Wall /= n
	out.Host /= n
	for k := range out.Compute {
		out.Compute[k] /= n
	}
	for k := range out.Comm {
		out.Comm[k] /= n
	}
	for k := range out.CommBytes {
		out.CommBytes[k] /= int64(len(steps))
	}
	return out
}
