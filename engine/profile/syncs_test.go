package profile

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// countingSyncs is a device whose SyncCounter reports a count the test sets.
type countingSyncs struct {
	backend.Backend
	n int64
}

func (c *countingSyncs) HostSyncs() int64 { return c.n }

func (c *countingSyncs) Optional() backend.Optional {
	o := c.Backend.Optional()
	o.Syncs = c
	return o
}

// TestStepCountsHostSyncs: a step's Syncs is the device's own count over the step when its
// backend has a SyncCounter (the wrapper's downloads are then not counted again), else the
// downloads and Syncs through the wrapper; neither counts outside the step.
func TestStepCountsHostSyncs(t *testing.T) {
	step := func(t *testing.T, b *Backend, rec *Recorder, during func()) Step {
		t.Helper()
		x, err := b.Alloc(tensor.F32, 4)
		if err != nil {
			t.Fatal(err)
		}
		raw := make([]byte, x.Bytes())
		if err := b.Download(raw, x); err != nil { // before the step: not counted
			t.Fatal(err)
		}
		rec.BeginStep(1)
		for range 2 {
			if err := b.Download(raw, x); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		during()
		s, ok := rec.EndStep()
		if !ok {
			t.Fatal("no step")
		}
		return s
	}
	t.Run("fallback", func(t *testing.T) {
		rec := NewRecorder()
		rec.Enable(true, false)
		b := Wrap(cpu.New(cpu.Options{Workers: 1}), rec)
		if s := step(t, b, rec, func() {}); s.Syncs != 3 {
			t.Fatalf("step Syncs = %d, want 3 (two downloads and a Sync)", s.Syncs)
		}
	})
	t.Run("device count", func(t *testing.T) {
		rec := NewRecorder()
		rec.Enable(true, false)
		dev := &countingSyncs{Backend: cpu.New(cpu.Options{Workers: 1}), n: 40}
		b := Wrap(dev, rec)
		if b.Optional().Syncs == nil {
			t.Fatal("the wrapper hides the device's SyncCounter")
		}
		if s := step(t, b, rec, func() { dev.n += 7 }); s.Syncs != 7 {
			t.Fatalf("step Syncs = %d, want the device's 7", s.Syncs)
		}
	})
}
