package train

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/internal/layoutspec"
)

// A run on more than one device drives a parallel.Plan instead of the single model: the
// trainer's stepper is a planSteps. The single model (on the trainer's own backend) stays the
// host view of the run, filled lazily: a step leaves the updated parameters on the plan's
// devices, and the first reader after it has planSteps gather them (HostModel for callers
// outside the package). Evaluation, generation, inspection, checkpoints and a move back to
// one device read it that way, so they see the trained weights whatever the layout, while a
// run that only steps never copies the model off its devices. Gradients are gathered the
// same way (SyncGrads). The single model's optimizer is idle while a plan runs and receives
// the plan's layout-free state when a checkpoint is written or the run goes back to one
// device.

// LayoutInfo describes where a run's parameters live.
type LayoutInfo struct {
	// Devices is the device list ("cpu:4", "cuda:0-7"); for a single-device run, the
	// trainer's backend name.
	Devices string `json:"devices"`
	// Layout is the normalised layout ("dp=2 fsdp tp=2 cp=1 ep=1 etp=1").
	Layout string `json:"layout"`
	// Parallel reports whether a parallel plan drives the steps.
	Parallel bool `json:"parallel"`
	// NodeDevices, in a run across nodes, is the devices this node drives as named in its
	// config ("cuda:1"); Devices then names the ranks of the whole world ("cuda:0-3").
	NodeDevices string `json:"node_devices,omitempty"`
}

// Layout returns the devices and layout the next step runs on.
func (t *Trainer) Layout() LayoutInfo {
	ps := t.onPlan()
	if ps == nil {
		return LayoutInfo{Devices: t.b.Name(), Layout: mesh.Layout{}.Norm(1).String()}
	}
	info := LayoutInfo{Devices: ps.devices.String(), Layout: ps.p.Mesh.Layout.String(), Parallel: true}
	if t.nodes != nil {
		info.NodeDevices = t.Cfg.Parallel.Devices
	}
	return info
}

// Plan is the parallel plan that drives the steps, or nil on one device. It is owned by the
// trainer: use it for reads (CommStats, Placement) and recorders only.
func (t *Trainer) Plan() *parallel.Plan {
	if ps := t.onPlan(); ps != nil {
		return ps.p
	}
	return nil
}

// onPlan is the trainer's stepper when a parallel plan drives the steps, nil on one device.
func (t *Trainer) onPlan() *planSteps {
	ps, _ := t.exec.(*planSteps)
	return ps
}

// modelConfig returns the config.json of the configured model without reading weights.
func modelConfig(cfg *Config, tokenizerVocab int) (*config.Config, error) {
	if cfg.Model.Init != nil {
		return InitModelConfig(cfg.Model.Init, tokenizerVocab)
	}
	c, err := config.Load(cfg.Model.ModelNameOrPath)
	if err != nil {
		return nil, fmt.Errorf("train: model_name_or_path: %w", err)
	}
	return c, nil
}

// wantsPlan reports whether devices d with layout l need a parallel plan.
func wantsPlan(d mesh.Devices, l mesh.Layout) bool {
	l = l.Norm(d.Len())
	return d.Len() > 1 || l.Size() > 1 || l.EP > 1 || l.ETP > 1
}

// RuleCPSequenceLoss is the rule that refuses context parallelism for the methods whose loss
// reads whole sequences (MethodSpec.WholeSequences), as it appears in mesh.LayoutError.Rule.
const RuleCPSequenceLoss = "cp-sequence-loss"

