package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// Hyper are the hyperparameters that may change between steps (SetHyper). Each field means what
// the config key of its JSON name means. The learning rate is the schedule's peak; the
// schedule's shape (warmup, total) stays. Adam's betas and epsilon are fixed for a run.
type Hyper struct {
	LearningRate              float64 `json:"learning_rate"`
	LRSchedulerType           string  `json:"lr_scheduler_type"`
	WeightDecay               float64 `json:"weight_decay"`
	AdamBeta1                 float64 `json:"adam_beta1"`
	AdamBeta2                 float64 `json:"adam_beta2"`
	AdamEpsilon               float64 `json:"adam_epsilon"`
	MaxGradNorm               float64 `json:"max_grad_norm"`
	GradientAccumulationSteps int     `json:"gradient_accumulation_steps"`
}

func hyperFrom(c *Config) Hyper {
	return Hyper{
		LearningRate: c.Optim.LearningRate, LRSchedulerType: c.Sched.LRSchedulerType,
		WeightDecay: c.Optim.WeightDecay, AdamBeta1: c.Optim.AdamBeta1, AdamBeta2: c.Optim.AdamBeta2,
		AdamEpsilon: c.Optim.AdamEpsilon, MaxGradNorm: *c.Optim.MaxGradNorm,
		GradientAccumulationSteps: c.Batch.GradientAccumulationSteps,
	}
}

// validate checks hyperparameters set between steps, with the config's rules.
func (h Hyper) validate() error {
	c := Config{Method: MethodSFT, Model: ModelConfig{ModelNameOrPath: "x"},
		Dataset: DatasetConfig{Path: StringList{"x"}}, Run: RunConfig{OutputDir: "x"}}
	c.Defaults()
	c.Optim.LearningRate, c.Optim.WeightDecay, c.Optim.MaxGradNorm = h.LearningRate, h.WeightDecay, &h.MaxGradNorm
	c.Optim.AdamBeta1, c.Optim.AdamBeta2, c.Optim.AdamEpsilon = h.AdamBeta1, h.AdamBeta2, h.AdamEpsilon
	c.Sched.LRSchedulerType = h.LRSchedulerType
	c.Batch.GradientAccumulationSteps = h.GradientAccumulationSteps
	if err := c.Validate(); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	return nil
}

// StepMetrics are the measurements of one optimizer step.
type StepMetrics struct {
	// Step is the number of optimizer steps done, this one included (1 after the first).
	Step int `json:"step"`
	// Loss is the mean cross-entropy over every target token of the step (nats).
	Loss float64 `json:"loss"`
	// GradNorm is the global L2 norm of the gradient before clipping.
	GradNorm float64 `json:"grad_norm"`
	// LR is the learning rate the update used.
	LR float64 `json:"lr"`
	// Tokens is the number of tokens processed (inputs, all micro-batches).
	Tokens int `json:"tokens"`
	// TokensPerS is Tokens over the step's wall time.
	TokensPerS float64 `json:"tokens_per_s"`
	// Targets is the number of tokens trained on (the loss's denominator).
	Targets int `json:"targets"`
	// Epoch is the fractional epoch reached (micro-batches consumed / micro-batches per epoch).
	Epoch float64 `json:"epoch"`
	// StepTimeS is the step's wall time in seconds.
	StepTimeS float64 `json:"step_time_s"`
	// TimeByOpS splits the step's time by op class (seconds) when the backend reports it.
	TimeByOpS map[string]float64 `json:"time_by_op_s,omitempty"`
	// EvalLoss is the held-out loss, when it was computed after this step.
	EvalLoss *float64 `json:"eval_loss,omitempty"`
	// AuxLoss is the MoE load-balancing loss (unweighted, mean over the step's micro-batches);
	// nil for dense models. Loss stays the cross-entropy alone.
	AuxLoss *float64 `json:"aux_loss,omitempty"`
	// ExpertLoad is the per-layer expert load of the whole step (MoE models): tokens routed to
	// each expert summed over every micro-batch (and, on a parallel plan, every data and
	// context rank), then max, min, coefficient of variation and dead experts of those sums.
	ExpertLoad []models.ExpertLoad `json:"expert_load,omitempty"`
}

// OpTimer is an optional backend capability: time spent per op class since the last reset.
type OpTimer interface {
	OpTimes() map[string]time.Duration
	ResetOpTimes()
}

