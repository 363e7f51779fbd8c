package profile

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func mustF32(t *testing.T, b backend.Backend, shape ...int) T {
	t.Helper()
	n := tensor.Shape(shape).Numel()
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i%7) * 0.25
	}
	x, err := backend.FromFloat32(b, v, tensor.F32, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// ops runs a small forward and backward mix through b and returns the Linear output.
func ops(t *testing.T, b backend.Backend) []float32 {
	t.Helper()
	const m, k, o = 8, 16, 12
	x, w := mustF32(t, b, m, k), mustF32(t, b, o, k)
	out, _ := b.Alloc(tensor.F32, m, o)
	if err := b.Linear(out, x, w, T{}); err != nil {
		t.Fatal(err)
	}
	rstd, _ := b.Alloc(tensor.F32, m)
	nw := mustF32(t, b, o)
	normed, _ := b.Alloc(tensor.F32, m, o)
	if err := b.RMSNorm(normed, rstd, out, nw, 1e-6); err != nil {
		t.Fatal(err)
	}
	act, _ := b.Alloc(tensor.F32, m, o)
	if err := b.SwiGLU(act, normed, out); err != nil {
		t.Fatal(err)
	}
	dw, _ := b.Alloc(tensor.F32, o, k)
	dx, _ := b.Alloc(tensor.F32, m, k)
	if err := b.LinearBackward(backend.LinearBackwardArgs{DX: dx, DW: dw, DY: act, X: x, W: w}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SumSquares([]T{dw}); err != nil {
		t.Fatal(err)
	}
	v, err := backend.ToFloat32(b, act)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestWrapForwardsResults(t *testing.T) {
	in := cpu.New(cpu.Options{Workers: 1})
	want := ops(t, in)
	for _, on := range []bool{false, true} {
		rec := NewRecorder()
		rec.Enable(on, true)
		w := Wrap(cpu.New(cpu.Options{Workers: 1}), rec)
		if r, inner, ok := Unwrap(w); !ok || r != rec || inner == nil {
			t.Fatal("Unwrap did not return the recorder and inner backend")
		}
		got := ops(t, w)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("recording=%v: value %d = %v, want %v", on, i, got[i], want[i])
			}
		}
	}
}

// TestWrapRecordsFusedOps: the optional fused ops of the inner backend are reached through the
// wrapper's Optional and recorded like the required ops, with the class, bytes and FLOPs of
// backend's cost table.
func TestWrapRecordsFusedOps(t *testing.T) {
	rec := NewRecorder()
	rec.Enable(true, true)
	b := Wrap(cpu.New(cpu.Options{Workers: 1}), rec)
	opt := b.Optional()
	if opt.AddRMSNorm == nil || opt.AdamW == nil || opt.GroupedGEMM == nil {
		t.Fatal("the wrapped cpu backend lost its fused AddRMSNorm, AdamW or GroupedGEMM")
	}
	const n, c = 4, 8
	x, res, w := mustF32(t, b, n, c), mustF32(t, b, n, c), mustF32(t, b, c)
	out, _ := b.Alloc(tensor.F32, n, c)
	rstd, _ := b.Alloc(tensor.F32, n)
	p, g, m, v := mustF32(t, b, n*c), mustF32(t, b, n*c), mustF32(t, b, n*c), mustF32(t, b, n*c)
	adam := backend.AdamWArgs{Param: p, Grad: g, M: m, V: v, LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, Step: 1}
	// Two experts of [6, c] weights over the n rows, split 1 and n-1.
	const ng, no = 2, 6
	ew, eo := mustF32(t, b, ng, no, c), mustF32(t, b, n, no)
	off, _ := backend.FromInt32(b, []int32{0, 1, n}, ng+1)
	grouped := backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: x, B: ew, Out: eo, Offsets: off}
	rec.BeginStep(1)
	if err := opt.AddRMSNorm(res, out, rstd, x, res, w, 1e-6); err != nil {
		t.Fatal(err)
	}
	if err := opt.AdamW(adam); err != nil {
		t.Fatal(err)
	}
	if err := opt.GroupedGEMM(grouped); err != nil {
		t.Fatal(err)
	}
	st, ok := rec.EndStep()
	if !ok {
		t.Fatal("no step")
	}
	type got struct {
		name string
		cost backend.Cost
	}
	var spans []got
	for _, sp := range st.Spans {
		spans = append(spans, got{sp.Name, backend.Cost{FLOPs: sp.FLOPs, Bytes: sp.Bytes, Class: sp.Class}})
	}
	wantSpans := []got{
		{"AddRMSNorm", backend.AddRMSNormCost(res, out, rstd, x, res, w)},
		{"AdamW", backend.AdamWCost(adam)},
		{"GroupedGEMM.forward", backend.GroupedGEMMCost(grouped)},
	}
	if len(spans) != len(wantSpans) || spans[0] != wantSpans[0] || spans[1] != wantSpans[1] || spans[2] != wantSpans[2] {
		t.Fatalf("spans %+v, want %+v", spans, wantSpans)
	}
}

