package models

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// LoRAConfig are the adapter hyperparameters, named as PEFT's LoraConfig names them.
type LoRAConfig struct {
	// R is the adapter rank (r, > 0).
	R int
	// Alpha is lora_alpha; the adapter output is scaled by Alpha/R (Alpha/sqrt(R) with RSLoRA).
	Alpha float64
	// Dropout is lora_dropout: the probability of zeroing an adapter input element during
	// training, in [0, 1).
	Dropout float64
	// Targets are PEFT's target_modules: module names matched as the last components of a
	// linear layer's name ("q_proj", "self_attn.o_proj"), or the single entry "all-linear"
	// (every linear layer except the LM head).
	Targets []string
	// TargetPattern is PEFT's other form of target_modules, a regular expression that the
	// whole module name must match (as re.fullmatch); set instead of Targets.
	TargetPattern string
	// RSLoRA is use_rslora: scale by Alpha/sqrt(R) instead of Alpha/R.
	RSLoRA bool
	// Seed keys the initialisation of A and the dropout masks.
	Seed uint64
}

// AllLinear is PEFT's target_modules shorthand for every linear layer but the LM head.
const AllLinear = "all-linear"

// Scale is the factor applied to the adapter's output.
func (c LoRAConfig) Scale() float64 {
	if c.RSLoRA {
		return c.Alpha / math.Sqrt(float64(c.R))
	}
	return c.Alpha / float64(c.R)
}

// Validate checks the hyperparameters.
func (c LoRAConfig) Validate() error {
	switch {
	case c.R <= 0:
		return fmt.Errorf("models: lora r must be > 0, got %d", c.R)
	case !(c.Alpha > 0) || math.IsInf(c.Alpha, 0):
		return fmt.Errorf("models: lora_alpha must be a finite number > 0, got %v", c.Alpha)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("models: lora_dropout must be in [0, 1), got %v", c.Dropout)
	case c.TargetPattern != "" && len(c.Targets) > 0:
		return errors.New("models: lora target_modules is either a list of names or a pattern, not both")
	case c.TargetPattern != "":
		_, err := targetPattern(c.TargetPattern)
		return err
	case len(c.Targets) == 0:
		return errors.New(`models: lora target_modules is empty: name the linear layers to adapt (for example ["q_proj", "v_proj"]) or use "all-linear"`)
	}
	for _, t := range c.Targets {
		if t == AllLinear && len(c.Targets) > 1 {
			return fmt.Errorf("models: lora target_modules: %q stands alone (got %q)", AllLinear, c.Targets)
		}
		if t == "" || strings.HasPrefix(t, ".") || strings.HasSuffix(t, ".") {
			return fmt.Errorf("models: lora target_modules: %q is not a module name", t)
		}
		if strings.HasSuffix(t, "lm_head") || strings.HasSuffix(t, "embed_tokens") {
			return fmt.Errorf("models: lora target_modules: %q is not supported (adapters go on the decoder's linear layers, not the embedding or the LM head)", t)
		}
	}
	return nil
}

// LoRAModule is one adapted linear layer.
type LoRAModule struct {
	// Name is the layer's HF module name, e.g. "model.layers.0.self_attn.q_proj".
	Name string
	// In and Out are the layer's input and output features: A is [R,In], B [Out,R].
	In, Out int
}

// AName and BName are the adapter parameter names (PEFT's keys without the
// "base_model.model." prefix).
func (l LoRAModule) AName() string { return l.Name + ".lora_A.weight" }
func (l LoRAModule) BName() string { return l.Name + ".lora_B.weight" }

// Adapters are the LoRA adapters of a model: their parameters and gradients live in their own
// arenas laid out from Specs (A then B per module, in the model's layer order), the only
// parameters that train while adapters are attached.
type Adapters struct {
	Config  LoRAConfig
	Modules []LoRAModule
	Specs   []ParamSpec
	Params  *Arena
	Grads   *Arena // nil until the first ForwardBackward or EnableGrads
}

// NumParams is the number of adapter parameters.
func (a *Adapters) NumParams() int {
	n := 0
	for _, s := range a.Specs {
		n += s.Numel()
	}
	return n
}