// Trainer owns a model, its optimizer and its data, and runs optimizer steps. It is driven by
// one goroutine at a time.
type Trainer struct {
	Cfg *Config
	// Stats describe the training data after tokenization and truncation.
	Stats data.Stats
	// EvalStats describe the held-out data (zero when there is none).
	EvalStats data.Stats

	// model is the single model on b: the run itself on one device, the host view of the run
	// on a parallel plan, where its parameters are gathered only when read (SyncParams,
	// HostModel; see parallel.go). Its shape (Arch, Specs, config) is always current.
	model       *models.Model
	b           backend.Backend
	deviceNote  string // why device auto chose the device it did ("" when nothing to say)
	tok         *textCodec
	loader      *data.Loader
	evalBatches []data.Batch
	evalRecords []data.Record
	trainAnswer string // most frequent training answer (generation eval's chance baseline)
	opt         *optim.AdamW
	hyper       Hyper
	plan        *parallel.Plan      // drives the steps on more than one device; nil on one
	devices     mesh.Devices        // the plan's devices
	recs        []*profile.Recorder // the plan's per-rank recorders
	gradsStale  bool                // the plan's gradients are newer than model's (SyncGrads)
	paramsStale bool                // the plan's parameters are newer than model's (SyncParams)
	gathers     int                 // parameter gathers from a plan so far (SyncParams)
	rankDevs    []backend.Backend   // the plan's devices, by rank
	step        int
	totalSteps  int
	warmup      int
	auxCoef     float64 // the model's own aux-loss weight (router_aux_loss_coef or 0), read once
	auxCoefSet  bool
	nodes       *nodeSpec // how this process joined a run across nodes; nil on one node
}

// Steps returns the number of optimizer steps done.
func (t *Trainer) Steps() int { return t.step }

// TotalSteps is the planned number of optimizer steps (max_steps or num_train_epochs).
func (t *Trainer) TotalSteps() int { return t.totalSteps }

// Done reports whether the planned steps are done.
func (t *Trainer) Done() bool { return t.step >= t.totalSteps }

// Hyper returns the hyperparameters the next step will use.
func (t *Trainer) Hyper() Hyper { return t.hyper }

// SetHyper replaces the hyperparameters from the next step on. Invalid values are refused and
// nothing changes; Adam's betas and epsilon are fixed for a run.
func (t *Trainer) SetHyper(h Hyper) error {
	if err := h.validate(); err != nil {
		return err
	}
	if h.AdamBeta1 != t.hyper.AdamBeta1 || h.AdamBeta2 != t.hyper.AdamBeta2 || h.AdamEpsilon != t.hyper.AdamEpsilon {
		return fmt.Errorf("train: adam_beta1, adam_beta2 and adam_epsilon cannot change during a run (restart from a checkpoint with new values)")
	}
	t.hyper = h
	return nil
}

// SetLR sets the peak learning rate from the next step on (the schedule keeps its shape).
func (t *Trainer) SetLR(lr float64) error {
	h := t.hyper
	h.LearningRate = lr
	return t.SetHyper(h)
}

// LR is the learning rate the next step will use.
func (t *Trainer) LR() float64 {
	return t.schedule(t.hyper).At(min(t.step, t.totalSteps))
}

// Cursor is the data position of the next micro-batch.
func (t *Trainer) Cursor() data.Cursor { return t.loader.Cursor() }

func toModelBatch(b data.Batch) models.Batch {
	return models.Batch{Tokens: b.Tokens, Positions: b.Positions, DocStarts: b.DocStarts, Targets: b.Targets}
}