// checkLayout applies the layout rules (mesh.Check), the method's (rule cp-sequence-loss) and
// the trainer's own: the step's micro-batches are dealt over the data ranks, so their number
// must divide evenly.
func checkLayout(d mesh.Devices, l mesh.Layout, shape mesh.ModelShape, accum int, method *MethodSpec) error {
	n := d.Len()
	if err := mesh.Check(l, n, shape, 0); err != nil {
		return fmt.Errorf("train: layout: %w", err)
	}
	l = l.Norm(n)
	if method != nil && method.WholeSequences && l.CP > 1 {
		return fmt.Errorf("train: layout: %w", &mesh.LayoutError{Rule: RuleCPSequenceLoss, Layout: l, Devices: n, Suggest: withoutCP(l, n, shape),
			Detail: fmt.Sprintf("method %s weighs every token by a loss of its whole sequence (DPO, SMPO and KTO: sums of completion log-probs; reward models: the score at the last token; GRPO: each completion's advantage and length), and context_parallel_size %d splits every sequence over %d ranks; use data, tensor or expert parallelism", method.Name, l.CP, l.CP)})
	}
	if accum%l.DP != 0 {
		return fmt.Errorf("train: layout %s on %s: gradient_accumulation_steps %d micro-batches cannot be dealt over %d data-parallel ranks; use a multiple of %d or a layout with fewer data ranks",
			l, d, accum, l.DP, l.DP)
	}
	return nil
}

// withoutCP is a layout close to l on n devices without context parallelism that passes the
// layout rules: mesh.Suggest's from l with its context ranks turned into data ranks, or plain
// data parallelism.
func withoutCP(l mesh.Layout, n int, shape mesh.ModelShape) mesh.Layout {
	c := l
	c.DP, c.CP = 0, 1
	if s := mesh.Suggest(c, n, shape, 0); s.CP == 1 {
		return s
	}
	return mesh.Layout{DP: max(n, 1), FSDP: l.FSDP}.Norm(max(n, 1))
}

func optimConfig(c *Config) optim.Config {
	mode := optim.MasterF32
	if bf16Optim(c.Optim.Optim) {
		mode = optim.BF16
	}
	return optim.Config{Mode: mode, Beta1: c.Optim.AdamBeta1, Beta2: c.Optim.AdamBeta2, Eps: c.Optim.AdamEpsilon,
		WeightDecay: c.Optim.WeightDecay, Seed: uint64(*c.Run.Seed), Nearest: c.Optim.Optim == "adamw_bf16_nearest"}
}

// bf16Optim reports whether the optimizer keeps bf16 weights and moments.
func bf16Optim(name string) bool {
	return name == "adamw_bf16" || name == "adamw_bf16_nearest"
}

// planOptions opens one backend per device (simulated CPU devices, or the named GPUs, whose
// collectives go through NCCL when there are several), each with its own profile recorder, which also records the rank's collectives once the plan is
// built (adopt).
func (t *Trainer) planOptions(d mesh.Devices) (parallel.Options, []*profile.Recorder, []backend.Backend) {
	o := parallel.Options{Optimizer: optimConfig(t.Cfg), World: worldFor(d)}
	o.Optimizer.WeightDecay = t.hyper.WeightDecay
	recs := make([]*profile.Recorder, d.Len())
	ids := append([]int(nil), d.IDs...)
	kind := d.Kind
	devs := make([]backend.Backend, d.Len())
	o.NewBackend = func(r int) (backend.Backend, error) {
		b, err := openRank(kind, ids[r], recs, r)
		if err == nil {
			if err = capMemory(b, t.Cfg.Run.MaxDeviceMemoryGiB); err != nil {
				_ = b.Close()
				b = nil
			}
		}
		devs[r] = b
		return b, err
	}
	return o, recs, devs
}

// openRank opens the device of rank r, wrapped for profiling with recs[r].
func openRank(kind string, id int, recs []*profile.Recorder, r int) (backend.Backend, error) {
	var b backend.Backend
	if kind == "cpu" {
		b = cpu.New(cpu.Options{Workers: 1})
	} else {
		var err error
		if b, err = backend.Open(fmt.Sprintf("%s:%d", kind, id)); err != nil {
			return nil, err
		}
	}
	if rec, _, ok := profile.Unwrap(b); ok {
		recs[r] = rec
		return b, nil
	}
	recs[r] = profile.NewRecorder()
	return profile.Wrap(b, recs[r]), nil
}