// minimal is a backend without optional capabilities.
type minimal struct{ backend.Backend }

func (minimal) Optional() backend.Optional { return backend.Optional{} }

func TestWrapDoesNotInventCapabilities(t *testing.T) {
	opt := reflect.ValueOf(Wrap(minimal{cpu.New(cpu.Options{Workers: 1})}, nil).Optional())
	for i := range opt.NumField() {
		if !opt.Field(i).IsNil() {
			t.Errorf("the wrapper claims an optional %s that the inner backend lacks", opt.Type().Field(i).Name)
		}
	}
}

func TestStepAccounting(t *testing.T) {
	tests := []struct {
		name      string
		on        bool
		wantSteps int
	}{
		{"recording on", true, 1},
		{"recording off", false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := NewRecorder()
			rec.Enable(tc.on, true)
			b := Wrap(cpu.New(cpu.Options{Workers: 1}), rec)
			rec.BeginStep(1)
			ops(t, b)
			time.Sleep(2 * time.Millisecond) // host time no op covers
			s, ok := rec.EndStep()
			steps := rec.Steps()
			if len(steps) != tc.wantSteps || ok != tc.on {
				t.Fatalf("steps = %d (ok %v), want %d", len(steps), ok, tc.wantSteps)
			}
			if !tc.on {
				if len(rec.OpTimes()) != 0 {
					t.Fatalf("op times recorded while off: %v", rec.OpTimes())
				}
				return
			}
			if s.Sum() != s.Wall {
				t.Fatalf("parts sum %v != wall %v", s.Sum(), s.Wall)
			}
			if s.Host < 2*time.Millisecond {
				t.Fatalf("host %v does not include the 2ms sleep", s.Host)
			}
			for _, c := range []string{ClassMatmul, ClassNorm, ClassMLPActivation, ClassOptimizer, ClassOther} {
				if s.Compute[c] <= 0 {
					t.Errorf("class %s has no time: %v", c, s.Compute)
				}
			}
			if len(s.Comm) != 0 {
				t.Errorf("communication on one device: %v", s.Comm)
			}
			// Linear 2*8*12*16 + LinearBackward 2*(2*8*12*16).
			if want := int64(3 * 2 * 8 * 12 * 16); s.FLOPs < want {
				t.Errorf("FLOPs = %d, want at least %d from the matmuls", s.FLOPs, want)
			}
			names := map[string]bool{}
			for _, sp := range s.Spans {
				names[sp.Name] = true
				if sp.Start < 0 || sp.Start+sp.Dur > s.Wall {
					t.Errorf("span %s [%v, +%v] outside the step (wall %v)", sp.Name, sp.Start, sp.Dur, s.Wall)
				}
			}
			for _, n := range []string{"Linear", "RMSNorm", "SwiGLU", "LinearBackward", "SumSquares", "Upload", "Download"} {
				if !names[n] {
					t.Errorf("no span for %s", n)
				}
			}
			if s.Ops != len(s.Spans) {
				t.Errorf("Ops %d != spans %d", s.Ops, len(s.Spans))
			}
		})
	}
}

