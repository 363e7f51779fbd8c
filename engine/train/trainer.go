package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
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
	// Method holds the method's own measurements under TRL's names (rewards/chosen,
	// rewards/rejected, rewards/accuracies, rewards/margins, kl, ...; held-out ones prefixed
	// eval_), each the mean over the step's units; empty for pretrain and sft. In JSON they
	// are top-level keys beside the fields above.
	Method map[string]float64 `json:"-"`
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
	// on a parallel plan, where exec brings its values up to date when they are read
	// (HostModel, SyncGrads; see parallel.go). Its shape (Arch, Specs, config) is always
	// current.
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
	exec        stepper // runs the steps: deviceSteps on one device, planSteps on a plan
	method      *MethodSpec
	obj         Objective // the method's loss, called by the stepper for each micro-batch
	// Preference methods: the training and held-out documents (pairs or examples), the rows
	// left out of them and the number of rows read, and what Close must free besides.
	prefDocs, prefEvalDocs []data.Document
	badRows                []data.BadRow
	badTotal               int
	closers                []func() error
	step                   int
	totalSteps             int
	warmup                 int
	auxCoef                float64   // the objective's aux-loss weight (router_aux_loss_coef or the model's; 0 when dense)
	nodes                  *nodeSpec // how this process joined a run across nodes; nil on one node
	// clientReward is GRPO's reward function "client" (SetClientReward); nil when none.
	clientReward RewardFunc
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

// HasEval reports whether there is held-out data.
func (t *Trainer) HasEval() bool { return len(t.evalBatches) > 0 }

// Eval returns the method's mean loss over the held-out data (for pretrain and sft the mean
// cross-entropy over every target token), computed by the single model (brought up to date
// first on a parallel plan).
func (t *Trainer) Eval(ctx context.Context) (float64, error) {
	l, _, err := t.evalAll(ctx)
	return l, err
}

// evalAll is Eval with the method's held-out metrics.
func (t *Trainer) evalAll(ctx context.Context) (float64, Metrics, error) {
	if len(t.evalBatches) == 0 {
		return 0, nil, errors.New("train: no held-out data: set dataset.eval_split or dataset.eval_path")
	}
	if err := t.exec.syncParams(); err != nil {
		return 0, nil, fmt.Errorf("train: eval: %w", err)
	}
	sum, n := 0.0, 0
	ms := Metrics{}
	at := StepAt{Step: t.step + 1, Total: t.totalSteps}
	for _, b := range t.evalBatches {
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		s, k, bm, err := t.obj.Eval(t.model, b, at)
		if err != nil {
			return 0, nil, fmt.Errorf("train: eval: %w", err)
		}
		sum += s
		n += k
		ms.Merge(bm)
	}
	return sum / float64(max(1, n)), ms, nil
}

// Close frees the model, the optimizer state and the backend.
func (t *Trainer) Close() error {
	var errs []error
	for _, c := range t.closers {
		errs = append(errs, c())
	}
	t.closers = nil
	if t.exec != nil {
		errs = append(errs, t.exec.close())
		t.exec = nil
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