// adopt makes a new plan over devices d, whose ranks' devices and recorders are devs and recs,
// drive the steps, and makes each rank's recorder record its collectives too. The host view
// starts current (the plan was just built from it, or from a plan it was current for).
func (t *Trainer) adopt(p *parallel.Plan, d mesh.Devices, recs []*profile.Recorder, devs []backend.Backend) *planSteps {
	ps := &planSteps{p: p, devices: d, recs: recs, devs: devs, host: t.model, opt: t.opt, obj: t.obj, total: t.totalSteps}
	for r, rec := range recs {
		// Collectives are timed on the host, around their calls; compute ops are then timed
		// the same way (a Sync after each), so that a rank's parts add up to its wall time.
		rec.TimeOnDevice(nil)
		p.SetRankRecorder(r, rec)
		ps.ots = append(ps.ots, rec)
	}
	t.exec = ps
	return ps
}

// RankDevices returns the device of each rank of the plan (for memory statistics; the plan
// owns them), or nil on one device.
func (t *Trainer) RankDevices() []backend.Backend {
	if ps := t.onPlan(); ps != nil {
		return ps.devs
	}
	return nil
}

// RankRecorders returns the profile recorder of each device of the plan (element r records
// rank r's compute ops and collectives, from rank r's goroutine), or nil on one device. They
// record only while enabled (profile.Recorder.Enable); BeginStep and EndStep are called around
// Step, between steps.
func (t *Trainer) RankRecorders() []*profile.Recorder {
	if ps := t.onPlan(); ps != nil {
		return ps.recs
	}
	return nil
}

// startPlan lays the single model and its optimizer state out over d with layout l, and makes
// the new plan drive the steps. The trainer runs on one device when it is called.
func (t *Trainer) startPlan(d mesh.Devices, l mesh.Layout) error {
	if t.nodes != nil {
		return t.startNodePlan(d, l)
	}
	o, recs, devs := t.planOptions(d)
	if t.model.IsMoE() {
		// The plan reads the objective's aux-loss weight from the model (a single-device
		// step leaves it divided by the micro-batches).
		t.model.SetAuxLossScale(t.auxCoef)
	}
	p, err := parallel.New(t.model, d, l, o)
	if err != nil {
		return fmt.Errorf("train: layout %s on %s: %w", l.Norm(d.Len()), d, err)
	}
	steps, st, err := t.opt.Export()
	if err == nil {
		err = p.LoadOptimizerState(steps, st)
	}
	if err != nil {
		p.Close()
		return fmt.Errorf("train: layout %s on %s: optimizer state: %w", l.Norm(d.Len()), d, err)
	}
	t.adopt(p, d, recs, devs)
	return nil
}

// ParseLayoutSpec reads a target layout: the layout words of mesh.ParseLayout (dp=N fsdp
// tp=N cp=N ep=N etp=N) and optionally devices=LIST (cpu:4, cuda:0-3), split apart by
// layoutspec.SplitSpec, the syntax clients check before sending. Without devices=, the
// current devices (cur) are kept when tp·cp divides their number and dp is not given;
// otherwise the layout takes dp·tp·cp devices of the current kind. "dp=1" goes back to one
// device.
func ParseLayoutSpec(spec string, cur mesh.Devices) (mesh.Devices, mesh.Layout, error) {
	words, devs, err := layoutspec.SplitSpec(spec)
	if err != nil {
		return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: %w", err)
	}
	l, err := mesh.ParseLayout(words)
	if err != nil {
		return mesh.Devices{}, mesh.Layout{}, err
	}
	if devs != "" {
		d, err := mesh.ParseDevices(devs)
		if err != nil {
			return mesh.Devices{}, mesh.Layout{}, err
		}
		return d, l, nil
	}
	kind := cur.Kind
	if kind == "" {
		kind = "cpu"
	}
	inner := max(l.TP, 1) * max(l.CP, 1)
	if l.DP == 0 && cur.Len() > 0 && cur.Len()%inner == 0 {
		return cur, l, nil
	}
	n := max(l.DP, 1) * inner
	if kind == "cpu" {
		d, err := mesh.ParseDevices(fmt.Sprintf("cpu:%d", n))
		return d, l, err
	}
	if n > cur.Len() {
		return mesh.Devices{}, mesh.Layout{}, fmt.Errorf("train: layout %q needs %d devices, the run has %s: name them with devices=%s:0-%d", spec, n, cur, kind, n-1)
	}
	return mesh.Devices{Kind: kind, IDs: append([]int(nil), cur.IDs[:n]...)}, l, nil
}

