package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// One optimizer step has one path: Step reads the micro-batches and the learning rate, the
// trainer's stepper does the device work (deviceSteps here, planSteps in plansteps.go), and
// stepMetrics builds the record from what it measured.

// stepper is the device side of a run, driven by the trainer's goroutine between steps.
type stepper interface {
	// step computes the gradients of batches (micro-batches with total targets in all: the
	// loss is the mean over them), clips their global norm to h.MaxGradNorm and updates the
	// parameters at learning rate lr; n is the step's number for errors. On an error with
	// retry set, the data goes back to where the step began: the update was not applied, or
	// (on a plan) the run must be rebuilt before it goes on, which its error says.
	step(ctx context.Context, batches []data.Batch, total int, h Hyper, lr float64, n int) (out stepOut, retry bool, err error)
	// timers are the op timers that a step's time by op class is read from: reset before the
	// step, their mean in the metrics.
	timers() []OpTimer
	// syncParams brings the last step's parameters (and the experts' balancing bias) into
	// the single model.
	syncParams() error
	// syncGrads brings the last step's gradients into the single model. Both syncs may be
	// collectives in a run across nodes (see NodeDevices).
	syncGrads() error
	// syncState brings the parameters into the single model and the optimizer state into the
	// trainer's optimizer: what a checkpoint stores and a single-device step continues from.
	syncState() error
	// close frees what the stepper holds beyond the single model and its optimizer.
	close() error
}

// stepOut is what the device work of one step measured.
type stepOut struct {
	loss, norm float64
	// aux is the MoE aux loss (mean over the micro-batches) and load the step's expert load
	// per MoE layer and expert; both unset for dense models.
	aux  float64
	load [][]int
	// metrics are the method's metric sums over the step's micro-batches (nil for pretrain
	// and sft).
	metrics Metrics
}

// Step runs one optimizer step: gradient_accumulation_steps micro-batches whose summed
// token losses are divided by the step's total number of targets (counted first), the global
// gradient norm and clipping, then AdamW at the scheduled learning rate. Steps past the planned
// total are allowed (the schedule stays at its final value). ctx is checked between
// micro-batches.
func (t *Trainer) Step(ctx context.Context) (StepMetrics, error) {
	if r, ok := t.obj.(stepRunner); ok {
		return r.runStep(ctx)
	}
	start := time.Now()
	timers := t.exec.timers()
	for _, ot := range timers {
		ot.ResetOpTimes()
	}
	h := t.hyper
	cur := t.loader.Cursor()
	fail := func(err error) (StepMetrics, error) {
		// Leave the step undone and the data where it was, so the step can be retried.
		_ = t.loader.Seek(cur)
		return StepMetrics{}, err
	}
	batches := make([]data.Batch, h.GradientAccumulationSteps)
	total, tokens := 0, 0
	for i := range batches {
		b, err := t.loader.Next()
		if err != nil {
			return fail(err)
		}
		batches[i] = b
		total += t.obj.Units(b)
		tokens += b.Len()
	}
	if total == 0 {
		return fail(fmt.Errorf("train: the step's micro-batches have nothing to train on (method %s)", t.Cfg.Method))
	}
	lr := t.schedule(h).At(min(t.step, t.totalSteps))
	out, retry, err := t.exec.step(ctx, batches, total, h, lr, t.step+1)
	if err != nil {
		if retry {
			return fail(err)
		}
		return StepMetrics{}, err
	}
	t.step++
	return t.stepMetrics(time.Since(start), out, lr, tokens, total, timers), nil
}

// stepRunner is a method that makes its own micro-batches each step (GRPO samples them from
// the policy) before the common device work; Step hands the whole step to it.
type stepRunner interface {
	runStep(ctx context.Context) (StepMetrics, error)
}

