package optim

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Param is one trainable tensor as the optimizer sees it.
type Param struct {
	Name    string        // unique; names the state entries in checkpoints
	Value   tensor.Tensor // the model's weights (F32 or BF16), updated in place
	Grad    tensor.Tensor // same element count as Value (F32 or BF16)
	NoDecay bool          // exclude from weight decay (norm gains, biases: 1-D parameters)
}

// Mode selects how weights and moments are stored.
type Mode int

const (
	// MasterF32 keeps fp32 moments and, for bf16 model weights, an fp32 master copy that is
	// rounded (to nearest even) into the model weights after each step. fp32 model weights are
	// their own master. 12 bytes per parameter of optimizer state (+2 for the bf16 weights).
	MasterF32 Mode = iota
	// BF16 keeps bf16 weights and bf16 moments, updated in fp32 registers and stored with
	// stochastic rounding keyed on (seed, step, parameter index, element): 6 bytes per
	// parameter in total, deterministic for a given seed.
	BF16
)

func (m Mode) String() string {
	switch m {
	case MasterF32:
		return "adamw"
	case BF16:
		return "adamw-bf16"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Config holds AdamW hyperparameters (torch.optim.AdamW names and defaults apply when zero:
// Beta1 0.9, Beta2 0.999, Eps 1e-8).
type Config struct {
	Mode        Mode
	Beta1       float64
	Beta2       float64
	Eps         float64
	WeightDecay float64
	Seed        uint64 // stochastic rounding stream (BF16 mode)
}

func (c Config) withDefaults() Config {
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.999
	}
	if c.Eps == 0 {
		c.Eps = 1e-8
	}
	return c
}

type slot struct {
	p       Param
	master  tensor.Tensor // F32 master copy (MasterF32 with a BF16 Value), else zero
	m, v    tensor.Tensor
	ownsMst bool
}

// AdamW is the optimizer: state for each parameter plus the step count. Use it from the
// goroutine that owns the backend.
type AdamW struct {
	b     backend.Backend
	cfg   Config
	slots []slot
	step  int
	host  *cpu.Backend // fallback when b has no AdamWStepper
}

// NewAdamW allocates optimizer state on b for params. Parameter names must be unique; in BF16
// mode every Value must be BF16.
func NewAdamW(b backend.Backend, params []Param, cfg Config) (*AdamW, error) {
	cfg = cfg.withDefaults()
	if cfg.Beta1 < 0 || cfg.Beta1 >= 1 || cfg.Beta2 < 0 || cfg.Beta2 >= 1 {
		return nil, fmt.Errorf("optim: adam betas (%v, %v) must be in [0, 1)", cfg.Beta1, cfg.Beta2)
	}
	if cfg.Eps <= 0 || cfg.WeightDecay < 0 {
		return nil, fmt.Errorf("optim: adam_epsilon %v must be > 0 and weight_decay %v >= 0", cfg.Eps, cfg.WeightDecay)
	}
	if cfg.Mode != MasterF32 && cfg.Mode != BF16 {
		return nil, fmt.Errorf("optim: unknown mode %v", cfg.Mode)
	}
	o := &AdamW{b: b, cfg: cfg}
	seen := map[string]bool{}
	for _, p := range params {
		if seen[p.Name] {
			o.Free()
			return nil, fmt.Errorf("optim: parameter name %q appears twice", p.Name)
		}
		seen[p.Name] = true
		if err := o.add(p); err != nil {
			o.Free()
			return nil, err
		}
	}
	if _, ok := b.(backend.AdamWStepper); !ok {
		o.host = cpu.New(cpu.Options{})
	}
	return o, nil
}

func (o *AdamW) add(p Param) error {
	n := p.Value.Numel()
	if p.Value.IsNil() || p.Grad.IsNil() {
		return fmt.Errorf("optim: parameter %q: value and gradient tensors are required", p.Name)
	}
	if p.Grad.Numel() != n {
		return fmt.Errorf("optim: parameter %q: gradient %v does not match value %v", p.Name, p.Grad, p.Value)
	}
	vdt := p.Value.DType()
	if vdt != tensor.F32 && vdt != tensor.BF16 {
		return fmt.Errorf("optim: parameter %q: value dtype %s (want f32 or bf16)", p.Name, vdt)
	}
	s := slot{p: p}
	mdt := tensor.F32
	if o.cfg.Mode == BF16 {
		if vdt != tensor.BF16 {
			return fmt.Errorf("optim: parameter %q is %s; adamw-bf16 needs bf16 weights (load the model in bf16 or use adamw)", p.Name, vdt)
		}
		mdt = tensor.BF16
	}
	var err error
	if s.m, err = o.b.Alloc(mdt, n); err != nil {
		return fmt.Errorf("optim: parameter %q: exp_avg: %w", p.Name, err)
	}
	if s.v, err = o.b.Alloc(mdt, n); err != nil {
		_ = o.b.Free(s.m)
		return fmt.Errorf("optim: parameter %q: exp_avg_sq: %w", p.Name, err)
	}
	if o.cfg.Mode == MasterF32 && vdt == tensor.BF16 {
		if s.master, err = o.b.Alloc(tensor.F32, n); err != nil {
			_ = o.b.Free(s.m)
			_ = o.b.Free(s.v)
			return fmt.Errorf("optim: parameter %q: master weights: %w", p.Name, err)
		}
		if err := o.b.Copy(s.master, p.Value); err != nil {
			return fmt.Errorf("optim: parameter %q: master weights: %w", p.Name, err)
		}
		s.ownsMst = true
	}
	o.slots = append(o.slots, s)
	return nil
}

// Free releases the optimizer state.
func (o *AdamW) Free() {
	for _, s := range o.slots {
		_ = o.b.Free(s.m)
		_ = o.b.Free(s.v)
		if s.ownsMst {
			_ = o.b.Free(s.master)
		}
	}
	o.slots = nil
	if o.host != nil {
		o.host.Close()
	}
}

// Steps returns the number of updates taken.
func (o *AdamW) Steps() int { return o.step }

// Config returns the hyperparameters in use (defaults filled in).
func (o *AdamW) Config() Config { return o.cfg }

// SetWeightDecay changes the decoupled weight decay for following steps.
func (o *AdamW) SetWeightDecay(wd float64) { o.cfg.WeightDecay = wd }

// Step applies one update to every parameter with learning rate lr, multiplying gradients by
// gradScale first (the clipping coefficient from ClipCoef, or 1).
func (o *AdamW) Step(lr, gradScale float64) error {
	if math.IsNaN(lr) || math.IsInf(lr, 0) || lr < 0 {
		return fmt.Errorf("optim: step %d: learning rate %v must be finite and >= 0", o.step+1, lr)
	}
	if !(gradScale > 0) || math.IsInf(gradScale, 0) {
		return fmt.Errorf("optim: step %d: gradient scale %v must be finite and > 0 (skip the step when the gradient norm is not finite)", o.step+1, gradScale)
	}
	step := o.step + 1
	for i, s := range o.slots {
		wd := o.cfg.WeightDecay
		if s.p.NoDecay {
			wd = 0
		}
		a := backend.AdamWArgs{
			Param: s.p.Value, Grad: s.p.Grad, M: s.m, V: s.v,
			LR: float32(lr), Beta1: float32(o.cfg.Beta1), Beta2: float32(o.cfg.Beta2), Eps: float32(o.cfg.Eps),
			WeightDecay: float32(wd), GradScale: float32(gradScale), Step: step,
			Stochastic: o.cfg.Mode == BF16, Seed: o.cfg.Seed, ParamIndex: uint32(i),
			Weight1:  float32(1 - o.cfg.Beta1),
			Weight2:  float32(1 - o.cfg.Beta2),
			Decay:    float32(1 - lr*wd),
			StepSize: float32(lr / (1 - math.Pow(o.cfg.Beta1, float64(step)))),
			BC2Sqrt:  float32(math.Sqrt(1 - math.Pow(o.cfg.Beta2, float64(step)))),
		}
		if !s.master.IsNil() {
			a.Param, a.Shadow = s.master, s.p.Value
		}
		if err := o.apply(a); err != nil {
			return fmt.Errorf("optim: step %d: parameter %q: %w", step, s.p.Name, err)
		}
	}
	o.step = step
	return nil
}

func (o *AdamW) apply(a backend.AdamWArgs) error {
	if st, ok := o.b.(backend.AdamWStepper); ok {
		return st.AdamW(a)
	}
	// Host fallback: copy the tensors to the CPU reference backend, update, copy back.
	h := o.host
	type pair struct {
		dev, host tensor.Tensor
		back      bool
	}
	var pairs []pair
	defer func() {
		for _, p := range pairs {
			_ = h.Free(p.host)
		}
	}()
	for _, x := range []struct {
		t    *tensor.Tensor
		back bool
	}{{&a.Param, true}, {&a.Grad, false}, {&a.M, true}, {&a.V, true}, {&a.Shadow, true}} {
		if x.t.IsNil() {
			continue
		}
		ht, err := h.Alloc(x.t.DType(), x.t.Numel())
		if err != nil {
			return err
		}
		pairs = append(pairs, pair{*x.t, ht, x.back})
		raw := make([]byte, x.t.Bytes())
		if err := o.b.Download(raw, *x.t); err != nil {
			return err
		}
		if err := h.Upload(ht, raw); err != nil {
			return err
		}
		*x.t = ht
	}
	if err := h.AdamW(a); err != nil {
		return err
	}
	for _, p := range pairs {
		if !p.back {
			continue
		}
		raw := make([]byte, p.host.Bytes())
		if err := h.Download(raw, p.host); err != nil {
			return err
		}
		if err := o.b.Upload(p.dev, raw); err != nil {
			return err
		}
	}
	return nil
}