// currentDevices is the device list of the run now (one device of the trainer's kind when no
// plan runs).
func (t *Trainer) currentDevices() mesh.Devices {
	if ps := t.onPlan(); ps != nil {
		return ps.devices
	}
	return mesh.Devices{Kind: t.hostKind(), IDs: []int{0}}
}

// hostKind is the device kind of the trainer's own backend (where the single model lives).
func (t *Trainer) hostKind() string {
	if strings.HasPrefix(t.b.Name(), "cuda") {
		return "cuda"
	}
	return "cpu"
}

// SetLayout moves the run to another layout between steps: parameters and optimizer state are
// redistributed in memory (gathered from the old layout, resliced and resharded into the new
// one; gradients are recomputed by the next step), not reloaded from disk. The next step
// computes what a fresh run in the new layout computes from the same state. spec is read by
// ParseLayoutSpec. An invalid target is refused with the rule it breaks and a layout that
// works, and the run continues in the old layout. It returns how long the move took.
func (t *Trainer) SetLayout(spec string) (time.Duration, error) {
	start := time.Now()
	if err := t.refuseNodes("moving the run to another layout (SetLayout)"); err != nil {
		return 0, err
	}
	d, l, err := ParseLayoutSpec(spec, t.currentDevices())
	if err != nil {
		return 0, err
	}
	if err := checkLayout(d, l, parallel.ShapeOf(t.model), t.hyper.GradientAccumulationSteps, t.method); err != nil {
		return 0, err
	}
	if t.model.LoRA() != nil {
		if err := mesh.CheckAdapters(l, d.Len()); err != nil {
			return 0, fmt.Errorf("train: layout: %w", err)
		}
	}
	// One device of the trainer's own kind runs the single model; anything else (several
	// devices, or a GPU while the single model is in host memory) runs a plan.
	needPlan := wantsPlan(d, l) || d.Kind != t.hostKind()
	old := t.onPlan()
	switch {
	case !needPlan && old == nil:
		// One device to one device: nothing moves.
	case !needPlan:
		if err := errors.Join(old.syncState(), old.syncGrads()); err != nil {
			return 0, err
		}
		err := old.close()
		t.exec = t.deviceStepper()
		if err != nil {
			return 0, fmt.Errorf("train: layout: releasing the old devices: %w", err)
		}
	case old == nil:
		if err := t.startPlan(d, l); err != nil {
			return 0, err
		}
	default:
		// The new plan starts from the old one's parameters, so the host view is exactly as
		// stale or fresh as it was.
		o, recs, devs := t.planOptions(d)
		p, err := old.p.Relayout(d, l, o)
		if err != nil {
			return 0, fmt.Errorf("train: layout: %w", err)
		}
		ps := t.adopt(p, d, recs, devs)
		ps.paramsStale, ps.gradsStale, ps.gathers = old.paramsStale, old.gradsStale, old.gathers
	}
	return time.Since(start), nil
}

// ParallelLayout returns the config's devices and layout, and whether they need a parallel
// plan (more than one device). Syntax and ranges are checked here; the rules that need the
// model are checked by mesh.Check (New does so before any weight loads).
func (c *Config) ParallelLayout() (d mesh.Devices, l mesh.Layout, isParallel bool, err error) {
	d, l, err = c.Parallel.Resolve()
	if err != nil {
		return mesh.Devices{}, mesh.Layout{}, false, fmt.Errorf("train: devices: %w", err)
	}
	return d, l, wantsPlan(d, l), nil
}

// Workload is what one data rank runs at a time, for mesh.Estimate: one micro-batch of up to
// per_device_train_batch_size·max_length tokens (a packed row), in the run's dtype.
func (c *Config) Workload() mesh.Workload {
	w := mesh.Workload{SeqLen: c.Batch.PerDeviceTrainBatchSize * c.Batch.MaxLength, Rows: 1, ParamBytes: 4, OptimizerBytes: 8,
		Recompute: c.Run.GradientCheckpointing}
	if c.Run.BF16 {
		w.ParamBytes, w.OptimizerBytes = 2, 12
		if bf16Optim(c.Optim.Optim) {
			w.OptimizerBytes = 4
		}
	}
	return w
}
