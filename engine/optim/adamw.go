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
	// Nearest makes BF16 mode round weights and moments to nearest even instead of
	// stochastically: what torch.optim.AdamW does with bf16 parameters (updates smaller than
	// half a bf16 unit are lost).
	Nearest bool
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
	p      Param
	master tensor.Tensor // F32 master view (MasterF32 with a BF16 Value), else zero
	m, v   tensor.Tensor // views into the moment arenas
}

// AdamW is the optimizer: state for each parameter plus the step count. Moments (and fp32
// masters) live in one allocation each, with a view per parameter. Use it from the goroutine
// that owns the backend.
type AdamW struct {
	b            backend.Backend
	cfg          Config
	slots        []slot
	step         int
	mFlat, vFlat tensor.Tensor
	masterFlat   tensor.Tensor
	fused        func(backend.AdamWArgs) error // b's optional AdamW; nil: host fallback
	host         *cpu.Backend                  // the host fallback's backend
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
	seen := map[string]bool{}
	total, masterTotal := 0, 0
	for _, p := range params {
		if seen[p.Name] {
			return nil, fmt.Errorf("optim: parameter name %q appears twice", p.Name)
		}
		seen[p.Name] = true
		if err := checkParam(p, cfg.Mode); err != nil {
			return nil, err
		}
		total += p.Value.Numel()
		if cfg.Mode == MasterF32 && p.Value.DType() == tensor.BF16 {
			masterTotal += p.Value.Numel()
		}
	}
	o := &AdamW{b: b, cfg: cfg}
	mdt := tensor.F32
	if cfg.Mode == BF16 {
		mdt = tensor.BF16
	}
	var err error
	if o.mFlat, err = b.Alloc(mdt, total); err != nil {
		return nil, fmt.Errorf("optim: exp_avg for %d parameters: %w", total, err)
	}
	if o.vFlat, err = b.Alloc(mdt, total); err != nil {
		o.Free()
		return nil, fmt.Errorf("optim: exp_avg_sq for %d parameters: %w", total, err)
	}
	if masterTotal > 0 {
		if o.masterFlat, err = b.Alloc(tensor.F32, masterTotal); err != nil {
			o.Free()
			return nil, fmt.Errorf("optim: fp32 master weights for %d parameters: %w", masterTotal, err)
		}
	}
	off, moff := 0, 0
	for _, p := range params {
		n := p.Value.Numel()
		s := slot{p: p}
		s.m, _ = o.mFlat.View(off, n)
		s.v, _ = o.vFlat.View(off, n)
		off += n
		if cfg.Mode == MasterF32 && p.Value.DType() == tensor.BF16 {
			s.master, _ = o.masterFlat.View(moff, n)
			moff += n
			if err := b.Copy(s.master, p.Value); err != nil {
				o.Free()
				return nil, fmt.Errorf("optim: parameter %q: master weights: %w", p.Name, err)
			}
		}
		o.slots = append(o.slots, s)
	}
	if o.fused = b.Optional().AdamW; o.fused == nil {
		o.host = cpu.New(cpu.Options{})
	}
	return o, nil
}

func checkParam(p Param, mode Mode) error {
	if p.Value.IsNil() || p.Grad.IsNil() {
		return fmt.Errorf("optim: parameter %q: value and gradient tensors are required", p.Name)
	}
	if p.Grad.Numel() != p.Value.Numel() {
		return fmt.Errorf("optim: parameter %q: gradient %v does not match value %v", p.Name, p.Grad, p.Value)
	}
	vdt := p.Value.DType()
	if vdt != tensor.F32 && vdt != tensor.BF16 {
		return fmt.Errorf("optim: parameter %q: value dtype %s (want f32 or bf16)", p.Name, vdt)
	}
	if mode == BF16 && vdt != tensor.BF16 {
		return fmt.Errorf("optim: parameter %q is %s; adamw-bf16 needs bf16 weights (load the model in bf16 or use adamw)", p.Name, vdt)
	}
	return nil
}

// Free releases the optimizer state.
func (o *AdamW) Free() {
	for _, t := range []*tensor.Tensor{&o.mFlat, &o.vFlat, &o.masterFlat} {
		if !t.IsNil() {
			_ = o.b.Free(*t)
			*t = tensor.Tensor{}
		}
	}
	o.slots = nil
	if o.host != nil {
		o.host.Close()
		o.host = nil
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
			Stochastic: o.cfg.Mode == BF16 && !o.cfg.Nearest, Seed: o.cfg.Seed, ParamIndex: uint32(i),
		}
		FillPrecise(&a, lr, o.cfg.Beta1, o.cfg.Beta2, wd)
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
	if o.fused != nil {
		return o.fused(a)
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

// FillPrecise sets the optional float64-derived scalars of a (Weight1, Weight2, Decay, StepSize,
// BC2Sqrt) from the exact hyperparameters, as torch computes them from Python floats, so any
// backend's fused AdamW matches torch.optim.AdamW to fp32 rounding. a.Step must be set.
func FillPrecise(a *backend.AdamWArgs, lr, beta1, beta2, weightDecay float64) {
	a.Weight1 = float32(1 - beta1)
	a.Weight2 = float32(1 - beta2)
	a.Decay = float32(1 - lr*weightDecay)
	a.StepSize = float32(lr / (1 - math.Pow(beta1, float64(a.Step))))
	a.BC2Sqrt = float32(math.Sqrt(1 - math.Pow(beta2, float64(a.Step))))
}

// NoDecayByShape is the usual rule for excluding parameters from weight decay: 1-D (and
// scalar) parameters, i.e. norm gains and biases.
func NoDecayByShape(shape tensor.Shape) bool { return len(shape) <= 1 }
