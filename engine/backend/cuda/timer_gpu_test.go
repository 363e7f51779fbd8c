package cuda

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUDeviceTimerTimesOpsWithoutWaiting profiles a step of GEMMs through the profile wrapper
// with device timing: taking marks and running the ops never waits for the GPU, the only waits
// are EndStep reading the marks, each GEMM's device time is close to the same GEMM timed alone
// with events, and the marks go back to the pool for the next step.
func TestGPUDeviceTimerTimesOpsWithoutWaiting(t *testing.T) {
	g := gpu(t)
	const M, N, K = 4096, 4096, 4096
	x := randomTensor(t, g, 1, tensor.BF16, 1, M, K)
	w := randomTensor(t, g, 2, tensor.BF16, 0.02, N, K)
	y, _ := g.Alloc(tensor.BF16, M, N)
	defer func() {
		for _, tt := range []tensor.Tensor{x, w, y} {
			g.Free(tt)
		}
	}()
	alone := timeIt(t, g, 5, func() error { return g.Linear(y, x, w, tensor.Tensor{}) })

	rec := profile.NewRecorder()
	rec.Enable(true, true)
	rec.TimeOnDevice(g)
	p := profile.Wrap(g, rec)
	for step := 1; step <= 2; step++ {
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
		before := g.Syncs().Total
		rec.BeginStep(step)
		for i := 0; i < 8; i++ {
			if err := p.Linear(y, x, w, tensor.Tensor{}); err != nil {
				t.Fatal(err)
			}
		}
		if n := g.Syncs().Total - before; n != 0 {
			t.Fatalf("step %d: marking and queuing 8 GEMMs waited %d times", step, n)
		}
		s, ok := rec.EndStep()
		if !ok || s.Ops != 8 || s.DroppedSpans != 0 {
			t.Fatalf("step %d: ok %v, %d ops, %d dropped; want 8 ops", step, ok, s.Ops, s.DroppedSpans)
		}
		perOp := s.Compute[profile.ClassMatmul].Seconds() * 1e3 / 8
		if perOp < 0.7*alone || perOp > 1.3*alone {
			t.Errorf("step %d: device-timed GEMM %.3f ms, the same GEMM timed alone %.3f ms", step, perOp, alone)
		}
		if s.Wall < s.Compute[profile.ClassMatmul] {
			t.Errorf("step %d: wall %v below the GEMMs' device time %v", step, s.Wall, s.Compute[profile.ClassMatmul])
		}
		t.Logf("step %d: %d ops, matmul %.3f ms per GEMM on the device (alone %.3f ms), wall %v", step, s.Ops, perOp, alone, s.Wall)
	}
	g.marks.mu.Lock()
	free, all := len(g.marks.free), len(g.marks.all)
	g.marks.mu.Unlock()
	if free != all || all > 17 {
		t.Errorf("mark pool: %d free of %d created (want all free, at most 17: one step's marks)", free, all)
	}
	var _ backend.DeviceTimer = g
}
