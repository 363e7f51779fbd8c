package train

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// newOptimizer builds AdamW over the model's parameters (the adapters' only, when LoRA
// adapters are attached): weight decay only where the parameter
// spec says Decay; adamw_torch keeps fp32 moments (and fp32 masters for bf16 weights),
// adamw_bf16 keeps bf16 weights and moments with stochastic rounding seeded by seed, and
// adamw_bf16_nearest the same rounded to nearest (torch.optim.AdamW on bf16 parameters).
func newOptimizer(m *models.Model, c *Config) (*optim.AdamW, error) {
	if err := m.EnableGrads(); err != nil {
		return nil, err
	}
	if bf16Optim(c.Optim.Optim) && m.DType() != tensor.BF16 {
		return nil, fmt.Errorf("train: optim %s needs bf16 parameters (bf16: true)", c.Optim.Optim)
	}
	specs, vals, grads := m.Specs, m.Params, m.Grads
	if ad := m.LoRA(); ad != nil {
		// Only the adapters train: the frozen base has no gradients and no moments.
		specs, vals, grads = ad.Specs, ad.Params, ad.Grads
	}
	params := make([]optim.Param, len(specs))
	for i, s := range specs {
		params[i] = optim.Param{Name: s.Name, Value: vals.Views[i], Grad: grads.Views[i], NoDecay: !s.Decay}
	}
	o, err := optim.NewAdamW(m.Backend(), params, optimConfig(c))
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return o, nil
}
