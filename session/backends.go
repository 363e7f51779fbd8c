package session

import (
	"fmt"
	"sync"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/train"
)

var profilingOnce sync.Once

// EnableProfiling makes the cpu and cuda devices that trainers open from now on in this process
// profile.Wrap'ed backends, so that Profile can record their ops (recording stays off, and
// costs one atomic load per op, until a profile is asked for). A session process calls it at
// start; a program that builds a trainer itself and hands it to ServeRun calls it before
// train.New. It replaces the "cpu" and "cuda" entries of the backend registry and is
// idempotent.
func EnableProfiling() {
	profilingOnce.Do(func() {
		backend.Register("cpu", func(index int) (backend.Backend, error) {
			if index != 0 {
				return nil, fmt.Errorf("cpu: there is one cpu device (index 0), not %d", index)
			}
			return profile.Wrap(cpu.New(cpu.Options{}), nil), nil
		})
		backend.Register("cuda", func(index int) (backend.Backend, error) {
			b, err := cuda.New(index)
			if err != nil {
				return nil, err
			}
			return profile.Wrap(b, nil), nil
		})
	})
}

// recorderOf returns the profile recorder of a trainer's backend, or nil when the backend was
// not opened after EnableProfiling.
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
// still add up to its wall time; its trace holds the spans of device 0. Activations are
// captured on the trainer's own backend only.
type recs struct {
	main *profile.Recorder
	t    *train.Trainer
}

// newRecs returns the recorders of t, or nil when its backend was not opened for profiling.
func newRecs(t *train.Trainer) *recs {
	main := recorderOf(t.Model.Backend())
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
	return mergeSteps(steps), true
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

// mergeSteps is the mean over devices of one step's accounting (times), with the counts
// summed and the spans of the first device.
func mergeSteps(steps []profile.Step) profile.Step {
	if len(steps) == 1 {
		return steps[0]
	}
	n := time.Duration(len(steps))
	out := profile.Step{Step: steps[0].Step, Compute: map[string]time.Duration{}, Comm: map[string]time.Duration{},
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
		out.Ops += s.Ops
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
	return out
}