func TestCollectiveIsCommunication(t *testing.T) {
	rec := NewRecorder()
	rec.Enable(true, true)
	rec.BeginStep(3)
	boom := errors.New("boom")
	if err := rec.Collective(CommAllReduce, "dp", 1024, func() error { time.Sleep(time.Millisecond); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := rec.Collective(CommAllToAllDispatch, "ep", 64, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("collective error = %v, want boom", err)
	}
	s, _ := rec.EndStep()
	if s.Comm[CommAllReduce] < time.Millisecond {
		t.Fatalf("all_reduce time %v", s.Comm[CommAllReduce])
	}
	if _, ok := s.Comm[CommAllToAllDispatch]; !ok {
		t.Fatal("failed collective not recorded")
	}
	if len(s.Compute) != 0 || s.Bytes != 1024+64 || s.Sum() != s.Wall {
		t.Fatalf("step %+v", s)
	}
}

func TestWriteTrace(t *testing.T) {
	rec := NewRecorder()
	rec.Enable(true, true)
	b := Wrap(cpu.New(cpu.Options{Workers: 1}), rec)
	for i := 1; i <= 2; i++ {
		rec.BeginStep(i)
		ops(t, b)
		_ = rec.Collective(CommAllGather, "fsdp", 8, func() error { return nil })
		rec.EndStep()
	}
	steps := rec.Steps()
	var buf bytes.Buffer
	if err := WriteTrace(&buf, steps); err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Name, Cat, Ph string
			Ts, Dur       float64
			Tid           int
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &tr); err != nil {
		t.Fatalf("trace is not JSON: %v", err)
	}
	var nSteps, nComm, nCompute int
	lastStepEnd := 0.0
	for _, e := range tr.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		switch e.Tid {
		case traceTidStep:
			nSteps++
			if e.Ts < lastStepEnd-1e-3 {
				t.Errorf("step %s starts at %v before the previous ended at %v", e.Name, e.Ts, lastStepEnd)
			}
			lastStepEnd = e.Ts + e.Dur
		case traceTidComm:
			nComm++
		case traceTidCompute:
			nCompute++
		}
	}
	if nSteps != 2 || nComm != 2 || nCompute != len(steps[0].Spans)+len(steps[1].Spans)-2 {
		t.Fatalf("trace has %d steps, %d collectives, %d compute events", nSteps, nComm, nCompute)
	}
}

