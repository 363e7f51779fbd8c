package train

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// hostParams reads the single model's parameters as they are, without syncing them.
func hostParams(t *testing.T, tr *Trainer) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for _, s := range tr.model.Specs {
		v, err := tr.model.ParamFloat32(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		out[s.Name] = v
	}
	return out
}

// planParams reads the parameters the plan's devices hold.
func planParams(t *testing.T, tr *Trainer) map[string][]float32 {
	t.Helper()
	if tr.Plan() == nil {
		t.Fatal("the trainer runs no plan")
	}
	ps, err := tr.Plan().Params()
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// gathers is how many times the trainer's plan gathered its parameters into the host model (0
// on one device).
func gathers(tr *Trainer) int {
	if ps := tr.onPlan(); ps != nil {
		return ps.gathers
	}
	return 0
}

// checkpointParams loads the model weights of a checkpoint (or Hugging Face model directory)
// into a fresh single-device model of the tiny parallel shape and returns them.
func checkpointParams(t *testing.T, dataPath, dir string) map[string][]float32 {
	t.Helper()
	tr := newTrainer(t, tinyParallelConfig(t, dataPath))
	if err := loadModelWeights(tr.model, dir); err != nil {
		t.Fatal(err)
	}
	return hostParams(t, tr)
}

// sameBits reports the first tensor where a and b differ in any bit ("" when none).
func sameBits(a, b map[string][]float32) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d tensors against %d", len(a), len(b))
	}
	for name, va := range a {
		vb, ok := b[name]
		if !ok || len(va) != len(vb) {
			return name
		}
		for i := range va {
			if math.Float32bits(va[i]) != math.Float32bits(vb[i]) {
				return fmt.Sprintf("%s[%d]: %v against %v", name, i, va[i], vb[i])
			}
		}
	}
	return ""
}

// maxRelDiff is the largest relative L2 distance between the tensors of a and b.
func maxRelDiff(t *testing.T, a, b map[string][]float32) float64 {
	t.Helper()
	worst := 0.0
	for name, va := range a {
		vb, ok := b[name]
		if !ok || len(va) != len(vb) {
			t.Fatalf("tensor %s: missing or of another size", name)
		}
		num, den := 0.0, 0.0
		for i := range va {
			d := float64(va[i]) - float64(vb[i])
			num += d * d
			den += float64(vb[i]) * float64(vb[i])
		}
		worst = max(worst, math.Sqrt(num/max(den, 1e-30)))
	}
	return worst
}

func TestPlanStepLeavesParametersOnTheDevices(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"dp=4 fsdp on cpu:4", []string{"--devices=cpu:4", "--fsdp=true", "--gradient_accumulation_steps=4"}},
		{"tp=2 on cpu:2", []string{"--devices=cpu:2", "--tensor_parallel_size=2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrainer(t, tinyParallelConfig(t, path, tc.extra...))
			initial := hostParams(t, tr)
			steps(t, tr, 2)
			if gathers(tr) != 0 {
				t.Fatalf("two plan steps gathered the parameters %d times, want none", gathers(tr))
			}
			if d := sameBits(hostParams(t, tr), initial); d != "" {
				t.Fatalf("a plan step wrote the host model (%s)", d)
			}
			onDevices := planParams(t, tr)
			if sameBits(onDevices, initial) == "" {
				t.Fatal("two steps left the plan's parameters at their initial values")
			}
			if _, err := tr.HostModel(); err != nil {
				t.Fatal(err)
			}
			if d := sameBits(hostParams(t, tr), onDevices); d != "" {
				t.Fatalf("after HostModel the host model differs from the plan's parameters: %s", d)
			}
			if _, err := tr.HostModel(); err != nil || gathers(tr) != 1 {
				t.Fatalf("HostModel on a fresh host model: %v, %d gathers in all, want 1", err, gathers(tr))
			}
			// The next step makes it stale again.
			steps(t, tr, 1)
			if _, err := tr.HostModel(); err != nil || gathers(tr) != 2 {
				t.Fatalf("HostModel after another step: %v, %d gathers in all, want 2", err, gathers(tr))
			}
			if d := sameBits(hostParams(t, tr), planParams(t, tr)); d != "" {
				t.Fatalf("after HostModel the host model differs from the plan's parameters: %s", d)
			}
		})
	}
	// On one device the model is the run: nothing to gather.
	tr := newTrainer(t, tinyParallelConfig(t, path))
	steps(t, tr, 1)
	m, err := tr.HostModel()
	if err != nil || m != tr.model || gathers(tr) != 0 {
		t.Fatalf("HostModel on one device: %p, %v, %d gathers; want the trainer's model and no gather", m, err, gathers(tr))
	}
}

