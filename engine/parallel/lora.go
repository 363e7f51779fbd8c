package parallel

import (
	"errors"
	"fmt"

	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// loraPlan is what a plan of a model with LoRA adapters keeps: the adapters' configuration
// and spec table (the only parameters that train; the base is frozen and replicated), and the
// dropout stream position, advanced by one per row so that row i of a step draws the masks
// the single-device run draws for its micro-batch i.
type loraPlan struct {
	cfg        models.LoRAConfig
	specs      []models.ParamSpec
	dropoutKey uint64
}

// checkLoRA refuses layouts and sources that a plan cannot carry adapters over (rule
// mesh.RuleAdapters): only plain data parallelism in one process.
func checkLoRA(src *models.Model, l mesh.Layout, n int, o Options) error {
	if src.LoRA() == nil {
		return nil
	}
	if err := mesh.CheckAdapters(l, n); err != nil {
		return fmt.Errorf("parallel: %w", err)
	}
	if o.Local != nil {
		return fmt.Errorf("parallel: rule %s: LoRA adapters are not laid out over several processes (a run across nodes); run on the devices of one node", mesh.RuleAdapters)
	}
	if q, _, _ := src.Quantized(); q {
		return fmt.Errorf("parallel: rule %s: a 4-bit (load_in_4bit) base is not laid out over devices; run QLoRA on one device", mesh.RuleAdapters)
	}
	return nil
}

// attachLoRA gives rank rk's model src's adapters (their values copied) after bind has copied
// the base.
func (p *Plan) attachLoRA(rk *rank, src *models.Model) error {
	if p.lora == nil {
		return nil
	}
	if err := rk.m.AttachLoRA(p.lora.cfg); err != nil {
		return fmt.Errorf("parallel: rank %d: %w", rk.id, err)
	}
	for _, s := range p.lora.specs {
		v, err := src.AdapterFloat32(s.Name)
		if err != nil {
			return err
		}
		if err := rk.m.SetAdapterParam(s.Name, v); err != nil {
			return fmt.Errorf("parallel: rank %d: %w", rk.id, err)
		}
	}
	return nil
}

// setupLoRAOptimizer lists rank rk's adapters as its optimizer's parameters: replicated over
// the data group, each counted once (by data rank 0) in the gradient norm.
func (p *Plan) setupLoRAOptimizer(rk *rank) {
	ad := rk.m.LoRA()
	for i, s := range ad.Specs {
		rk.optElem = append(rk.optElem, 0)
		rk.optParams = append(rk.optParams, optim.Param{Name: s.Name, Value: ad.Params.Views[i], Grad: ad.Grads.Views[i], NoDecay: !s.Decay})
		rk.countNorm = append(rk.countNorm, rk.dataRank == 0)
	}
}

// trainedSpecs is the table of what the plan's optimizers update: the adapters of a LoRA
// plan, else every parameter.
func (p *Plan) trainedSpecs() []models.ParamSpec {
	if p.lora != nil {
		return p.lora.specs
	}
	return p.specs
}

// sizesOf maps each trained parameter of rank model m to its element count.
func (p *Plan) sizesOf(m *models.Model) map[string]int {
	specs := m.Specs
	if ad := m.LoRA(); ad != nil {
		specs = ad.Specs
	}
	size := make(map[string]int, len(specs))
	for _, s := range specs {
		size[s.Name] = s.Numel()
	}
	return size
}

// DropoutKey is the adapters' dropout stream position after the plan's last step (the
// single-device model's models.Model.DropoutKey for the same run); 0 without adapters.
func (p *Plan) DropoutKey() uint64 {
	if p.lora == nil {
		return 0
	}
	return p.lora.dropoutKey
}

// AdapterParams returns the adapters' values by name (every data replica holds the same).
func (p *Plan) AdapterParams() (map[string][]float32, error) {
	return p.adapterValues((*models.Model).AdapterFloat32)
}

// AdapterGrads returns the adapters' reduced gradients by name (after ForwardBackward).
func (p *Plan) AdapterGrads() (map[string][]float32, error) {
	return p.adapterValues((*models.Model).AdapterGradFloat32)
}

func (p *Plan) adapterValues(get func(*models.Model, string) ([]float32, error)) (map[string][]float32, error) {
	if p.lora == nil {
		return nil, errors.New("parallel: the plan's model has no LoRA adapters")
	}
	out := make(map[string][]float32, len(p.lora.specs))
	for _, s := range p.lora.specs {
		v, err := get(p.ranks[0].m, s.Name)
		if err != nil {
			return nil, err
		}
		out[s.Name] = v
	}
	return out, nil
}

// gatherLoRA writes the adapters into dst (attaching them first when dst has none), and the
// dropout stream position.
func (p *Plan) gatherLoRA(dst *models.Model) error {
	if p.lora == nil {
		return nil
	}
	if dst.LoRA() == nil {
		if err := dst.AttachLoRA(p.lora.cfg); err != nil {
			return err
		}
	}
	vals, err := p.AdapterParams()
	if err != nil {
		return err
	}
	for _, s := range p.lora.specs {
		if err := dst.SetAdapterParam(s.Name, vals[s.Name]); err != nil {
			return err
		}
	}
	dst.SetDropoutKey(p.lora.dropoutKey)
	return nil
}
