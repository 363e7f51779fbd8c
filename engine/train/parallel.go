package train

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/internal/layoutspec"
)

// A run on more than one device drives a parallel.Plan instead of the single model. The
// single model (on the trainer's own backend) stays the host view of the run, filled lazily:
// a step leaves the updated parameters on the plan's devices and only marks the host view
// stale, and the first reader after it gathers them (SyncParams; HostModel for callers
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
	if t.plan == nil {
		return LayoutInfo{Devices: t.b.Name(), Layout: mesh.Layout{}.Norm(1).String()}
	}
	info := LayoutInfo{Devices: t.devices.String(), Layout: t.plan.Mesh.Layout.String(), Parallel: true}
	if t.nodes != nil {
		info.NodeDevices = t.Cfg.Parallel.Devices
	}
	return info
}

// Plan is the parallel plan that drives the steps, or nil on one device. It is owned by the
// trainer: use it for reads (CommStats, Placement) and recorders only.
func (t *Trainer) Plan() *parallel.Plan { return t.plan }

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

// checkLayout applies the layout rules (mesh.Check) and the trainer's own: the step's
// micro-batches are dealt over the data ranks, so their number must divide evenly.
func checkLayout(d mesh.Devices, l mesh.Layout, shape mesh.ModelShape, accum int) error {
	n := d.Len()
	if err := mesh.Check(l, n, shape, 0); err != nil {
		return fmt.Errorf("train: layout: %w", err)
	}
	l = l.Norm(n)
	if accum%l.DP != 0 {
		return fmt.Errorf("train: layout %s on %s: gradient_accumulation_steps %d micro-batches cannot be dealt over %d data-parallel ranks; use a multiple of %d or a layout with fewer data ranks",
			l, d, accum, l.DP, l.DP)
	}
	return nil
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

// adopt keeps the devices and recorders of a new plan, and makes each rank's recorder record
// its collectives too.
func (t *Trainer) adopt(p *parallel.Plan, recs []*profile.Recorder, devs []backend.Backend) {
	for r, rec := range recs {
		// Collectives are timed on the host, around their calls; compute ops are then timed
		// the same way (a Sync after each), so that a rank's parts add up to its wall time.
		rec.TimeOnDevice(nil)
		p.SetRankRecorder(r, rec)
	}
	t.recs, t.rankDevs = recs, devs
}

// RankDevices returns the device of each rank of the plan (for memory statistics; the plan
// owns them), or nil on one device.
func (t *Trainer) RankDevices() []backend.Backend {
	if t.plan == nil {
		return nil
	}
	return t.rankDevs
}

// RankRecorders returns the profile recorder of each device of the plan (element r records
// rank r's compute ops and collectives, from rank r's goroutine), or nil on one device. They
// record only while enabled (profile.Recorder.Enable); BeginStep and EndStep are called around
// Step, between steps.
func (t *Trainer) RankRecorders() []*profile.Recorder {
	if t.plan == nil {
		return nil
	}
	return t.recs
}

// startPlan lays the single model and its optimizer state out over d with layout l.
func (t *Trainer) startPlan(d mesh.Devices, l mesh.Layout) (*parallel.Plan, error) {
	if t.nodes != nil {
		return t.startNodePlan(d, l)
	}
	o, recs, devs := t.planOptions(d)
	if t.auxCoefSet {
		// The plan reads the objective's aux-loss weight from the model (a single-device
		// step leaves it divided by the micro-batches).
		t.model.SetAuxLossScale(t.auxCoef)
	}
	p, err := parallel.New(t.model, d, l, o)
	if err != nil {
		return nil, fmt.Errorf("train: layout %s on %s: %w", l.Norm(d.Len()), d, err)
	}
	steps, st, err := t.opt.Export()
	if err == nil {
		err = p.LoadOptimizerState(steps, st)
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("train: layout %s on %s: optimizer state: %w", l.Norm(d.Len()), d, err)
	}
	t.adopt(p, recs, devs)
	return p, nil
}

// syncFromPlan brings the plan's parameters (when stale) and optimizer state into the single
// model and its optimizer (the state a checkpoint stores and a single-device step continues
// from).
func (t *Trainer) syncFromPlan() error {
	if err := t.SyncParams(); err != nil {
		return err
	}
	steps, st, err := t.plan.OptimizerState()
	if err != nil {
		return fmt.Errorf("train: gather optimizer state: %w", err)
	}
	if err := t.opt.Import(steps, st); err != nil {
		return fmt.Errorf("train: gather optimizer state: %w", err)
	}
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
	if t.plan != nil {
		return t.devices
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
	if err := checkLayout(d, l, parallel.ShapeOf(t.model), t.hyper.GradientAccumulationSteps); err != nil {
		return 0, err
	}
	// One device of the trainer's own kind runs the single model; anything else (several
	// devices, or a GPU while the single model is in host memory) runs a plan.
	needPlan := wantsPlan(d, l) || d.Kind != t.hostKind()
	switch {
	case !needPlan && t.plan == nil:
		// One device to one device: nothing moves.
	case !needPlan:
		if err := errors.Join(t.syncFromPlan(), t.SyncGrads()); err != nil {
			return 0, err
		}
		err := t.plan.Close()
		t.plan, t.devices = nil, mesh.Devices{}
		if err != nil {
			return 0, fmt.Errorf("train: layout: releasing the old devices: %w", err)
		}
	case t.plan == nil:
		p, err := t.startPlan(d, l)
		if err != nil {
			return 0, err
		}
		t.plan, t.devices = p, d
	default:
		// The new plan starts from the old one's parameters, so the host view is exactly as
		// stale or fresh as it was.
		o, recs, devs := t.planOptions(d)
		p, err := t.plan.Relayout(d, l, o)
		if err != nil {
			return 0, fmt.Errorf("train: layout: %w", err)
		}
		t.adopt(p, recs, devs)
		t.plan, t.devices = p, d
	}
	return time.Since(start), nil
}

// padRow makes a micro-batch's length a multiple of mult (the context-parallel chunking) by
// appending a filler document whose targets are all ignored: it attends only to itself and
// adds nothing to the loss or the gradients.
func padRow(b data.Batch, mult int) models.Batch {
	mb := toModelBatch(b)
	n := len(b.Tokens)
	pad := (mult - n%mult) % mult
	if pad == 0 {
		return mb
	}
	mb.Tokens = append(append([]int32(nil), b.Tokens...), make([]int32, pad)...)
	tg := append([]int32(nil), b.Targets...)
	pos := append([]int32(nil), b.Positions...)
	for i := range pad {
		tg = append(tg, backend.IgnoreIndex)
		if b.Positions != nil {
			pos = append(pos, int32(i))
		}
	}
	mb.Targets = tg
	if b.Positions != nil {
		mb.Positions = pos
	}
	if b.DocStarts != nil {
		mb.DocStarts = append(append([]int32(nil), b.DocStarts...), int32(n+pad))
	} else if b.Positions == nil {
		mb.DocStarts = []int32{0, int32(n), int32(n + pad)}
	}
	return mb
}

// planRows turns the step's micro-batches into the plan's rows (padded for context
// parallelism; the plan deals them over the data ranks).
func (t *Trainer) planRows(batches []data.Batch) []models.Batch {
	mult := 1
	if cp := t.plan.Mesh.Layout.CP; cp > 1 {
		mult = 2 * cp
	}
	rows := make([]models.Batch, len(batches))
	for i, b := range batches {
		rows[i] = padRow(b, mult)
	}
	return rows
}

// stepOnPlan is Step on a parallel plan: the same micro-batches, the same mean over the step's
// targets, the same clipping and schedule. The updated parameters stay on the devices; the
// single model is marked stale and gathers them when read (SyncParams).
func (t *Trainer) stepOnPlan(start time.Time, cur data.Cursor, batches []data.Batch, total, tokens int) (StepMetrics, error) {
	h := t.hyper
	fail := func(err error) (StepMetrics, error) {
		_ = t.loader.Seek(cur)
		return StepMetrics{}, err
	}
	for _, r := range t.recs {
		r.ResetOpTimes()
	}
	loss, _, err := t.plan.ForwardBackward(t.planRows(batches))
	if err != nil {
		return fail(fmt.Errorf("train: step %d on %s: %w", t.step+1, t.plan.Mesh.Layout, err))
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return fail(fmt.Errorf("train: step %d: loss %v is not finite; the update was skipped: lower learning_rate (now %g) or set max_grad_norm", t.step+1, loss, h.LearningRate))
	}
	lr := t.schedule(h).At(min(t.step, t.totalSteps))
	t.plan.SetWeightDecay(h.WeightDecay)
	// From here on the plan's parameters may differ from the host view's, even when the
	// update fails part way.
	t.paramsStale = true
	norm, err := t.plan.Step(lr, h.MaxGradNorm)
	if err != nil {
		// The plan refuses a non-finite gradient norm before any update (other failures may
		// leave parameters partly updated, so the step is not retried). Either way its
		// communicators are closed; SetLayout builds a new plan from its host-side state.
		_ = t.loader.Seek(cur)
		l := t.plan.Mesh.Layout
		return StepMetrics{}, fmt.Errorf("train: step %d on %s: %w; to go on, lower learning_rate (now %g) or set max_grad_norm, and move the run with SetLayout (e.g. %q) to rebuild the devices from their last state",
			t.step+1, l, err, h.LearningRate, l.String())
	}
	if err := t.plan.BalanceExperts(); err != nil {
		return StepMetrics{}, fmt.Errorf("train: step %d on %s: %w", t.step+1, t.plan.Mesh.Layout, err)
	}
	t.gradsStale = true
	t.step++
	el := time.Since(start)
	c := t.loader.Cursor()
	m := StepMetrics{
		Step: t.step, Loss: loss, GradNorm: norm, LR: lr, Tokens: tokens, Targets: total,
		TokensPerS: float64(tokens) / el.Seconds(), StepTimeS: el.Seconds(),
		Epoch: float64(c.Epoch) + float64(c.Index)/float64(t.loader.BatchesPerEpoch()),
	}
	if t.model.IsMoE() {
		aux := t.plan.AuxLoss()
		m.AuxLoss = &aux
		m.ExpertLoad = t.model.ExpertLoadStats(t.plan.ExpertLoad())
	}
	// Time per op class (and "comm.KIND" per collective kind) while profiling records: the
	// mean over the devices.
	for _, r := range t.recs {
		for k, d := range r.OpTimes() {
			if m.TimeByOpS == nil {
				m.TimeByOpS = map[string]float64{}
			}
			m.TimeByOpS[k] += d.Seconds() / float64(len(t.recs))
		}
	}
	return m, nil
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

// SyncGrads brings the gradients of the last step into the single model (HostModel) when a
// plan computed them; on one device they are there already. Inspection calls it before it
// reads gradients; steps do not need it. Call it on the goroutine that drives the trainer.
func (t *Trainer) SyncGrads() error {
	if t.plan == nil || !t.gradsStale {
		return nil
	}
	gs, err := t.plan.Grads()
	if err != nil {
		return fmt.Errorf("train: gather gradients: %w", err)
	}
	for i, s := range t.model.Specs {
		v, ok := gs[s.Name]
		if !ok {
			return fmt.Errorf("train: gather gradients: the plan has no gradient of %q", s.Name)
		}
		g := t.model.Grads.Views[i]
		raw, err := tensor.EncodeFloat32(g.DType(), v)
		if err != nil {
			return fmt.Errorf("train: gather gradients: %q: %w", s.Name, err)
		}
		if err := t.b.Upload(g, raw); err != nil {
			return fmt.Errorf("train: gather gradients: %q: %w", s.Name, err)
		}
	}
	t.gradsStale = false
	return nil
}
