package cuda

import (
	"fmt"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUPostingTakesLaunchesOffTheCallersPath measures what a kernel launch costs the caller
// when ops wait for the device goroutine (HALO_CUDA_SYNC_OPS=1) and when they are posted: the
// round trip of one Do, a stream of tiny kernels, and forward+backward of a small model, where
// the GPU work per op is a few microseconds: a small qwen3 (8 layers of width 256, 21M
// parameters), the shape where launch overhead, not the GPU, sets the pace. The model's loss must not depend on the mode.
func TestGPUPostingTakesLaunchesOffTheCallersPath(t *testing.T) {
	g := gpu(t)
	defer g.d.q.setAsync(true)
	const n = 20000
	start := time.Now()
	for range n {
		if err := g.d.Do(func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	doUS := time.Since(start).Seconds() / n * 1e6

	x, err := g.Alloc(tensor.F32, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free(x)
	type timing struct{ enqueueUS, totalUS float64 }
	tiny := map[bool]timing{}
	for _, async := range []bool{false, true, false, true} {
		g.d.q.setAsync(async)
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range n {
			if err := g.Scale(x, 1); err != nil {
				t.Fatal(err)
			}
		}
		enq := time.Since(start)
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
		tiny[async] = timing{enq.Seconds() / n * 1e6, time.Since(start).Seconds() / n * 1e6}
	}

	m := qwen3Model(t, g, qwen3JSON(256, 768, 8, 4, 2, 64, 32000), 1)
	defer m.Close()
	const B, T = 1, 512
	batch := packedBatch(B, T, 32000)
	step := map[bool]float64{}
	loss := map[bool]float64{}
	for _, async := range []bool{false, true, false, true} {
		g.d.q.setAsync(async)
		best := 0.0
		for i := range 6 {
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			if err := g.Sync(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			sum, cnt, err := m.ForwardBackward(batch, 1.0/float32(B*T))
			if err == nil {
				err = g.Sync()
			}
			if err != nil {
				t.Fatalf("async %v step %d: %v", async, i, err)
			}
			s := time.Since(start).Seconds()
			if i > 0 && (best == 0 || s < best) {
				best = s
			}
			loss[async] = sum / float64(cnt)
		}
		if prev, ok := step[async]; !ok || best < prev {
			step[async] = best
		}
	}
	if loss[true] != loss[false] {
		t.Errorf("loss %v posted, %v waited: posting must not change results", loss[true], loss[false])
	}
	vals := map[string]float64{
		"do_round_trip_us":                doUS,
		"tiny_kernel_enqueue_us_waited":   tiny[false].enqueueUS,
		"tiny_kernel_enqueue_us_posted":   tiny[true].enqueueUS,
		"tiny_kernel_total_us_waited":     tiny[false].totalUS,
		"tiny_kernel_total_us_posted":     tiny[true].totalUS,
		"small_model_step_s_waited":       step[false],
		"small_model_step_s_posted":       step[true],
		"small_model_speedup_posted":      step[false] / step[true],
		"small_model_tokens_per_s_posted": float64(B*T) / step[true],
	}
	t.Logf("Do round trip %.1f us; tiny kernel: waited %.1f us enqueue / %.1f us total, posted %.1f / %.1f; small model fwd+bwd (%d tokens): waited %.2f ms, posted %.2f ms (%.2fx)",
		doUS, tiny[false].enqueueUS, tiny[false].totalUS, tiny[true].enqueueUS, tiny[true].totalUS, B*T, step[false]*1e3, step[true]*1e3, step[false]/step[true])
	report.addBench(benchmark{Name: "launch_overhead_posted_vs_waited", Values: vals,
		Note: fmt.Sprintf("%d Do round trips; %d Scale launches on 256 floats; small qwen3 (8x256, vocab 32000) forward+backward of %dx%d tokens, best of 5 after one warm-up, each mode twice", n, n, B, T)})
}