// stepMetrics builds the metrics of the step just done (t.step) from what its device work
// measured, the data it read and how long it took. The time by op class (and "comm.KIND" per
// collective kind, on a plan) is the mean over timers, one per device; it is omitted when
// none recorded anything.
func (t *Trainer) stepMetrics(el time.Duration, o stepOut, lr float64, tokens, targets int, timers []OpTimer) StepMetrics {
	c := t.loader.Cursor()
	m := StepMetrics{
		Step: t.step, Loss: o.loss, GradNorm: o.norm, LR: lr, Tokens: tokens, Targets: targets,
		TokensPerS: float64(tokens) / el.Seconds(), StepTimeS: el.Seconds(),
		Epoch: float64(c.Epoch) + float64(c.Index)/float64(t.loader.BatchesPerEpoch()),
	}
	m.Method = o.metrics.Values()
	if t.model.IsMoE() {
		aux := o.aux
		m.AuxLoss = &aux
		m.ExpertLoad = t.model.ExpertLoadStats(o.load)
	}
	for _, ot := range timers {
		for k, d := range ot.OpTimes() {
			if m.TimeByOpS == nil {
				m.TimeByOpS = map[string]float64{}
			}
			m.TimeByOpS[k] += d.Seconds() / float64(len(timers))
		}
	}
	return m
}

// deviceSteps runs the steps on the single model and its optimizer, on the trainer's backend:
// the single model is the run, so its host view is always current.
type deviceSteps struct {
	m       *models.Model
	opt     *optim.AdamW
	b       backend.Backend
	auxCoef float64   // the objective's aux-loss weight (MoE models)
	ots     []OpTimer // b, when it times its ops
	obj     Objective // the method's loss
	total   int       // the run's planned steps (for StepAt)
}

// deviceStepper returns the stepper of the single model on the trainer's backend.
func (t *Trainer) deviceStepper() *deviceSteps {
	d := &deviceSteps{m: t.model, opt: t.opt, b: t.b, auxCoef: t.auxCoef, obj: t.obj, total: t.totalSteps}
	if ot, ok := t.b.(OpTimer); ok {
		d.ots = []OpTimer{ot}
	}
	return d
}

func (d *deviceSteps) step(ctx context.Context, batches []data.Batch, total int, h Hyper, lr float64, n int) (stepOut, bool, error) {
	var out stepOut
	if err := d.m.ZeroGrads(); err != nil {
		return out, true, err
	}
	moe := d.m.IsMoE()
	if moe {
		// The objective is the mean over micro-batches of CE + coef * aux, so each
		// micro-batch's aux gradient carries coef / micro-batches.
		d.m.SetAuxLossScale(d.auxCoef / float64(len(batches)))
		d.m.TakeExpertLoad() // count this step's micro-batches only
	}
	lossSum, auxSum := 0.0, 0.0
	at := StepAt{Step: n, Total: d.total}
	for i, b := range batches {
		if err := ctx.Err(); err != nil {
			return out, true, err
		}
		s, ms, err := d.obj.ForwardBackward(d.m, b, total, at)
		if err != nil {
			return out, true, fmt.Errorf("train: step %d micro-batch %d: %w", n, i, err)
		}
		lossSum += s
		auxSum += d.m.AuxLoss()
		if len(ms) > 0 {
			if out.metrics == nil {
				out.metrics = Metrics{}
			}
			out.metrics.Merge(ms)
		}
	}
	out.loss = lossSum / float64(total)
	if err := d.m.SettleGrads(); err != nil {
		return out, true, err
	}
	norm, err := optim.GradNorm(d.b, []backend.T{d.m.TrainableGrads()})
	if err != nil {
		return out, true, err
	}
	out.norm = norm
	if math.IsNaN(out.loss) || math.IsInf(out.loss, 0) || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return out, true, fmt.Errorf("train: step %d: loss %v, gradient norm %v are not finite; the update was skipped: lower learning_rate (now %g) or set max_grad_norm", n, out.loss, norm, h.LearningRate)
	}
	d.opt.SetWeightDecay(h.WeightDecay)
	if err := d.opt.Step(lr, optim.ClipCoef(norm, h.MaxGradNorm)); err != nil {
		// Parameters may be partly updated: the trainer cannot retry this step.
		return out, false, err
	}
	if moe {
		out.aux = auxSum / float64(len(batches))
		out.load = d.m.TakeExpertLoad()
		// A no-op unless aux-loss-free balancing is on; the shapes are the model's own.
		if err := d.m.BalanceExpertsWith(out.load); err != nil {
			return out, false, fmt.Errorf("train: step %d: %w", n, err)
		}
	}
	if err := d.b.Sync(); err != nil {
		return out, false, err
	}
	return out, false, nil
}

func (d *deviceSteps) timers() []OpTimer { return d.ots }

func (d *deviceSteps) syncParams() error { return nil }

func (d *deviceSteps) syncGrads() error { return nil }

func (d *deviceSteps) syncState() error { return nil }

func (d *deviceSteps) close() error { return nil }
