package train

import (
	"fmt"
)

// setupMoE applies the config's mixture-of-experts settings to the freshly built model: the
// aux-loss weight (router_aux_loss_coef overrides the model's own) and aux-loss-free
// balancing (moe_balancing_rate). Both keys are refused on a dense model when they would
// change anything.
func (t *Trainer) setupMoE() error {
	o := t.Cfg.Optim
	if !t.model.IsMoE() {
		if o.MoEBalancingRate != 0 {
			return &FieldError{Key: "moe_balancing_rate", Msg: fmt.Sprintf("%v is set but the model (%s) has no mixture-of-experts layer; remove the key or set it to 0", o.MoEBalancingRate, t.model.Arch.ModelType)}
		}
		if o.RouterAuxLossCoef != nil && *o.RouterAuxLossCoef != 0 {
			return &FieldError{Key: "router_aux_loss_coef", Msg: fmt.Sprintf("%v is set but the model (%s) has no mixture-of-experts layer; remove the key", *o.RouterAuxLossCoef, t.model.Arch.ModelType)}
		}
		return nil
	}
	coef := t.model.AuxLossScale()
	if o.RouterAuxLossCoef != nil {
		coef = *o.RouterAuxLossCoef
	}
	t.model.SetAuxLossScale(coef)
	t.auxCoef = coef
	if err := t.model.SetExpertBalancing(o.MoEBalancingRate); err != nil {
		return &FieldError{Key: "moe_balancing_rate", Msg: err.Error()}
	}
	return nil
}

// AuxLossCoef is the weight of the MoE load-balancing loss in the training objective (0 for
// dense models or when it is off).
func (t *Trainer) AuxLossCoef() float64 { return t.auxCoef }

// ExpertBias returns the aux-loss-free balancing bias of each MoE layer, in layer order (nil
// when balancing is off).
func (t *Trainer) ExpertBias() [][]float32 {
	if ps := t.onPlan(); ps != nil {
		return ps.p.ExpertBias()
	}
	return t.model.ExpertBias()
}
