package train

import (
	"context"
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// planSteps runs the steps on a parallel plan and keeps the single model as the host view of
// the run, filled when read: a step leaves the updated parameters and gradients on the plan's
// devices and marks the host view stale, and syncParams and syncGrads gather them at most
// once per step, when something reads them.
type planSteps struct {
	p       *parallel.Plan
	devices mesh.Devices        // the plan's devices
	recs    []*profile.Recorder // rank r's profile recorder
	devs    []backend.Backend   // rank r's device (the plan owns them)
	ots     []OpTimer           // recs, as op timers
	host    *models.Model       // the single model
	opt     *optim.AdamW        // the single model's optimizer, idle while the plan runs

	obj   Objective // the method's loss
	total int       // the run's planned steps (for StepAt)

	paramsStale bool // the plan's parameters are newer than host's
	gradsStale  bool // the plan's gradients are newer than host's
	gathers     int  // parameter gathers so far
}

// step is Trainer.Step on the plan: the same micro-batches (padded for context parallelism;
// the plan deals them over the data ranks), the same mean over the step's targets (or the
// method's own loss, rowObjective), the same clipping and schedule.
func (ps *planSteps) step(ctx context.Context, batches []data.Batch, total int, h Hyper, lr float64, n int) (stepOut, bool, error) {
	var out stepOut
	l := ps.p.Mesh.Layout
	var loss float64
	var err error
	if ro, ok := ps.obj.(rowObjective); ok {
		loss, out.metrics, err = ps.rowLosses(ro, batches, total, n)
	} else {
		loss, _, err = ps.p.ForwardBackward(planRows(batches, l.CP))
	}
	if err != nil {
		return out, true, fmt.Errorf("train: step %d on %s: %w", n, l, err)
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return out, true, fmt.Errorf("train: step %d: loss %v is not finite; the update was skipped: lower learning_rate (now %g) or set max_grad_norm", n, loss, h.LearningRate)
	}
	out.loss = loss
	ps.p.SetWeightDecay(h.WeightDecay)
	// From here on the plan's parameters may differ from the host view's, even when the
	// update fails part way.
	ps.paramsStale = true
	if out.norm, err = ps.p.Step(lr, h.MaxGradNorm); err != nil {
		// The plan refuses a non-finite gradient norm before any update (other failures may
		// leave parameters partly updated, so the step is not retried). Either way its
		// communicators are closed; SetLayout builds a new plan from its host-side state.
		return out, true, fmt.Errorf("train: step %d on %s: %w; to go on, lower learning_rate (now %g) or set max_grad_norm, and move the run with SetLayout (e.g. %q) to rebuild the devices from their last state",
			n, l, err, h.LearningRate, l.String())
	}
	if err := ps.p.BalanceExperts(); err != nil {
		return out, false, fmt.Errorf("train: step %d on %s: %w", n, l, err)
	}
	ps.gradsStale = true
	if ps.host.IsMoE() {
		out.aux, out.load = ps.p.AuxLoss(), ps.p.ExpertLoad()
	}
	return out, false, nil
}

// rowLosses runs a step of a method with its own loss on the plan: every micro-batch is
// prepared on this goroutine, in order, then run by the data rank that holds it (by each of its
// tensor ranks). It returns the step's mean loss and the method's metric sums, merged in
// micro-batch order as on one device.
func (ps *planSteps) rowLosses(ro rowObjective, batches []data.Batch, total, n int) (float64, Metrics, error) {
	at := StepAt{Step: n, Total: ps.total}
	runs := make([]rowRun, len(batches))
	rows := make([]models.Batch, len(batches))
	for i, b := range batches {
		var err error
		if runs[i], err = ro.prepareRow(b, total, at); err != nil {
			return 0, nil, fmt.Errorf("micro-batch %d: %w", i, err)
		}
		rows[i] = toModelBatch(b)
	}
	sums := make([]float64, len(batches))
	mss := make([]Metrics, len(batches))
	err := ps.p.ForwardBackwardRows(rows, func(m *models.Model, i int, mb models.Batch, primary bool) error {
		s, ms, err := runs[i](m, mb)
		if err != nil {
			return fmt.Errorf("micro-batch %d: %w", i, err)
		}
		if primary {
			sums[i], mss[i] = s, ms
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	lossSum := 0.0
	var metrics Metrics
	for i := range batches {
		lossSum += sums[i]
		if len(mss[i]) > 0 {
			if metrics == nil {
				metrics = Metrics{}
			}
			metrics.Merge(mss[i])
		}
	}
	return lossSum / float64(total), metrics, nil
}

// planRows turns the step's micro-batches into the plan's rows, padded for context
// parallelism of degree cp.
func planRows(batches []data.Batch, cp int) []models.Batch {
	mult := 1
	if cp > 1 {
		mult = 2 * cp
	}
	rows := make([]models.Batch, len(batches))
	for i, b := range batches {
		rows[i] = padRow(b, mult)
	}
	return rows
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

func (ps *planSteps) timers() []OpTimer { return ps.ots }

// syncParams gathers the plan's parameters (and the experts' balancing bias) into the host
// model when a step changed them since the last gather. In a run across nodes it is a
// collective where Plan.Params is.
func (ps *planSteps) syncParams() error {
	if !ps.paramsStale {
		return nil
	}
	if err := ps.gather(); err != nil {
		return err
	}
	ps.paramsStale = false
	return nil
}

// gather copies the plan's parameters into the host model.
func (ps *planSteps) gather() error {
	if err := ps.p.Gather(ps.host); err != nil {
		return fmt.Errorf("train: gather parameters: %w", err)
	}
	ps.gathers++
	return nil
}

// syncGrads gathers the last step's gradients into the host model when a step computed them
// since the last gather. In a run across nodes it is a collective where Plan.Grads is.
func (ps *planSteps) syncGrads() error {
	if !ps.gradsStale {
		return nil
	}
	gs, err := ps.p.Grads()
	if err != nil {
		return fmt.Errorf("train: gather gradients: %w", err)
	}
	b := ps.host.Backend()
	specs, grads := ps.host.Specs, ps.host.Grads
	if ad := ps.host.LoRA(); ad != nil {
		// Only the adapters have gradients.
		if err := ps.host.EnableGrads(); err != nil {
			return err
		}
		specs, grads = ad.Specs, ad.Grads
	}
	for i, s := range specs {
		v, ok := gs[s.Name]
		if !ok {
			return fmt.Errorf("train: gather gradients: the plan has no gradient of %q", s.Name)
		}
		g := grads.Views[i]
		raw, err := tensor.EncodeFloat32(g.DType(), v)
		if err != nil {
			return fmt.Errorf("train: gather gradients: %q: %w", s.Name, err)
		}
		if err := b.Upload(g, raw); err != nil {
			return fmt.Errorf("train: gather gradients: %q: %w", s.Name, err)
		}
	}
	ps.gradsStale = false
	return nil
}

// syncState brings the plan's parameters into the host model and its layout-free optimizer
// state into the host model's optimizer.
func (ps *planSteps) syncState() error {
	if err := ps.syncParams(); err != nil {
		return err
	}
	steps, st, err := ps.p.OptimizerState()
	if err != nil {
		return fmt.Errorf("train: gather optimizer state: %w", err)
	}
	if err := ps.opt.Import(steps, st); err != nil {
		return fmt.Errorf("train: gather optimizer state: %w", err)
	}
	return nil
}

// close frees the plan: its ranks' models, optimizers and devices, and its communicators.
func (ps *planSteps) close() error { return ps.p.Close() }