// linearLayers lists every linear layer an adapter can target, in layer order: the attention
// projections (or a conv layer's in_proj and out_proj) and the dense MLP projections (routers
// and routed experts are not linear layers in transformers' MoE blocks, as PEFT sees them:
// "all-linear" skips them too). A layer without a value projection (Gemma 4's shared
// key/value layers) lists none.
func (m *Model) linearLayers() []*nn.Linear {
	var ls []*nn.Linear
	for _, b := range m.blocks {
		switch at := b.Attn; {
		case at.Latent != nil:
			ls = append(ls, at.Latent.Linears()...)
		case at.Linear != nil:
			ls = append(ls, at.Linear.Linears()...)
		case at.Conv != nil:
			ls = append(ls, &at.Conv.InProj, &at.Conv.OutProj)
		case at.MoA != nil:
			// The experts' query and output projections are one tensor each over the experts,
			// not linear layers; kv_proj is.
			ls = append(ls, &at.MoA.KV)
		case at.KVIn != nil:
			ls = append(ls, &at.Q, &at.O) // keys and values come from an earlier layer
		default:
			ls = append(ls, &at.Q, &at.K)
			if !at.KEqV {
				ls = append(ls, &at.V)
			}
			ls = append(ls, &at.O)
		}
		mlp, ok := b.FFN.(*nn.MLP)
		if beside, isBeside := b.FFN.(*nn.MoEBesideMLP); isBeside {
			mlp, ok = beside.MLP, true // the dense MLP beside Gemma 4's experts
		}
		if ok {
			ls = append(ls, &mlp.Gate, &mlp.Up, &mlp.Down)
		}
	}
	return ls
}

// matchTarget reports whether module name is selected by PEFT-style target t: equal to it or
// ending in "." + t.
func matchTarget(name, t string) bool {
	return t == AllLinear || name == t || strings.HasSuffix(name, "."+t)
}

