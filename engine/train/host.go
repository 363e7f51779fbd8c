package train

import (
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The trainer's single model is reached in two ways. Its shape (Arch, ParamSpecs, NumParams,
// ModelDType) never changes during a run and is read directly. Its values are reached through
// HostModel, which has the trainer's stepper bring a parallel plan's parameters into it
// first; its gradients through SyncGrads. Everything in this package that reads the single
// model's values (Eval, EvalGeneration, Complete, Save, SaveModel, SetLayout) has them brought
// up to date the same way. On one device the single model is the run: nothing is brought.

// HostModel returns the single model holding the run's current parameters, for reading them,
// generating or saving between steps, on the goroutine that drives the trainer. While a
// parallel plan drives the steps, the first call after a step gathers the plan's parameters
// (and the experts' balancing bias) into it; steps never do. The model stays the trainer's:
// do not close it, and use it only until the next Step, SetLayout or Resume (call HostModel
// again then). Its gradients are the last step's after SyncGrads. On one device it is the run
// itself; on a plan, writes to its parameters are not seen by the run and are replaced by the
// next gather.
func (t *Trainer) HostModel() (*models.Model, error) {
	if err := t.exec.syncParams(); err != nil {
		return nil, err
	}
	return t.model, nil
}

// SyncGrads brings the gradients of the last step into the single model (HostModel) when a
// plan computed them; on one device they are there already. Inspection calls it before it
// reads gradients; steps do not need it. Call it on the goroutine that drives the trainer.
func (t *Trainer) SyncGrads() error { return t.exec.syncGrads() }

// Arch is the model's resolved structure (layers, widths, vocabulary); it does not change
// during a run, whatever the layout.
func (t *Trainer) Arch() models.Arch { return t.model.Arch }

// ParamSpecs lists the model's parameters (Hugging Face names and shapes, in arena order).
// The slice is the model's own: do not modify it.
func (t *Trainer) ParamSpecs() []models.ParamSpec { return t.model.Specs }

// NumParams is the model's parameter count.
func (t *Trainer) NumParams() int { return t.model.NumParams() }

// ModelDType is the dtype of the model's parameters.
func (t *Trainer) ModelDType() tensor.DType { return t.model.DType() }