// TestHostModelReadersSeeTheTrainedWeights runs the same three steps on one device and on a
// tp=2 fsdp plan, then each reader of the host model: on the plan it must gather exactly once
// and see what the single device sees.
func TestHostModelReadersSeeTheTrainedWeights(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(40))
	plan := []string{"--devices=cpu:4", "--tensor_parallel_size=2", "--fsdp=true"}
	ctx := context.Background()
	n := 0
	newDir := func() string {
		n++
		return filepath.Join(dir, fmt.Sprint("out", n))
	}
	for _, tc := range []struct {
		name string
		read func(t *testing.T, tr *Trainer) any
	}{
		{"Eval", func(t *testing.T, tr *Trainer) any {
			l, err := tr.Eval(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}},
		{"Complete", func(t *testing.T, tr *Trainer) any {
			s, err := tr.Complete("3+4=", false, 6)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
		{"EvalGeneration", func(t *testing.T, tr *Trainer) any {
			r, err := tr.EvalGeneration(ctx, 4, 4)
			if err != nil {
				t.Fatal(err)
			}
			return r.Examples
		}},
		{"HostModel", func(t *testing.T, tr *Trainer) any {
			if _, err := tr.HostModel(); err != nil {
				t.Fatal(err)
			}
			return hostParams(t, tr)
		}},
		{"Save", func(t *testing.T, tr *Trainer) any {
			d := newDir()
			if err := tr.Save(d); err != nil {
				t.Fatal(err)
			}
			return checkpointParams(t, path, d)
		}},
		{"SaveModel", func(t *testing.T, tr *Trainer) any {
			d := newDir()
			if err := tr.SaveModel(d); err != nil {
				t.Fatal(err)
			}
			return checkpointParams(t, path, d)
		}},
		{"SetLayout to one device", func(t *testing.T, tr *Trainer) any {
			if _, err := tr.SetLayout("dp=1"); err != nil {
				t.Fatal(err)
			}
			if tr.Plan() != nil {
				t.Fatal("SetLayout(dp=1) left a plan")
			}
			return hostParams(t, tr)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			single := newTrainer(t, tinyParallelConfig(t, path, "--dataset.eval_split=0.2"))
			steps(t, single, 3)
			want := tc.read(t, single)
			tr := newTrainer(t, tinyParallelConfig(t, path, append(plan, "--dataset.eval_split=0.2")...))
			steps(t, tr, 3)
			ps := tr.onPlan() // SetLayout replaces it
			got := tc.read(t, tr)
			if ps.gathers != 1 {
				t.Fatalf("%s on a plan gathered the parameters %d times, want once", tc.name, ps.gathers)
			}
			switch w := want.(type) {
			case float64:
				if g := got.(float64); !relClose(g, w, 1e-4) {
					t.Fatalf("%s: %v on the plan, %v on one device", tc.name, g, w)
				}
			case map[string][]float32:
				if d := maxRelDiff(t, got.(map[string][]float32), w); d > 1e-4 {
					t.Fatalf("%s: parameters differ from one device's by %g (relative L2)", tc.name, d)
				}
			default:
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: %q on the plan, %q on one device", tc.name, got, want)
				}
			}
		})
	}
}

// TestLazyPlanCheckpointsResumeBitExact saves a plan run after three steps and after six:
// each checkpoint holds exactly the devices' parameters at that step, and a run resumed from
// the first in the same layout repeats the uninterrupted run's losses bit for bit.
func TestLazyPlanCheckpointsResumeBitExact(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(40))
	layout := []string{"--devices=cpu:4", "--fsdp=true", "--gradient_accumulation_steps=4"}
	tr := newTrainer(t, tinyParallelConfig(t, path, layout...))
	steps(t, tr, 3)
	ck3, ck6 := filepath.Join(dir, "ck3"), filepath.Join(dir, "ck6")
	if err := tr.Save(ck3); err != nil {
		t.Fatal(err)
	}
	if d := sameBits(checkpointParams(t, path, ck3), planParams(t, tr)); d != "" {
		t.Fatalf("checkpoint of step 3 differs from the devices' parameters: %s", d)
	}
	want := steps(t, tr, 3)
	if err := tr.Save(ck6); err != nil {
		t.Fatal(err)
	}
	if d := sameBits(checkpointParams(t, path, ck6), planParams(t, tr)); d != "" {
		t.Fatalf("checkpoint of step 6 differs from the devices' parameters: %s", d)
	}
	resumed := newTrainer(t, tinyParallelConfig(t, path, append(layout, "--resume_from_checkpoint="+ck3)...))
	if got := steps(t, resumed, 3); !slices.Equal(got, want) {
		t.Fatalf("resumed from step 3: losses %v, the uninterrupted run %v", got, want)
	}
	if d := sameBits(planParams(t, resumed), planParams(t, tr)); d != "" {
		t.Fatalf("after step 6 the resumed run's parameters differ: %s", d)
	}
}

// TestRelayoutKeepsTheHostViewInStep moves a plan to another plan between steps: a host view
// that was stale stays stale and gathers from the new plan; one that was current needs no
// gather, and both equal the new plan's parameters.
func TestRelayoutKeepsTheHostViewInStep(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	tr := newTrainer(t, tinyParallelConfig(t, path, "--devices=cpu:4", "--tensor_parallel_size=2", "--fsdp=true"))
	steps(t, tr, 2)
	if _, err := tr.SetLayout("cp=2"); err != nil {
		t.Fatal(err)
	}
	if gathers(tr) != 0 || !tr.onPlan().paramsStale {
		t.Fatalf("a move between plans: %d gathers, stale %v; want none and still stale", gathers(tr), tr.onPlan().paramsStale)
	}
	if _, err := tr.HostModel(); err != nil {
		t.Fatal(err)
	}
	if d := sameBits(hostParams(t, tr), planParams(t, tr)); d != "" || gathers(tr) != 1 {
		t.Fatalf("after the move and HostModel (%d gathers): host model differs from the new plan's parameters: %s", gathers(tr), d)
	}
	if _, err := tr.SetLayout("devices=cpu:2 tp=2"); err != nil {
		t.Fatal(err)
	}
	if d := sameBits(hostParams(t, tr), planParams(t, tr)); d != "" || tr.onPlan().paramsStale {
		t.Fatalf("a move from a current host view left it stale (%v) or different: %s", tr.onPlan().paramsStale, d)
	}
	single := newTrainer(t, tinyParallelConfig(t, path))
	steps(t, single, 2)
	if d := maxRelDiff(t, hostParams(t, tr), hostParams(t, single)); d > 1e-4 {
		t.Fatalf("after two moves the host model differs from one device's by %g (relative L2)", d)
	}
}