func BenchmarkLinear(b *testing.B) {
	for _, bc := range []struct {
		name string
		wrap bool
		on   bool
	}{{"unwrapped", false, false}, {"wrapped-off", true, false}, {"wrapped-on", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			var be backend.Backend = cpu.New(cpu.Options{Workers: 1})
			rec := NewRecorder()
			if bc.wrap {
				be = Wrap(be, rec)
				rec.Enable(bc.on, false)
			}
			x, _ := be.Alloc(tensor.F32, 4, 8)
			w, _ := be.Alloc(tensor.F32, 8, 8)
			out, _ := be.Alloc(tensor.F32, 4, 8)
			rec.BeginStep(0)
			b.ResetTimer()
			for b.Loop() {
				if err := be.Linear(out, x, w, T{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestCaptureActivations(t *testing.T) {
	rec := NewRecorder()
	b := Wrap(cpu.New(cpu.Options{Workers: 1}), rec)
	rec.StartCapture()
	want := ops(t, b) // Linear, RMSNorm, SwiGLU forward; LinearBackward; SumSquares
	const v, c = 5, 12
	h, w := mustF32(t, b, 8, c), mustF32(t, b, v, c)
	tg, err := backend.FromInt32(b, []int32{0, 1, 2, 3, 4, 0, 1, 2}, 8)
	if err != nil {
		t.Fatal(err)
	}
	loss, _ := b.Alloc(tensor.F32, 8)
	if err := b.CrossEntropy(backend.CrossEntropyArgs{Hidden: h, Weight: w, Targets: tg, Loss: loss}); err != nil {
		t.Fatal(err)
	}
	// After the loss (the end of the forward pass) nothing more is captured.
	out, _ := b.Alloc(tensor.F32, 8, v)
	if err := b.Linear(out, h, w, T{}); err != nil {
		t.Fatal(err)
	}
	acts := rec.StopCapture()
	var ops []string
	for i, a := range acts {
		ops = append(ops, a.Op)
		if a.Seq != i {
			t.Fatalf("activation %d has seq %d", i, a.Seq)
		}
	}
	if got := strings.Join(ops, ","); got != "Linear,RMSNorm,SwiGLU" {
		t.Fatalf("captured %s, want the three forward ops before the loss", got)
	}
	sw := acts[2]
	var sum, sq, mx float64
	for _, x := range want {
		sum += float64(x)
		sq += float64(x) * float64(x)
		mx = max(mx, math.Abs(float64(x)))
	}
	n := float64(len(want))
	if math.Abs(sw.Mean-sum/n) > 1e-9 || math.Abs(sw.RMS-math.Sqrt(sq/n)) > 1e-9 || sw.MaxAbs != mx || sw.Shape[0] != 8 || sw.Shape[1] != 12 {
		t.Fatalf("SwiGLU stats %+v, want mean %g rms %g max %g", sw, sum/n, math.Sqrt(sq/n), mx)
	}
	if rec.Enabled() || len(rec.StopCapture()) != 0 {
		t.Fatal("capture left recording on or activations behind")
	}
}

// nop is a backend whose Fill does nothing, to measure the wrapper's own cost.
type nop struct{ backend.Backend }

func (nop) Optional() backend.Optional { return backend.Optional{} }

func (nop) Fill(T, float32) error { return nil }

// BenchmarkOverheadOff is the cost the wrapper adds to every op while profiling is off.
func BenchmarkOverheadOff(b *testing.B) {
	for _, bc := range []struct {
		name string
		be   backend.Backend
	}{{"direct", nop{}}, {"wrapped-off", Wrap(nop{}, nil)}} {
		b.Run(bc.name, func(b *testing.B) {
			var t T
			for b.Loop() {
				_ = bc.be.Fill(t, 0)
			}
		})
	}
}

// The communicators record collectives into a Recorder.
var _ comm.Recorder = (*Recorder)(nil)

// TestSummarizeCountsNonFiniteApart checks the tensor statistics: NaN and Inf are counted and
// left out of the mean, std, rms and max-abs of the finite values.
func TestSummarizeCountsNonFiniteApart(t *testing.T) {
	s := Summarize([]float32{1, -3, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))})
	if s.NaN != 1 || s.Inf != 2 {
		t.Fatalf("NaN %d Inf %d, want 1 and 2", s.NaN, s.Inf)
	}
	if s.Mean != -1 || s.MaxAbs != 3 || math.Abs(s.RMS-math.Sqrt(5)) > 1e-12 || math.Abs(s.Std-2) > 1e-12 {
		t.Fatalf("summary %+v, want mean -1, max abs 3, rms sqrt(5), std 2", s)
	}
	if z := Summarize(nil); z != (Summary{}) {
		t.Fatalf("empty summary %+v", z)
	}
}

// timedCPU is a CPU backend with a fake device clock: every op advances the clock by 1 ms per
// call it makes to the inner backend, and marks read the clock when taken. Syncs are counted.
type timedCPU struct {
	backend.Backend
	clock    time.Duration
	marks    map[backend.TimeMark]time.Duration
	next     backend.TimeMark
	syncs    int
	released map[backend.TimeMark]bool
	failFrom backend.TimeMark // Elapsed fails for marks at or after it (0: never)
	delay    time.Duration    // each Elapsed call takes this long on the host
}

func newTimedCPU() *timedCPU {
	return &timedCPU{Backend: cpu.New(cpu.Options{Workers: 1}), marks: map[backend.TimeMark]time.Duration{}, released: map[backend.TimeMark]bool{}}
}

func (b *timedCPU) Sync() error { b.syncs++; return b.Backend.Sync() }

// Optional adds the fake clock as the Timer to the CPU backend's capabilities.
func (b *timedCPU) Optional() backend.Optional {
	o := b.Backend.Optional()
	o.Timer = b
	return o
}

func (b *timedCPU) Linear(out, x, w, bias T) error {
	b.clock += 3 * time.Millisecond
	return b.Backend.Linear(out, x, w, bias)
}

func (b *timedCPU) RMSNorm(out, rstd, x, w T, eps float32) error {
	b.clock += time.Millisecond
	return b.Backend.RMSNorm(out, rstd, x, w, eps)
}

func (b *timedCPU) Mark() (backend.TimeMark, error) {
	b.next++
	b.marks[b.next] = b.clock
	return b.next, nil
}

func (b *timedCPU) Elapsed(from, to backend.TimeMark) (time.Duration, error) {
	time.Sleep(b.delay)
	if b.failFrom != 0 && to >= b.failFrom {
		return 0, errors.New("mark lost")
	}
	if b.released[from] || b.released[to] {
		return 0, errors.New("mark read after release")
	}
	return b.marks[to] - b.marks[from], nil
}

func (b *timedCPU) Release(marks ...backend.TimeMark) {
	for _, m := range marks {
		b.released[m] = true
	}
}

// TestDeviceTimedSteps: with TimeOnDevice, ops inside a recorded step are timed between device
// marks, none waits (no Sync), every mark is released, and outside a step (or with the timer
// removed) the host clock and a Sync per op come back.
func TestDeviceTimedSteps(t *testing.T) {
	in := newTimedCPU()
	rec := NewRecorder()
	rec.Enable(true, true)
	b := Wrap(in, rec)
	rec.TimeOnDevice(b.Optional().Timer) // the wrapper forwards the inner backend's timer
	x, w := mustF32(t, b, 4, 8), mustF32(t, b, 6, 8)
	out, _ := b.Alloc(tensor.F32, 4, 6)
	nw := mustF32(t, b, 6)
	normed, _ := b.Alloc(tensor.F32, 4, 6)
	rstd, _ := b.Alloc(tensor.F32, 4)

	in.syncs = 0
	rec.BeginStep(1)
	for i := 0; i < 2; i++ {
		if err := b.Linear(out, x, w, T{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.RMSNorm(normed, rstd, out, nw, 1e-6); err != nil {
		t.Fatal(err)
	}
	if in.syncs != 0 {
		t.Fatalf("device-timed ops synchronised %d times", in.syncs)
	}
	s, ok := rec.EndStep()
	if !ok {
		t.Fatal("no step")
	}
	if s.Compute[ClassMatmul] != 6*time.Millisecond || s.Compute[ClassNorm] != time.Millisecond || s.Ops != 3 {
		t.Fatalf("device times: matmul %v norm %v ops %d, want 6ms, 1ms, 3", s.Compute[ClassMatmul], s.Compute[ClassNorm], s.Ops)
	}
	if got := rec.OpTimes()[ClassMatmul]; got != 6*time.Millisecond {
		t.Errorf("OpTimes matmul = %v, want 6ms", got)
	}
	starts := []time.Duration{}
	for _, sp := range s.Spans {
		starts = append(starts, sp.Start)
	}
	if len(starts) != 3 || starts[0] != 0 || starts[1] != 3*time.Millisecond || starts[2] != 6*time.Millisecond {
		t.Errorf("span starts = %v, want [0 3ms 6ms] on the device clock", starts)
	}
	for m := backend.TimeMark(1); m <= in.next; m++ {
		if !in.released[m] {
			t.Errorf("mark %d was not released", m)
		}
	}
	// The step ends when the device finished its last op: reading the other marks afterwards
	// (here 20 ms a read, 7 reads: 140 ms) is not part of its wall time. The bound leaves three
	// tiny ops 100 ms on a loaded machine and still fails if the reads are counted.
	in.delay = 20 * time.Millisecond
	rec.BeginStep(10)
	for i := 0; i < 3; i++ {
		if err := b.Linear(out, x, w, T{}); err != nil {
			t.Fatal(err)
		}
	}
	s, _ = rec.EndStep()
	if s.Ops != 3 || s.Wall >= 100*time.Millisecond {
		t.Errorf("wall %v with %d ops: reading the marks was counted in the step", s.Wall, s.Ops)
	}
	in.delay = 0

	// A mark that cannot be read drops its span and counts it.
	in.failFrom = in.next + 3 // the step mark and the first op's start mark read; its end does not
	rec.BeginStep(2)
	if err := b.Linear(out, x, w, T{}); err != nil {
		t.Fatal(err)
	}
	s, _ = rec.EndStep()
	if s.DroppedSpans != 1 || s.Ops != 0 {
		t.Errorf("unreadable marks: dropped %d ops %d, want 1 and 0", s.DroppedSpans, s.Ops)
	}
	in.failFrom = 0

	// Outside a step, and with the timer removed, ops are timed on the host after a Sync.
	in.syncs = 0
	if err := b.Linear(out, x, w, T{}); err != nil {
		t.Fatal(err)
	}
	rec.TimeOnDevice(nil)
	rec.BeginStep(3)
	if err := b.Linear(out, x, w, T{}); err != nil {
		t.Fatal(err)
	}
	s, _ = rec.EndStep()
	if in.syncs != 2 || s.Ops != 1 {
		t.Errorf("host timing: %d syncs, %d ops; want 2 and 1", in.syncs, s.Ops)
	}
}
