package cuda

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/profile"
)

// TestGPUStepBreakdown profiles one forward+backward of the Qwen3-0.6B shape (4 x 4096 tokens,
// bf16) through engine/profile, which synchronises after every op, and reports where the time
// goes by op class and by op. It checks that the ops account for the step: the profiled parts
// must add up to the step's wall time, and compute must be most of it on an idle GPU.
func TestGPUStepBreakdown(t *testing.T) {
	g := gpu(t)
	rec := profile.NewRecorder()
	m := qwen3ShapeModel(t, profile.Wrap(g, rec))
	defer m.Close()
	const B, T = 4, 4096
	batch := packedBatch(B, T, 151936)
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
