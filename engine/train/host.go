package train

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The trainer's single model is reached in two ways. Its shape (Arch, ParamSpecs, NumParams,
// ModelDType) never changes during a run and is read directly. Its values are reached through
// HostModel, which brings a parallel plan's parameters into it first (SyncParams); its
// gradients through SyncGrads. Everything in this package that reads the single model's
// parameters (Eval, EvalGeneration, Complete, Save, SaveModel, SetLayout) syncs them itself.

// SyncParams brings the parameters of the last step into the single model when a parallel
// plan computed them (a gather of every parameter, and of the experts' balancing bias, from
// the devices). On one device, or when nothing changed since the last gather, it does
// nothing. Steps do not call it: a plan's parameters stay on its devices until something
// reads them. Call it on the goroutine that drives the trainer, between steps.
func (t *Trainer) SyncParams() error {
	if t.plan == nil || !t.paramsStale {
		return nil
	}
	if err := t.plan.Gather(t.model); err != nil {
		return fmt.Errorf("train: gather parameters: %w", err)
	}
	t.paramsStale = false
	t.gathers++
	return nil
}

// HostModel returns the single model holding the run's current parameters (after SyncParams),
// for reading them, generating or saving between steps, on the goroutine that drives the
// trainer. The model stays the trainer's: do not close it, and use it only until the next
// Step, SetLayout or Resume (call HostModel again then). Its gradients are the last step's
// after SyncGrads. On one device it is the run itself; while a parallel plan drives the
// steps, the plan holds the parameters the steps use, so writes to the host model's
// parameters are not seen by the run and are replaced by the next gather.
func (t *Trainer) HostModel() (*models.Model, error) {
	if err := t.SyncParams(); err != nil {
		return nil, err
	}
	return t.model, nil
}

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
