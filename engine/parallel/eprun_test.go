package parallel

import (
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Under expert parallelism each rank holds and computes only the experts it owns: its model
// has parameters and gradients for those experts alone (all of them trained by the step), and
// its all-reduces leave the others out (expert gradients are summed over their replicas only).
func TestExpertParallelComputesExpertsOnTheirOwners(t *testing.T) {
	src := tinyModel(t, "qwen3_moe", 3)
	rows := tinyRows(8, 16, 41, 4)
	ep := newPlan(t, src, 4, "ep=2", optim.Config{})
	dp := newPlan(t, src, 4, "", optim.Config{})
	for _, p := range []*Plan{ep, dp} {
		if _, _, err := p.ForwardBackward(rows); err != nil {
			t.Fatal(err)
		}
	}
	all := int64(0) // bytes of every expert of the full model
	for _, s := range src.Specs {
		if _, ok := src.ExpertOf(s.Name); ok {
			all += int64(s.Numel()) * 4
		}
	}
	unowned := int64(0) // bytes of the experts one rank does not hold (the same on each)
	for _, rk := range ep.ranks {
		held := int64(0)
		seen := map[int]bool{}
		for _, s := range rk.m.Specs {
			x, ok := rk.m.ExpertOf(s.Name)
			if !ok {
				continue
			}
			seen[x] = true
			if own := ExpertOwner(x, 4, 2) == rk.ep.Rank(); !own {
				t.Errorf("rank %d (expert rank %d) holds expert %d, which it does not own", rk.id, rk.ep.Rank(), x)
			}
			g, err := rk.m.GradFloat32(s.Name)
			if err != nil {
				t.Fatal(err)
			}
			nonzero := false
			for _, v := range g {
				nonzero = nonzero || v != 0
			}
			if !nonzero {
				t.Errorf("rank %d: gradient of its expert parameter %s is zero", rk.id, s.Name)
			}
			held += int64(s.Numel()) * 4
		}
		if len(seen) != 2 {
			t.Errorf("rank %d holds experts %v, want the 2 of its block", rk.id, seen)
		}
		n := all - held
		if unowned != 0 && n != unowned {
			t.Fatalf("rank %d does not hold %d bytes of experts, rank 0 %d", rk.id, n, unowned)
		}
		unowned = n
	}
	if unowned == 0 {
		t.Fatal("every rank holds every expert")
	}
	es, ds := ep.CommStats(), dp.CommStats()
	for r := range es {
		if got, want := ds[r][comm.KindAllReduce].Bytes-es[r][comm.KindAllReduce].Bytes, unowned; got != want {
			t.Errorf("rank %d: ep=2 all-reduces %d bytes fewer than dp=4, want %d (the experts it does not own)", r, got, want)
		}
		for _, k := range []string{comm.KindAllToAllDispatch, comm.KindAllToAllCombine} {
			if es[r][k].Calls == 0 || es[r][k].Bytes <= 0 {
				t.Errorf("rank %d: %s %+v: tokens did not travel", r, k, es[r][k])
			}
			if ds[r][k].Calls != 0 {
				t.Errorf("rank %d: dp=4 ran %d %s", r, ds[r][k].Calls, k)
			}
		}
	}
}

// Dispatch and combine are profile spans of their own kinds, with bytes and time, on each
// rank's recorder, beside the expert compute.
func TestExpertExchangesAreProfileSpans(t *testing.T) {
	src := tinyModel(t, "mixtral", 1)
	recs := []*profile.Recorder{profile.NewRecorder(), profile.NewRecorder()}
	l, _ := mesh.ParseLayout("ep=2")
	p, err := New(src, cpuDevices(2), l, Options{NewBackend: func(r int) (backend.Backend, error) {
		return profile.Wrap(cpu.New(cpu.Options{Workers: 1}), recs[r]), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for r, rec := range recs {
		p.SetRankRecorder(r, rec)
		rec.Enable(true, true)
		rec.BeginStep(1)
	}
	if _, _, err := p.ForwardBackward(tinyRows(2, 16, 41, 2)); err != nil {
		t.Fatal(err)
	}
	for r, rec := range recs {
		st, ok := rec.EndStep()
		if !ok {
			t.Fatalf("rank %d: no step", r)
		}
		bytes := map[string]int64{}
		for _, sp := range st.Spans {
			if sp.Comm {
				bytes[sp.Class] += sp.Bytes
				if sp.Group == "" {
					t.Errorf("rank %d: span %+v has no group", r, sp)
				}
			}
		}
		for _, k := range []string{profile.CommAllToAllDispatch, profile.CommAllToAllCombine} {
			if st.Comm[k] <= 0 || bytes[k] <= 0 {
				t.Errorf("rank %d: %s took %v over %d bytes; want time and bytes (comm %v)", r, k, st.Comm[k], bytes[k], st.Comm)
			}
		}
	}
}

// Expert-parallel steps are deterministic: the same rows give bit-identical losses and
// gradients.
func TestExpertParallelIsDeterministic(t *testing.T) {
	src := tinyModel(t, "qwen3_moe", 5)
	rows := tinyRows(8, 16, 41, 6)
	var first map[string][]float32
	var firstLoss float64
	for i := 0; i < 2; i++ {
		p := newPlan(t, src, 8, "ep=4 tp=2 etp=2", optim.Config{})
		loss, _, err := p.ForwardBackward(rows)
		if err != nil {
			t.Fatal(err)
		}
		g, err := p.Grads()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first, firstLoss = g, loss
			continue
		}
		if loss != firstLoss {
			t.Errorf("loss %v then %v", firstLoss, loss)
		}
		for name, v := range g {
			if err := closeTo(v, first[name], 0); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

// Under etp = tp each expert's gate and up are split by output features and down by input
// features over the tensor group.
func TestExpertTensorParallelSplitsExperts(t *testing.T) {
	src := tinyModel(t, "qwen3_moe", 1)
	p := newPlan(t, src, 4, "ep=2 tp=2 etp=2", optim.Config{})
	for name, want := range map[string]models.Split{
		"model.layers.1.mlp.experts.2.gate_proj.weight": models.Column,
		"model.layers.1.mlp.experts.2.up_proj.weight":   models.Column,
		"model.layers.1.mlp.experts.2.down_proj.weight": models.Row,
		"model.layers.1.mlp.gate.weight":                models.Replicated,
	} {
		if got := p.Placement(name); got != want {
			t.Errorf("%s: placement %s, want %s", name, got, want)
		}
	}
	q := newPlan(t, src, 4, "ep=2 tp=2", optim.Config{})
	if got := q.Placement("model.layers.1.mlp.experts.2.gate_proj.weight"); got != models.Replicated {
		t.Errorf("etp=1: expert placement %s, want replicated", got)
	}
}

// A relayout from ep=4 to ep=2 (over dp=4) carries parameters and optimizer state: the next
// step's loss equals that of a fresh ep=2 plan loaded from the same state, and training keeps
// tracking the single-device run.
func TestRelayoutBetweenExpertLayouts(t *testing.T) {
	const steps = 5
	src := tinyModel(t, "qwen3_moe", 8)
	batches := trainBatches(steps)
	want, wantNorm, _, _ := refTraining(t, "qwen3_moe", steps)
	l4, _ := mesh.ParseLayout("ep=4")
	p, err := New(src, cpuDevices(4), l4, Options{Optimizer: trainOpt})
	if err != nil {
		t.Fatal(err)
	}
	trainSteps(t, p, batches[:3], 0, want, wantNorm)
	// The same state, loaded by hand into a fresh plan of the target layout.
	l2, _ := mesh.ParseLayout("ep=2")
	staging := tinyModel(t, "qwen3_moe", 99)
	if err := p.Gather(staging); err != nil {
		t.Fatal(err)
	}
	step, st, err := p.OptimizerState()
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := New(staging, cpuDevices(4), l2, Options{Optimizer: trainOpt})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := fresh.LoadOptimizerState(step, st); err != nil {
		t.Fatal(err)
	}
	np, err := p.Relayout(cpuDevices(4), l2, Options{Optimizer: trainOpt})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	if np.Steps() != 3 {
		t.Errorf("the relaid plan has taken %d steps, want 3", np.Steps())
	}
	var losses [2]float64
	for i, q := range []*Plan{np, fresh} {
		loss, _, err := q.ForwardBackward(batches[3])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Step(trainLR, trainMaxNorm); err != nil {
			t.Fatal(err)
		}
		losses[i] = loss
	}
	if losses[0] != losses[1] {
		t.Errorf("step 4 after relayout: loss %.9g, fresh plan from the same state %.9g", losses[0], losses[1])
	}
	if math.Abs(losses[0]-want[3]) > 1e-4*math.Abs(want[3]) {
		t.Errorf("step 4 after relayout: loss %.9g, single device %.9g", losses[0], want[3])
	}
	trainSteps(t, np, batches, 4, want, wantNorm)
}

// A checkpoint gathered from an expert layout is an ordinary HF checkpoint: it loads on one
// device with the plan's weights.
func TestCheckpointFromExpertLayout(t *testing.T) {
	src, back := savedFromLayout(t, "mixtral", 8, "ep=2 tp=2 etp=2", tinyRows(4, 16, 41, 3))
	changed := 0
	for _, s := range src.Specs {
		got, _ := back.ParamFloat32(s.Name)
		before, _ := src.ParamFloat32(s.Name)
		if _, ok := src.ExpertOf(s.Name); ok && closeTo(got, before, 0) != nil {
			changed++
		}
	}
	if changed == 0 {
		t.Error("no expert weight changed: the step did not reach the checkpoint")
	}
}

// The optimizer state of an expert layout, where each rank keeps the state of the experts it
// owns only, exports as the single-device state.
func TestExpertLayoutOptimizerStateIsLayoutFree(t *testing.T) {
	const steps = 2
	src := tinyModel(t, "qwen3_moe", 8)
	_, _, _, refOpt := refTraining(t, "qwen3_moe", steps)
	refStep, refState, err := refOpt.Export()
	if err != nil {
		t.Fatal(err)
	}
	batches := trainBatches(steps)
	for _, tc := range []struct {
		n      int
		layout string
	}{{4, "ep=4"}, {4, "ep=2"}, {8, "ep=2 tp=2 etp=2"}, {4, "ep=2 fsdp"}} {
		p := newPlan(t, src, tc.n, tc.layout, trainOpt)
		for _, rows := range batches {
			if _, _, err := p.ForwardBackward(rows); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Step(trainLR, trainMaxNorm); err != nil {
				t.Fatal(err)
			}
		}
		step, st, err := p.OptimizerState()
		if err != nil {
			t.Fatal(err)
		}
		if step != refStep || len(st) != len(refState) {
			t.Fatalf("%q: step %d with %d tensors, single device step %d with %d", tc.layout, step, len(st), refStep, len(refState))
		}
		for i, ref := range refState {
			if st[i].Name != ref.Name {
				t.Fatalf("%q: tensor %d is %s, single device %s", tc.layout, i, st[i].Name, ref.Name)
			}
			got, _ := tensor.DecodeFloat32(st[i].DType, st[i].Data)
			want, _ := tensor.DecodeFloat32(ref.DType, ref.Data)
			if err := closeTo(got, want, 1e-4); err != nil {
				t.Errorf("%d %q: %s: %v", tc.n, tc.layout, ref.Name, err)
			}
		}
	}
}

func TestDryRunShowsExpertGroups(t *testing.T) {
	cfg, err := config.Parse([]byte(tinyConfigs["qwen3_moe"]), "qwen3_moe.json")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	l, _ := mesh.ParseLayout("ep=2 tp=2 etp=2")
	if err := DryRun(&out, cfg, cpuDevices(8), l, mesh.Workload{SeqLen: 16}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"layout:  dp=4 tp=2 cp=1 ep=2 etp=2", "groups ep:   [[0 2] [1 3] [4 6] [5 7]]", "groups edata: [[0 4] [1 5] [2 6] [3 7]]"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// A rank that fails inside an expert-parallel step (out of memory) releases the others from
// their exchanges, and the run continues in a new layout.
func TestFailingExpertRankDoesNotHangTheOthers(t *testing.T) {
	src := tinyModel(t, "qwen3_moe", 1)
	probe := newPlan(t, src, 4, "ep=4", optim.Config{})
	state := probe.ranks[2].dev.MemStats().Allocated
	l, _ := mesh.ParseLayout("ep=4")
	p, err := New(src, cpuDevices(4), l, Options{NewBackend: func(r int) (backend.Backend, error) {
		o := cpu.Options{Workers: 1}
		if r == 2 {
			o.MemoryLimit = state + 512
		}
		return cpu.New(o), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rows := tinyRows(4, 16, 41, 1)
	if _, _, err := p.ForwardBackward(rows); err == nil || !strings.Contains(err.Error(), "rank 2") {
		t.Fatalf("got %v, want rank 2's allocation failure", err)
	}
	np, err := p.Relayout(cpuDevices(2), mesh.Layout{EP: 2}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	if _, _, err := np.ForwardBackward(rows); err != nil {
		t.Fatal(err)
	}
}
