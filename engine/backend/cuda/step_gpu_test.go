package cuda

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUStepBreakdown profiles one forward+backward of the Qwen3-0.6B shape (4 x 4096 tokens,
// bf16) through engine/profile, which synchronises after every op, and reports where the time
// goes by op class and by op. It checks that the ops account for the step: the profiled parts
// must add up to the step's wall time, and compute must be most of it on an idle GPU.
func TestGPUStepBreakdown(t *testing.T) {
	g := gpu(t)
	cfg, err := config.Parse([]byte(qwen3Config), "qwen3-0.6b-shape")
	if err != nil {
		t.Fatal(err)
	}
	rec := profile.NewRecorder()
	wrapped := profile.Wrap(g, rec)
	m, err := models.New(cfg, wrapped, models.Options{DType: tensor.BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.InitRandom(1); err != nil {
		t.Fatal(err)
	}
	const B, T = 4, 4096
	var batch models.Batch
	batch.DocStarts = []int32{0}
	for i := 0; i < B*T; i++ {
		batch.Tokens = append(batch.Tokens, int32((i*7919+13)%151936))
		tg := int32((i*7919 + 13 + 7919) % 151936)
		if (i+1)%T == 0 {
			tg = backend.IgnoreIndex
			batch.DocStarts = append(batch.DocStarts, int32(i+1))
		}
		batch.Targets = append(batch.Targets, tg)
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	step := func() {
		if _, _, err := m.ForwardBackward(batch, 1.0/float32(B*T)); err != nil {
			t.Fatal(err)
		}
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	step() // kernels compiled, allocator warm
	rec.Enable(true, true)
	rec.BeginStep(1)
	start := time.Now()
	step()
	wall := time.Since(start)
	st, ok := rec.EndStep()
	rec.Enable(false, false)
	if !ok {
		t.Fatal("no profiled step")
	}
	vals := map[string]float64{"wall_ms": float64(wall) / 1e6, "host_ms": float64(st.Host) / 1e6, "ops": float64(st.Ops)}
	var lines []string
	for class, d := range st.Compute {
		vals["class_"+class+"_ms"] = float64(d) / 1e6
	}
	type agg struct {
		d time.Duration
		n int
	}
	byOp := map[string]*agg{}
	for _, sp := range st.Spans {
		a := byOp[sp.Name]
		if a == nil {
			a = &agg{}
			byOp[sp.Name] = a
		}
		a.d += sp.Dur
		a.n++
	}
	names := make([]string, 0, len(byOp))
	for n := range byOp {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return byOp[names[i]].d > byOp[names[j]].d })
	for _, n := range names {
		vals["op_"+n+"_ms"] = float64(byOp[n].d) / 1e6
		vals["op_"+n+"_calls"] = float64(byOp[n].n)
		lines = append(lines, fmt.Sprintf("%-22s %8.2f ms  %5d calls", n, float64(byOp[n].d)/1e6, byOp[n].n))
	}
	t.Logf("profiled step: wall %.1f ms, host/idle %.1f ms, %d ops\n%s", vals["wall_ms"], vals["host_ms"], st.Ops, strings.Join(lines, "\n"))
	report.addBench(benchmark{Name: "step_breakdown_qwen3_0.6b_shape_b4x4096", Values: vals,
		Note: "one forward+backward through engine/profile (a Sync after every op, so the sum runs slower than an unprofiled step); milliseconds by op class and by op"})
	if sum := st.Sum(); sum < wall*95/100 {
		t.Errorf("the parts add up to %v of a %v step", sum, wall)
	}
	var compute time.Duration
	for _, d := range st.Compute {
		compute += d
	}
	if compute < wall/2 {
		t.Errorf("ops account for %v of a %v step: the host is the bottleneck", compute, wall)
	}
}

// TestGPULaunchOverhead measures whether kernel launches sit on the critical path of a training
// step for small models. A step makes no host synchronisation (TestGPUTrainStepDoesNotSynchronise),
// so the host enqueues ahead of the GPU; the step is launch-bound when enqueueing takes as long
// as the whole step. For each size it reports the host's enqueue time (ForwardBackward
// returning), the step's wall time (after Sync), the device time between two events around the
// step, and the ops per step, and checks that the device time is measured and positive. The
// figures say, per size, whether a step is launch-bound (enqueue close to wall).
func TestGPULaunchOverhead(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		name                         string
		hidden, layers, heads, kv, T int
	}{
		{"quickstart_128x2_tokens512", 128, 2, 4, 2, 512},
		{"small_512x8_tokens2048", 512, 8, 8, 4, 2048},
		{"qwen3_1024x28_tokens16384", 1024, 28, 16, 8, 16384},
	} {
		cfgJSON := fmt.Sprintf(`{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": %d,
			"intermediate_size": %d, "num_hidden_layers": %d, "num_attention_heads": %d, "num_key_value_heads": %d,
			"head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
			"rms_norm_eps": 1e-6, "tie_word_embeddings": true, "hidden_act": "silu", "attention_bias": false,
			"torch_dtype": "bfloat16"}`, s.hidden, 3*s.hidden, s.layers, s.heads, s.kv)
		cfg, err := config.Parse([]byte(cfgJSON), s.name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := models.New(cfg, g, models.Options{DType: tensor.BF16})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.InitRandom(1); err != nil {
			t.Fatal(err)
		}
		var batch models.Batch
		batch.DocStarts = []int32{0}
		for i := 0; i < s.T; i++ {
			batch.Tokens = append(batch.Tokens, int32((i*7919+13)%151936))
			batch.Targets = append(batch.Targets, int32((i*7919+13+7919)%151936))
		}
		batch.Targets[s.T-1] = backend.IgnoreIndex
		batch.DocStarts = append(batch.DocStarts, int32(s.T))
		if err := m.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		start, _ := g.d.NewEvent()
		end, _ := g.d.NewEvent()
		var enq, wall, dev []float64
		for step := 0; step < 6; step++ {
			if err := g.Sync(); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			start.Record()
			if _, _, err := m.ForwardBackward(batch, 1/float32(s.T)); err != nil {
				t.Fatal(err)
			}
			end.Record()
			e := time.Since(t0)
			if err := g.Sync(); err != nil {
				t.Fatal(err)
			}
			w := time.Since(t0)
			ms, err := start.ElapsedMs(end)
			if err != nil {
				t.Fatal(err)
			}
			if step >= 2 {
				enq = append(enq, float64(e)/1e6)
				wall = append(wall, float64(w)/1e6)
				dev = append(dev, float64(ms))
			}
		}
		start.Destroy()
		end.Destroy()
		m.Close()
		med := func(x []float64) float64 { y := slices.Clone(x); slices.Sort(y); return y[len(y)/2] }
		vals := map[string]float64{"enqueue_ms": med(enq), "wall_ms": med(wall), "device_ms": med(dev),
			"enqueue_over_wall": med(enq) / med(wall)}
		t.Logf("%s: host enqueue %.2f ms, wall %.2f ms, device %.2f ms (enqueue/wall %.2f)", s.name, vals["enqueue_ms"], vals["wall_ms"], vals["device_ms"], vals["enqueue_over_wall"])
		report.addBench(benchmark{Name: "launch_overhead_" + s.name, Values: vals,
			Note: "forward+backward, bf16, no synchronisation inside the step; median of 4 steps; device time between CUDA events recorded before and after the step's enqueue (it includes any time the GPU waited for the host)"})
		if !(vals["device_ms"] > 0) {
			t.Errorf("%s: device time %v", s.name, vals["device_ms"])
		}
	}
}
