package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/train"
)

// NewTrainer builds a trainer as train.New does, with its own device wrapped for profiling
// (Profiled), so that a session serving it can answer Profile and capture activations. The
// session's Load builds its trainers this way; a program that builds a trainer itself and
// hands it to ServeRun (`halo-shell launch`) calls it instead of train.New. Nothing else in
// the process changes: the backend registry is left alone, and other trainers open plain
// devices.
func NewTrainer(cfg *train.Config) (*train.Trainer, error) {
	return train.NewWrapped(cfg, Profiled)
}

// Profiled wraps b with profile.Wrap and a recorder of its own (b as it is when it is wrapped
// already). Recording stays off, and costs one atomic load per op, until a profile is asked
// for. A device whose ops run asynchronously (a GPU, whose Optional has a Timer) is timed on the
// device, between events around each op, so a profiled step runs at full speed and its split
// is device time; a parallel plan switches that off for its ranks (engine/train).
func Profiled(b backend.Backend) backend.Backend {
	if _, _, ok := profile.Unwrap(b); ok {
		return b
	}
	rec := profile.NewRecorder()
	if t := b.Optional().Timer; t != nil {
		rec.TimeOnDevice(t)
	}
	return profile.Wrap(b, rec)
}

// recorderOf returns the profile recorder of a trainer's backend, or nil when the backend is
// not a profiled one (a trainer built with train.New rather than NewTrainer).
func recorderOf(b backend.Backend) *profile.Recorder {
	rec, _, ok := profile.Unwrap(b)
	if !ok {
		return nil
	}
	return rec
}

// recs are the profile recorders a step is accounted on: the trainer's backend's, or, while a
// parallel plan drives the steps, one per device. A step of a plan is reported as the mean
// over its devices of each compute class, collective kind and host (idle) time, so its parts
// still add up to its wall time; its trace has one process per device. Activations are
// captured on the trainer's own backend only.
type recs struct {
	main *profile.Recorder
	t    *train.Trainer
	// byStep holds the per-device accounting of the steps of a plan whose spans were kept,
	// for traces with one track group per device (writeTrace forgets them).
	byStep map[int][]profile.Step
}

// newRecs returns the recorders of t, or nil when its backend was not opened for profiling.
func newRecs(t *train.Trainer) *recs {
	main := recorderOf(t.Backend())
	if main == nil {
		return nil
	}
	return &recs{main: main, t: t}
}

func (r *recs) all() []*profile.Recorder {
	if rs := r.t.RankRecorders(); len(rs) > 0 {
		return rs
	}
	return []*profile.Recorder{r.main}
}

// Enable turns recording on or off on every device of the run.
func (r *recs) Enable(on, keepSpans bool) {
	if !on {
		r.main.Enable(false, false) // it may have been on before a layout change
	}
	for _, x := range r.all() {
		x.Enable(on, keepSpans)
	}
}

// BeginStep starts accounting step n on every device.
func (r *recs) BeginStep(n int) {
	for _, x := range r.all() {
		x.BeginStep(n)
	}
}

// AbortStep drops the current step on every device.
func (r *recs) AbortStep() {
	for _, x := range r.all() {
		x.AbortStep()
	}
}

// EndStep ends the current step on every device and returns their merged accounting.
func (r *recs) EndStep() (profile.Step, bool) {
	var steps []profile.Step
	for _, x := range r.all() {
		if s, ok := x.EndStep(); ok {
			steps = append(steps, s)
		}
	}
	if len(steps) == 0 {
		return profile.Step{}, false
	}
	if len(steps) > 1 && len(steps[0].Spans) > 0 {
		if r.byStep == nil {
			r.byStep = map[int][]profile.Step{}
		}
		r.byStep[steps[0].Step] = steps
	}
	return profile.MeanSteps(steps), true
}

// writeTrace writes steps as a Chrome/Perfetto trace. Steps of a plan get one process per
// device (compute and communication tracks each), laid on the same time axis, so waits in
// collectives show side by side; other steps are written as profile.WriteTrace does. The
// (nil) receiver of a trainer without profiling writes them the same way. The per-device
// records of the written steps are forgotten.
func (r *recs) writeTrace(w io.Writer, steps []profile.Step) error {
	if r == nil || len(r.byStep) == 0 {
		return profile.WriteTrace(w, steps)
	}
	defer func() {
		for _, s := range steps {
			delete(r.byStep, s.Step)
		}
	}()
	ranks := 1
	for _, s := range steps {
		ranks = max(ranks, len(r.byStep[s.Step]))
	}
	type trace struct {
		TraceEvents     []map[string]any `json:"traceEvents"`
		DisplayTimeUnit string           `json:"displayTimeUnit"`
	}
	out := trace{TraceEvents: []map[string]any{}, DisplayTimeUnit: "ms"}
	for d := range ranks {
		// Device d's view of every step, each as long as the merged step so that the
		// devices' timelines stay aligned.
		own := make([]profile.Step, len(steps))
		for i, s := range steps {
			// Without its own record, device 0 shows the merged step (its spans are
			// device 0's) and the others the step's extent only.
			own[i] = s
			if d > 0 {
				own[i].Spans = nil
			}
			if per := r.byStep[s.Step]; d < len(per) {
				own[i] = per[d]
				own[i].Wall = s.Wall
			}
		}
		var buf bytes.Buffer
		if err := profile.WriteTrace(&buf, own); err != nil {
			return err
		}
		var tr trace
		if err := json.Unmarshal(buf.Bytes(), &tr); err != nil {
			return fmt.Errorf("session: trace of device %d: %w", d, err)
		}
		for _, ev := range tr.TraceEvents {
			ev["pid"] = d + 1
			if ev["name"] == "process_name" {
				ev["args"] = map[string]any{"name": fmt.Sprintf("device %d", d)}
			}
			out.TraceEvents = append(out.TraceEvents, ev)
		}
	}
	return json.NewEncoder(w).Encode(out)
}

// Steps forgets the ended steps of every device.
func (r *recs) Steps() {
	r.main.Steps()
	for _, x := range r.all() {
		x.Steps()
	}
}

// StartCapture and StopCapture capture activations on the trainer's backend.
func (r *recs) StartCapture()                     { r.main.StartCapture() }
func (r *recs) StopCapture() []profile.Activation { return r.main.StopCapture() }