// Step runs one optimizer step: gradient_accumulation_steps micro-batches whose summed
// token losses are divided by the step's total number of targets (counted first), the global
// gradient norm and clipping, then AdamW at the scheduled learning rate. Steps past the planned
// total are allowed (the schedule stays at its final value). ctx is checked between
// micro-batches.
func (t *Trainer) Step(ctx context.Context) (StepMetrics, error) {
	start := time.Now()
	if ot, ok := t.b.(OpTimer); ok {
		ot.ResetOpTimes()
	}
	h := t.hyper
	cur := t.loader.Cursor()
	batches := make([]data.Batch, h.GradientAccumulationSteps)
	total, tokens := 0, 0
	for i := range batches {
		b, err := t.loader.Next()
		if err != nil {
			_ = t.loader.Seek(cur)
			return StepMetrics{}, err
		}
		batches[i] = b
		total += b.NumTargets()
		tokens += b.Len()
	}
	fail := func(err error) (StepMetrics, error) {
		// Leave the step undone and the data where it was, so the step can be retried.
		_ = t.loader.Seek(cur)
		return StepMetrics{}, err
	}
	if total == 0 {
		return fail(errors.New("train: the step's micro-batches have no target tokens"))
	}
	if t.plan != nil {
		return t.stepOnPlan(start, cur, batches, total, tokens)
	}
	if err := t.model.ZeroGrads(); err != nil {
		return fail(err)
	}
	scale := float32(1 / float64(total))
	moe := t.model.IsMoE()
	if moe {
		// The objective is the mean over micro-batches of CE + coef * aux, so each
		// micro-batch's aux gradient carries coef / micro-batches.
		if !t.auxCoefSet {
			t.auxCoef, t.auxCoefSet = t.model.AuxLossScale(), true
		}
		t.model.SetAuxLossScale(t.auxCoef / float64(len(batches)))
		t.model.TakeExpertLoad() // count this step's micro-batches only
	}
	lossSum, auxSum := 0.0, 0.0
	for i, b := range batches {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		s, _, err := t.model.ForwardBackward(toModelBatch(b), scale)
		if err != nil {
			return fail(fmt.Errorf("train: step %d micro-batch %d: %w", t.step+1, i, err))
		}
		lossSum += s
		auxSum += t.model.AuxLoss()
	}
	loss := lossSum / float64(total)
	norm, err := optim.GradNorm(t.b, []backend.T{t.model.Grads.Flat})
	if err != nil {
		return fail(err)
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return fail(fmt.Errorf("train: step %d: loss %v, gradient norm %v are not finite; the update was skipped: lower learning_rate (now %g) or set max_grad_norm", t.step+1, loss, norm, h.LearningRate))
	}
	clip := optim.ClipCoef(norm, h.MaxGradNorm)
	lr := t.schedule(h).At(min(t.step, t.totalSteps))
	t.opt.SetWeightDecay(h.WeightDecay)
	if err := t.opt.Step(lr, clip); err != nil {
		// Parameters may be partly updated: the trainer cannot retry this step.
		return StepMetrics{}, err
	}
	var load [][]int
	if moe {
		load = t.model.TakeExpertLoad()
		// A no-op unless aux-loss-free balancing is on; the shapes are the model's own.
		if err := t.model.BalanceExpertsWith(load); err != nil {
			return StepMetrics{}, fmt.Errorf("train: step %d: %w", t.step+1, err)
		}
	}
	if err := t.b.Sync(); err != nil {
		return StepMetrics{}, err
	}
	t.step++
	el := time.Since(start)
	c := t.loader.Cursor()
	m := StepMetrics{
		Step: t.step, Loss: loss, GradNorm: norm, LR: lr, Tokens: tokens, Targets: total,
		TokensPerS: float64(tokens) / el.Seconds(), StepTimeS: el.Seconds(),
		Epoch: float64(c.Epoch) + float64(c.Index)/float64(t.loader.BatchesPerEpoch()),
	}
	if moe {
		aux := auxSum / float64(len(batches))
		m.AuxLoss = &aux
		m.ExpertLoad = t.model.ExpertLoadStats(load)
	}
	if ot, ok := t.b.(OpTimer); ok {
		m.TimeByOpS = map[string]float64{}
		for k, d := range ot.OpTimes() {
			m.TimeByOpS[k] = d.Seconds()
		}
	}
	return m, nil
}

// HasEval reports whether there is held-out data.
func (t *Trainer) HasEval() bool { return len(t.evalBatches) > 0 }

// Eval returns the mean cross-entropy over every target token of the held-out data, computed
// by the single model (after SyncParams on a parallel plan).
func (t *Trainer) Eval(ctx context.Context) (float64, error) {
	if len(t.evalBatches) == 0 {
		return 0, errors.New("train: no held-out data: set dataset.eval_split or dataset.eval_path")
	}
	if err := t.SyncParams(); err != nil {
		return 0, fmt.Errorf("train: eval: %w", err)
	}
	sum, n := 0.0, 0
	for _, b := range t.evalBatches {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		s, k, err := t.model.Forward(toModelBatch(b))
		if err != nil {
			return 0, fmt.Errorf("train: eval: %w", err)
		}
		sum += s
		n += k
	}
	return sum / float64(max(1, n)), nil
}

// Close frees the model, the optimizer state and the backend.
func (t *Trainer) Close() error {
	var errs []error
	if t.plan != nil {
		errs = append(errs, t.plan.Close())
		t.plan = nil
	}
	if t.opt != nil {
		t.opt.Free()
	}
	if t.model != nil {
		errs = append(errs, t.model.Close())
	}
	if t.b != nil {
		errs = append(errs, t.b.Close())
	}
	return errors.Join(errs...)
}
