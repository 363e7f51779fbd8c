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
	runs         []run                         // blocks of slots updated by one call each
}

// run is a block of consecutive parameters that one AdamW call updates: their values,
// gradients, fp32 masters and moments each lie back to back in one buffer (parameters of one
// arena do, in table order), and they share the weight decay. AdamW is elementwise, so the
// block's update equals its parameters' updates one by one, bit for bit. Only the stochastic
// rounding of BF16 mode keys its random stream on the parameter index, so there every
// parameter is its own run. A mixture-of-experts layer's hundreds of expert tensors are one
// run: one launch instead of one per tensor.
type run struct {
	first, n                  int // slots [first, first+n)
	value, grad, master, m, v tensor.Tensor
}

// adjacent reports whether b starts where a ends, in the same buffer and dtype.
func adjacent(a, b tensor.Tensor) bool {
	if a.IsNil() || b.IsNil() {
		return a.IsNil() && b.IsNil()
	}
	return a.Buffer() == b.Buffer() && a.DType() == b.DType() && b.Offset() == a.Offset()+a.Bytes()
}

// span returns the 1-D view of n elements starting at t.
func span(t tensor.Tensor, n int) tensor.Tensor {
	if t.IsNil() {
		return t
	}
	v, err := tensor.New(t.Buffer(), t.Offset(), t.DType(), n)
	if err != nil {
		return tensor.Tensor{}
	}
	return v
}

// planRuns groups the slots into runs (see run); merge false keeps one slot per run.
func (o *AdamW) planRuns(merge bool) {
	o.runs = o.runs[:0]
	for i := 0; i < len(o.slots); {
		j := i + 1
		for merge && j < len(o.slots) {
			a, b := o.slots[j-1], o.slots[j]
			if a.p.NoDecay != b.p.NoDecay || !adjacent(a.p.Value, b.p.Value) || !adjacent(a.p.Grad, b.p.Grad) ||
				!adjacent(a.master, b.master) || !adjacent(a.m, b.m) || !adjacent(a.v, b.v) {
				break
			}
			j++
		}
		r := run{first: i, n: j - i}
		if r.n == 1 {
			s := o.slots[i]
			r.value, r.grad, r.master, r.m, r.v = s.p.Value, s.p.Grad, s.master, s.m, s.v
		} else {
			n := 0
			for _, s := range o.slots[i:j] {
				n += s.p.Value.Numel()
			}
			s := o.slots[i]
			r.value, r.grad, r.master, r.m, r.v = span(s.p.Value, n), span(s.p.Grad, n), span(s.master, n), span(s.m, n), span(s.v, n)
			if r.value.IsNil() || r.grad.IsNil() || r.m.IsNil() || r.v.IsNil() || r.master.IsNil() != s.master.IsNil() {
				// Not expressible as one view: keep the first slot alone and go on.
				r, j = run{first: i, n: 1, value: s.p.Value, grad: s.p.Grad, master: s.master, m: s.m, v: s.v}, i+1
			}
		}
		o.runs = append(o.runs, r)
		i = j
	}
}

// Launches is the number of AdamW calls one Step makes (one per run of parameters).
func (o *AdamW) Launches() int { return len(o.runs) }

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
	o.planRuns(!o.stochastic())
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

// stochastic reports whether the update rounds bf16 stores stochastically.
func (o *AdamW) stochastic() bool { return o.cfg.Mode == BF16 && !o.cfg.Nearest }

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
	for _, r := range o.runs {
		first := o.slots[r.first]
		wd := o.cfg.WeightDecay
		if first.p.NoDecay {
			wd = 0
		}
		a := backend.AdamWArgs{
			Param: r.value, Grad: r.grad, M: r.m, V: r.v,
			LR: float32(lr), Beta1: float32(o.cfg.Beta1), Beta2: float32(o.cfg.Beta2), Eps: float32(o.cfg.Eps),
			WeightDecay: float32(wd), GradScale: float32(gradScale), Step: step,
			Stochastic: o.stochastic(), Seed: o.cfg.Seed, ParamIndex: uint32(r.first),
		}
		FillPrecise(&a, lr, o.cfg.Beta1, o.cfg.Beta2, wd)
		if !r.master.IsNil() {
			a.Param, a.Shadow = r.master, r.value
		}
		if err := o.apply(a); err != nil {
			if r.n > 1 {
				return fmt.Errorf("optim: step %d: parameters %q to %q: %w", step, first.p.Name, o.slots[r.first+r.n-1].p.Name, err)
			}
			return fmt.Errorf("optim: step %d: parameter %q: %w", step, first.p.Name, err)
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
