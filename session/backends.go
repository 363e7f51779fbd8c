package session

import (
	"fmt"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/profile"
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