// AttachLoRA adds freshly initialised adapters to the linear layers c.Targets selects and
// freezes the base: the base gradient arena is freed and never allocated again while adapters
// are attached, and only adapter parameters have gradients. A is drawn as torch's nn.Linear
// and PEFT initialise it (Kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), B is
// zero, so the adapted model starts equal to the base.
func (m *Model) AttachLoRA(c LoRAConfig) error {
	if m.lora != nil {
		return errors.New("models: adapters are already attached (merge or detach them first)")
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if m.Family.Host != nil {
		return fmt.Errorf("models: LoRA on %s is not supported yet: its decoder runs on the host tape, which has no adapters; train the full model instead", m.Arch.ModelType)
	}
	if m.Arch.FusedQKV || m.Arch.FusedGateUp {
		return fmt.Errorf("models: LoRA on %s is not supported: its qkv_proj / gate_up_proj are fused weights that run as separate parts here, and an adapter on a fused module would have to span its parts; train the full model instead", m.Arch.ModelType)
	}
	if !m.Arch.HeldExperts.All() && m.Arch.HeldExperts.Len() != m.Arch.NumExperts() {
		return errors.New("models: LoRA on a model holding a subset of the experts (expert parallelism) is not supported")
	}
	c.Targets = slices.Clone(c.Targets)
	ad := &Adapters{Config: c}
	used := make(map[string]bool)
	targets := c.Targets
	var re *regexp.Regexp
	if c.TargetPattern != "" {
		re, _ = targetPattern(c.TargetPattern)
		targets = []string{c.TargetPattern}
	}
	for _, l := range m.linearLayers() {
		for _, t := range targets {
			if re != nil && re.MatchString(l.Name) || re == nil && matchTarget(l.Name, t) {
				used[t] = true
				out, in := l.Shape()
				mod := LoRAModule{Name: l.Name, In: in, Out: out}
				ad.Modules = append(ad.Modules, mod)
				ad.Specs = append(ad.Specs,
					ParamSpec{Name: mod.AName(), Shape: []int{c.R, in}, Decay: true, Init: InitNormal, ZeroRow: -1},
					ParamSpec{Name: mod.BName(), Shape: []int{out, c.R}, Decay: true, Init: InitZeros, ZeroRow: -1})
				break
			}
		}
	}
	for _, t := range targets {
		if !used[t] {
			hint := ""
			if m.Arch.NumExperts() > 0 && (strings.HasSuffix(t, "gate_proj") || strings.HasSuffix(t, "up_proj") || strings.HasSuffix(t, "down_proj") || strings.HasSuffix(t, "gate")) {
				hint = "; the routed experts and the router of a mixture-of-experts layer are not supported as LoRA targets (their weights are fused grouped tensors, not linear layers): target the attention projections"
			}
			return fmt.Errorf("models: lora target module %q matches no linear layer of %s (targets: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear)%s", t, m.Arch.ModelType, hint)
		}
	}
	var err error
	if ad.Params, err = newArena(m.b, m.opts.DType, ad.Specs); err != nil {
		return err
	}
	m.lora = ad
	if err := m.InitLoRA(c.Seed); err != nil {
		m.DetachLoRA()
		return err
	}
	if m.Grads != nil {
		err = m.Grads.free(m.b)
		m.Grads = nil
	}
	m.build()
	return err
}

// LoRA returns the attached adapters (nil when none).
func (m *Model) LoRA() *Adapters { return m.lora }

// InitLoRA redraws the adapters as AttachLoRA does: A from U(-1/sqrt(in), 1/sqrt(in)) keyed by
// (seed, parameter index), B zero.
func (m *Model) InitLoRA(seed uint64) error {
	ad := m.lora
	if ad == nil {
		return errors.New("models: no adapters attached")
	}
	for i, s := range ad.Specs {
		vals := make([]float32, s.Numel())
		if s.Init == InitNormal {
			bound := 1 / math.Sqrt(float64(s.Shape[1]))
			rng := rand.New(rand.NewPCG(seed, uint64(i)+1))
			for j := range vals {
				vals[j] = float32((2*rng.Float64() - 1) * bound)
			}
		}
		if err := m.setView(ad.Params.Views[i], s.Name, vals); err != nil {
			return err
		}
	}
	return nil
}

// DetachLoRA frees the adapters; the base stays as it is (frozen until EnableGrads allocates
// its gradients again).
func (m *Model) DetachLoRA() {
	if m.lora == nil {
		return
	}
	_ = m.lora.Params.free(m.b)
	_ = m.lora.Grads.free(m.b)
	m.lora = nil
	m.build()
}

// MergeLoRA folds the adapters into the base weights (W += scale * B @ A, computed in the
// base dtype by the backend's GEMM with fp32 accumulation) and detaches them.
func (m *Model) MergeLoRA() error {
	ad := m.lora
	if ad == nil {
		return errors.New("models: no adapters to merge")
	}
	if m.quant != nil {
		return errors.New("models: merge: the base is quantised to 4 bits; merge the adapter into the original bf16 checkpoint (merge-lora --base that checkpoint)")
	}
	scale := float32(ad.Config.Scale())
	for i, mod := range ad.Modules {
		w, ok := m.Params.Get(mod.Name + ".weight")
		if !ok {
			return fmt.Errorf("models: merge: no base weight for %s", mod.Name)
		}
		a, b := ad.Params.Views[2*i], ad.Params.Views[2*i+1]
		if err := m.b.GEMM(backend.GEMMArgs{A: b, B: a, C: w, Alpha: scale, Beta: 1}); err != nil {
			return fmt.Errorf("models: merge %s: %w", mod.Name, err)
		}
	}
	m.DetachLoRA()
	return nil
}

// SetAdapterParam uploads values into an adapter parameter by name (AName/BName).
func (m *Model) SetAdapterParam(name string, values []float32) error {
	if m.lora == nil {
		return errors.New("models: no adapters attached")
	}
	t, ok := m.lora.Params.Get(name)
	if !ok {
		return fmt.Errorf("models: no adapter parameter %q", name)
	}
	return m.setView(t, name, values)
}

// AdapterFloat32 downloads an adapter parameter by name.
func (m *Model) AdapterFloat32(name string) ([]float32, error) {
	if m.lora == nil {
		return nil, errors.New("models: no adapters attached")
	}
	t, ok := m.lora.Params.Get(name)
	if !ok {
		return nil, fmt.Errorf("models: no adapter parameter %q", name)
	}
	return backend.ToFloat32(m.b, t)
}

// AdapterGradFloat32 downloads an adapter gradient by name.
func (m *Model) AdapterGradFloat32(name string) ([]float32, error) {
	if m.lora == nil || m.lora.Grads == nil {
		return nil, fmt.Errorf("models: adapter gradient %q: no adapter gradients yet", name)
	}
	t, ok := m.lora.Grads.Get(name)
	if !ok {
		return nil, fmt.Errorf("models: no adapter parameter %q", name)
	}
	return backend.ToFloat32(m.b, t)
}

func (m *Model) setView(t tensor.Tensor, name string, values []float32) error {
	if len(values) != t.Numel() {
		return fmt.Errorf("models: parameter %q has %d elements (shape %v), got %d values", name, t.Numel(), []int(t.Shape()), len(values))
	}
	raw, err := tensor.EncodeFloat32(t.DType(), values)
	if err != nil {
		return err
	}
	return m.b.Upload(t, raw)
}

// bindLoRA sets each adapted layer's adapter to its views (called by build).
func (m *Model) bindLoRA() {
	ad := m.lora
	if ad == nil {
		return
	}
	idx := make(map[string]int, len(ad.Modules))
	for i, mod := range ad.Modules {
		idx[mod.Name] = i
	}
	scale := float32(ad.Config.Scale())
	for _, l := range m.linearLayers() {
		i, ok := idx[l.Name]
		if !ok {
			continue
		}
		a := &nn.LoRA{A: ad.Params.Views[2*i], B: ad.Params.Views[2*i+1], Scale: scale,
			Dropout: float32(ad.Config.Dropout), Seed: ad.Config.Seed}
		if ad.Grads != nil {
			a.GA, a.GB = ad.Grads.Views[2*i], ad.Grads.Views[2*i+1]
		}
		l.Adapter = a
	}
}

// ModuleNorm is the Frobenius norms of one module's adapter.
type ModuleNorm struct {
	Module string
	// A and B are ||A||_F and ||B||_F; Delta is ||scale * B @ A||_F, the size of the update
	// the adapter adds to the base weight.
	A, B, Delta float64
}

// AdapterNorms returns every adapted module's norms, in layer order.
func (m *Model) AdapterNorms() ([]ModuleNorm, error) {
	ad := m.lora
	if ad == nil {
		return nil, errors.New("models: no adapters attached")
	}
	scale := ad.Config.Scale()
	out := make([]ModuleNorm, len(ad.Modules))
	for i, mod := range ad.Modules {
		a, err := backend.ToFloat32(m.b, ad.Params.Views[2*i])
		if err != nil {
			return nil, err
		}
		b, err := backend.ToFloat32(m.b, ad.Params.Views[2*i+1])
		if err != nil {
			return nil, err
		}
		r := ad.Config.R
		// ||B A||_F^2 = trace(A A^T B^T B) with the r x r Gram matrices.
		ga, gb := gram(a, r, mod.In, true), gram(b, mod.Out, r, false)
		d := 0.0
		for x := range r * r {
			d += ga[x] * gb[x]
		}
		out[i] = ModuleNorm{Module: mod.Name, A: frob(a), B: frob(b), Delta: scale * math.Sqrt(math.Max(d, 0))}
	}
	return out, nil
}

// gram returns the r x r matrix X X^T of X [r,cols] (rows true) or X^T X of X [rowsN,r].
func gram(x []float32, n, k int, rows bool) []float64 {
	var r int
	if rows {
		r = n
	} else {
		r = k
	}
	g := make([]float64, r*r)
	for i := range r {
		for j := range r {
			s := 0.0
			if rows {
				for c := range k {
					s += float64(x[i*k+c]) * float64(x[j*k+c])
				}
			} else {
				for c := range n {
					s += float64(x[c*k+i]) * float64(x[c*k+j])
				}
			}
			g[i*r+j] = s
		}
	}
	return g
}

func frob(x []float32) float64 {
	s := 0.0
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

// SetAdaptersEnabled turns the adapters on or off for every following pass (off: the base
// model alone, for comparing generations with and without the adapter).
func (m *Model) SetAdaptersEnabled(on bool) { m.adaptersOff = !on }

// AdaptersEnabled reports whether attached adapters take part in passes.
func (m *Model) AdaptersEnabled() bool { return m.lora != nil && !m.adaptersOff }

// TrainableGrads is the flat gradient buffer of what trains: the adapters' gradients when
// adapters are attached, else every parameter's (nil tensor before EnableGrads).
func (m *Model) TrainableGrads() tensor.Tensor {
	if m.lora != nil {
		if m.lora.Grads == nil {
			return tensor.Tensor{}
		}
		return m.lora.Grads.Flat
	}
	if m.Grads == nil {
		return tensor.Tensor{}
	}
	return m.Grads.Flat
}

// DropoutKey is the number of training forwards run so far, which selects the next
// micro-batch's adapter dropout masks; a checkpoint stores it so that a resumed run draws the
// masks the uninterrupted run would have.
func (m *Model) DropoutKey() uint64 { return m.dropoutKey }

// SetDropoutKey restores DropoutKey (resume).
func (m *Model) SetDropoutKey(k uint64) { m.dropoutKey = k }

// LoadAdapterWeights replaces the attached adapters' values with those saved in dir, keeping
// their arenas (so an optimizer built over them stays valid). The saved adapter_config.json
// must describe the same adapters (r, lora_alpha, use_rslora and the adapted modules).
func (m *Model) LoadAdapterWeights(dir string) error {
	if m.lora == nil {
		return errors.New("models: LoadAdapterWeights: no adapters attached")
	}
	c, _, err := ReadAdapterConfig(dir)
	if err != nil {
		return err
	}
	have := m.lora.Config
	if c.R != have.R || c.Alpha != have.Alpha || c.RSLoRA != have.RSLoRA {
		return fmt.Errorf("models: adapter %s has r=%d, lora_alpha=%v, use_rslora=%v; the attached adapters have r=%d, lora_alpha=%v, use_rslora=%v",
			dir, c.R, c.Alpha, c.RSLoRA, have.R, have.Alpha, have.RSLoRA)
	}
	path := filepath.Join(dir, AdapterWeightsFile)
	f, err := safetensors.Open(path)
	if err != nil {
		return fmt.Errorf("models: adapter %s: %w", dir, err)
	}
	defer f.Close()
	return m.loadAdapterTensors(f, path)
}

// LoRAParamCount is the number of adapter parameters c puts on a model of shape s, without
// building it (for memory estimates). Layers are taken in order with the dense ones first
// when only some are mixtures of experts, which changes nothing unless TargetPattern names
// layers by index.
func LoRAParamCount(s config.Shape, c LoRAConfig) (int64, error) {
	if err := c.Validate(); err != nil {
		return 0, err
	}
	var re *regexp.Regexp
	if c.TargetPattern != "" {
		re, _ = targetPattern(c.TargetPattern)
	}
	q, kv := s.QDim(), s.KVDim()
	dense := s.Layers - s.MoELayers
	if !s.MoE() {
		dense = s.Layers
	}
	var n int64
	for i := range s.Layers {
		mods := []struct {
			name    string
			out, in int
		}{{"self_attn.q_proj", q, s.Hidden}, {"self_attn.k_proj", kv, s.Hidden}, {"self_attn.v_proj", kv, s.Hidden}, {"self_attn.o_proj", s.Hidden, q}}
		if i < dense {
			mods = append(mods, struct {
				name    string
				out, in int
			}{"mlp.gate_proj", s.Intermediate, s.Hidden}, struct {
				name    string
				out, in int
			}{"mlp.up_proj", s.Intermediate, s.Hidden}, struct {
				name    string
				out, in int
			}{"mlp.down_proj", s.Hidden, s.Intermediate})
		}
		for _, md := range mods {
			name := layerName(i, md.name)
			hit := re != nil && re.MatchString(name)
			for _, t := range c.Targets {
				hit = hit || matchTarget(name, t)
			}
			if hit {
				n += int64(c.R) * int64(md.in+md.out)
			}
		}
	}
	return n, nil
}
