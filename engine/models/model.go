package models

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Options are the construction choices that are not part of config.json.
type Options struct {
	// DType of parameters, gradients and activations: F32 (default) or BF16.
	DType tensor.DType
	// Recompute turns on per-layer activation recomputation: each layer keeps only its input
	// during forward and re-runs its forward in backward. Gradients are identical; activation
	// memory drops to one [N,C] tensor per layer. Off by default.
	Recompute bool
	// ChunkRows is the number of tokens per cross-entropy chunk (0 = backend default).
	ChunkRows int
	// NumLabels > 0 builds a sequence classifier with that many labels (a score head in
	// place of the LM head; see Arch.NumLabels), whatever config.json's architectures say.
	// 0: a classifier when architectures names a *ForSequenceClassification class, with its
	// num_labels (or id2label), else a causal LM.
	NumLabels int
	// Experts is the range of routed experts the model holds in every mixture-of-experts
	// layer (the zero value: all of them). A model holding a subset allocates parameters and
	// gradients for those experts only, under their HF names; its MoE blocks still route over
	// every expert, so it computes only under an expert-parallel plan that sets their runners.
	// Dense models accept only the zero value.
	Experts ExpertRange

	// QuantizeOnLoad, with LoadIn4bit set, makes Load store the linear weights it selects in
	// NF4 as it reads them (what QuantizeBase would do after loading), so that the
	// full-precision copies of those layers never reach the device: loading a bf16 4B model for
	// QLoRA peaks at its NF4 size (about 2.6 GiB with the bf16 embedding) instead of 7.5 GiB
	// plus the NF4 copy. The values are rounded to DType first, so the codes equal
	// QuantizeBase's. A checkpoint that is already 4-bit (bitsandbytes) ignores it.
	QuantizeOnLoad *quant.Config

	// prequant, set by Load for a bitsandbytes 4-bit checkpoint, holds the NF4 weights read
	// from it: the arena is built without them.
	prequant *quantState
}

// ExpertRange is the half-open range [Lo, Hi) of global expert ids. The zero value means every
// expert.
type ExpertRange struct {
	Lo, Hi int
}

// All reports whether r is the zero value (every expert).
func (r ExpertRange) All() bool { return r == ExpertRange{} }

// Len is the number of experts in the range.
func (r ExpertRange) Len() int { return r.Hi - r.Lo }

// Contains reports whether expert x is in the range.
func (r ExpertRange) Contains(x int) bool { return x >= r.Lo && x < r.Hi }

func (r ExpertRange) String() string { return fmt.Sprintf("[%d,%d)", r.Lo, r.Hi) }

// Model is a decoder-only language model on one backend. It is driven by one goroutine at a
// time (the one that owns the backend).
type Model struct {
	// Family is the registered HF family.
	Family *Family
	// Arch is the resolved structure.
	Arch Arch
	// Specs is the parameter table; Params and Grads are laid out from it.
	Specs []ParamSpec
	// Params holds every parameter; Grads every gradient (nil until the first
	// ForwardBackward or EnableGrads).
	Params *Arena
	Grads  *Arena
	// Unused lists checkpoint tensors that Load found but the model does not use.
	Unused []string
	// Initialized lists parameters that loading drew at random because the checkpoint has
	// none (the score head of a classifier made from a causal LM).
	Initialized []string

	cfg    configSource
	opts   Options
	b      backend.Backend
	embed  nn.Embedding
	blocks []*nn.Block
	head   nn.Head
	score  nn.Linear // the score head of a sequence classifier (Arch.NumLabels > 0)
	// ple is the per-layer input embeddings stage (gemma4_text; nil: none).
	ple *perLayerInputs

	// RoPE tables: invFreq is uploaded once unless the rope type depends on the length
	// (dynamic), in which case rope tracks transformers' cached-length state.
	invFreq   tensor.Tensor
	attnScale float32
	// localInvFreq and localScale are the sliding layers' table (Arch.SlidingRope), computed
	// once; zero when the family has one rotary embedding.
	localInvFreq tensor.Tensor
	localScale   float32
	// ones is a vector of ones in the model dtype, the gain of norms without weights (Gemma
	// 4's v_norm); allocated by the first onesOf.
	ones       tensor.Tensor
	ropeCached int // dynamic rope: longest length the current table was built for
	ropeLen    int // dynamic rope: length invFreq was computed for

	moe moeState // mixture-of-experts layers, aux loss and balancing (empty when dense)
	// freshGrads are the gradients ZeroGrads may leave unfilled (fresh.go), freshRanges their
	// element ranges in Grads.Flat; fresh holds those not yet written this step.
	freshGrads  []tensor.Tensor
	freshRanges [][2]int
	fresh       *nn.FreshGrads
	// fullIndex[i] is the index of Specs[i] in the table of the model holding every expert
	// (nil when this model holds every expert).
	fullIndex []int

	// lora holds the attached adapters (nil: none); while set the base is frozen.
	lora *Adapters
	// quant holds the 4-bit base (QuantizeBase; nil: none).
	quant *quantState
	// dropoutKey numbers training forwards, selecting each micro-batch's dropout masks.
	dropoutKey uint64
	// adaptersOff runs passes without the adapters (SetAdaptersEnabled).
	adaptersOff bool
	// hostBufs are a host decoder's integer checkpoint tables (Family.Host), by name.
	hostBufs map[string][]int64
}

// newModel builds a model of family f with architecture a on b. Parameters are zero: load them
// or call InitRandom.
func newModel(f *Family, a Arch, cfg configSource, b backend.Backend, o Options) (*Model, error) {
	if b == nil {
		return nil, errors.New("models: nil backend")
	}
	if o.DType == tensor.Invalid {
		o.DType = tensor.F32
	}
	if o.DType != tensor.F32 && o.DType != tensor.BF16 {
		return nil, fmt.Errorf("models: dtype %s is not supported for parameters (use f32 or bf16)", o.DType)
	}
	a.InterleavedRoPE = f.InterleavedRoPE
	a.QKNormAfterRoPE, a.QKNormNames = f.QKNormAfterRoPE, f.QKNormNames
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if err := a.holdExperts(o.Experts); err != nil {
		return nil, err
	}
	if !f.Caps.SlidingWindow {
		for i, w := range a.Windows {
			if w > 0 {
				return nil, fmt.Errorf("models: %s does not support sliding-window attention (layer %d has window %d); remove sliding_window from config.json %s",
					f.ModelType, i, w, f.Caps.Reason)
			}
		}
	}
	if rt := a.Rope.Type; f.Caps.RopeTypes != nil && !slices.Contains(f.Caps.RopeTypes, rt) && !(rt == "" && slices.Contains(f.Caps.RopeTypes, "default")) {
		return nil, fmt.Errorf("models: %s does not support rope_type %q (supported: %s) %s", f.ModelType, rt, strings.Join(f.Caps.RopeTypes, ", "), f.Caps.Reason)
	}
	if a.Tied && !f.Caps.TiedEmbeddings {
		return nil, fmt.Errorf("models: %s does not support tie_word_embeddings=true %s", f.ModelType, f.Caps.Reason)
	}
	if o.NumLabels == 0 && cfg != nil {
		o.NumLabels = classifierLabels(cfg)
	}
	if o.NumLabels < 0 || o.NumLabels > 1<<16 {
		return nil, fmt.Errorf("models: num_labels %d must be in [1, 65536]", o.NumLabels)
	}
	if o.NumLabels > 0 {
		// A classifier has no LM head for the embedding to be tied to.
		a.NumLabels, a.Tied = o.NumLabels, false
	}
	if f.Host != nil {
		if err := f.Host.check(&a, b); err != nil {
			return nil, err
		}
		if o.prequant != nil {
			return nil, fmt.Errorf("models: %s: a 4-bit base is not supported by its host decoder", a.ModelType)
		}
	}
	m := &Model{Family: f, Arch: a, cfg: cfg, opts: o, b: b}
	m.Specs = specsFor(f, &m.Arch)
	if f.Host != nil {
		m.initHostBuffers()
	}
	if q := o.prequant; q != nil {
		if a.HeldExperts.Len() != a.NumExperts() {
			return nil, errors.New("models: a 4-bit checkpoint loads into a model holding every expert")
		}
		m.Specs = slices.DeleteFunc(m.Specs, func(s ParamSpec) bool { return q.weights[s.Name] != nil })
		m.quant, m.opts.prequant = q, nil
	}
	if a.HeldExperts.Len() != a.NumExperts() {
		// Random init draws each parameter from the stream of its index in the full table,
		// so a model holding a subset starts from the same values as the full model.
		full := m.Arch
		full.HeldExperts = ExpertRange{0, a.NumExperts()}
		idx := make(map[string]int)
		for i, s := range specsFor(f, &full) {
			idx[s.Name] = i
		}
		m.fullIndex = make([]int, len(m.Specs))
		for i, s := range m.Specs {
			m.fullIndex[i] = idx[s.Name]
		}
	}
	var err error
	if m.Params, err = newArena(b, o.DType, m.Specs); err != nil {
		return nil, err
	}
	m.build()
	if cfg != nil && cfg.OutputRouterLogits {
		m.moe.auxScale = cfg.RouterAuxLossCoef
	}
	m.ropeCached = a.Rope.MaxPositionEmbeddings
	if err := m.ropeFor(1); err != nil {
		m.Close()
		return nil, err
	}
	if a.SlidingRope != nil {
		if m.localInvFreq, m.localScale, err = uploadRope(b, *a.SlidingRope); err != nil {
			m.Close()
			return nil, fmt.Errorf("models: %s: sliding layers: %w", a.ModelType, err)
		}
	}
	return m, nil
}

// build creates the layers and binds them to the parameter (and gradient) views.
func (m *Model) build() {
	if m.Family.Host != nil {
		return // the decoder runs on the host tape (host.go); there are no device blocks
	}
	a := &m.Arch
	p := func(name string) tensor.Tensor { t, _ := m.Params.Get(name); return t }
	g := func(name string) tensor.Tensor {
		if m.Grads == nil {
			return tensor.Tensor{}
		}
		t, _ := m.Grads.Get(name)
		return t
	}
	lin := func(prefix string) nn.Linear {
		return nn.Linear{Name: prefix, W: p(prefix + ".weight"), B: p(prefix + ".bias"),
			GW: g(prefix + ".weight"), GB: g(prefix + ".bias")}
	}
	// part is rows [lo, hi) of a fused linear (qkv_proj, gate_up_proj): views of its weight,
	// bias and their gradients, so the parts share the fused parameter's memory.
	part := func(prefix, tag string, lo, hi int) nn.Linear {
		l := lin(prefix)
		l.Name = prefix + "[" + tag + "]"
		for _, t := range []*tensor.Tensor{&l.W, &l.B, &l.GW, &l.GB} {
			if !t.IsNil() {
				*t, _ = t.Rows(lo, hi)
			}
		}
		return l
	}
	norm := func(name string) nn.RMSNorm {
		n := nn.RMSNorm{Name: name, W: p(name + ".weight"), GW: g(name + ".weight"), Eps: a.NormEps, Offset: m.Family.NormOffset}
		if a.layerNorm() {
			n.Center, n.B, n.GB = true, p(name+".bias"), g(name+".bias")
		}
		if a.NormCenter {
			n.Center = true // cohere2_moe's LayerNorm without bias
		}
		return n
	}
	bind := &binder{lin: lin, norm: norm, param: p, grad: g, ones: m.onesOf}
	m.embed = nn.Embedding{Name: "model.embed_tokens", W: p(nameEmbed), GW: g(nameEmbed), Scale: a.EmbedScale}
	if m.Family.ScaleEmbeddings {
		m.embed.Scale = embedScale(a.Hidden, m.opts.DType)
	}
	m.blocks = make([]*nn.Block, a.Layers)
	qd, kvd, f := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim, a.Intermediate
	for i := range m.blocks {
		pre := fmt.Sprintf("model.layers.%d.", i)
		at := &nn.Attention{
			Name: pre + "self_attn",
			Q:    lin(pre + "self_attn.q_proj"), K: lin(pre + "self_attn.k_proj"),
			V: lin(pre + "self_attn.v_proj"), O: lin(pre + "self_attn.o_proj"),
			NH: a.Heads, NKV: a.KVHeads, HD: a.HeadDim, RotaryDim: a.Rope.RotaryDim(),
			Window: a.Windows[i], Layer: i,
			NoRoPE: a.NoRoPE != nil && a.NoRoPE[i], Interleaved: a.InterleavedRoPE, Scale: a.AttnScale,
			OutGate: a.AttnOutputGate,
		}
		if a.Sinks {
			at.Sinks, at.GSinks = p(pre+"self_attn.sinks"), g(pre+"self_attn.sinks")
		}
		if a.SlidingRope != nil && a.LocalRope[i] {
			at.LocalRope, at.RotaryDim = true, a.SlidingRope.RotaryDim()
		}
		if a.FusedQKV {
			qkv := pre + "self_attn.qkv_proj"
			at.Q, at.K, at.V = part(qkv, "q", 0, qd), part(qkv, "k", qd, qd+kvd), part(qkv, "v", qd+kvd, qd+2*kvd)
		}
		if a.QKNorm != config.NoQKNorm {
			qName, kName := a.qkNormNames()
			qn, kn := norm(pre+"self_attn."+qName), norm(pre+"self_attn."+kName)
			at.QNorm, at.KNorm = &qn, &kn
			at.NormAfterRoPE = a.QKNormAfterRoPE
		}
		if a.HeadGate {
			g := lin(pre + "self_attn.g_proj")
			at.HeadGate = &g
		}
		if a.Latent.KVRank > 0 {
			at = &nn.Attention{Name: pre + "self_attn", Layer: i, Latent: latentAttention(a, i, lin, norm)}
		}
		if a.IsLinear(i) {
			at = &nn.Attention{Name: pre + "linear_attn", Layer: i, Linear: linearAttention(m.Family, a, i, lin, p, g)}
		}
		if m.Family.Mixer != nil {
			if mx := m.Family.Mixer.Build(a, i, bind); mx != nil {
				at = mx
			}
		}
		var ffn nn.FFN
		if m.Family.FFN != nil {
			ffn = m.Family.FFN.Build(a, i, p, g)
		}
		if ffn == nil {
			mlp := &nn.MLP{Name: pre + "mlp", Gate: lin(pre + "mlp.gate_proj"),
				Up: lin(pre + "mlp.up_proj"), Down: lin(pre + "mlp.down_proj"), Act: a.Act}
			if a.FusedGateUp {
				gu := pre + "mlp.gate_up_proj"
				mlp.Gate, mlp.Up = part(gu, "gate", 0, f), part(gu, "up", f, 2*f)
			}
			ffn = mlp
		}
		preAttn, preFFN, postAttn, postFFN := m.Family.normRoles(a.Norms)
		blk := &nn.Block{
			Name:          pre[:len(pre)-1],
			Attn:          at,
			FFN:           ffn,
			Recompute:     m.opts.Recompute,
			NoPreNorms:    preAttn == "",
			ResidualScale: a.ResidualScale,
			Parallel:      a.Norms == config.ParallelNorm,
		}
		if preAttn != "" {
			blk.Norm1 = m.Family.layerNorm(norm(pre + preAttn))
		}
		if preFFN != "" {
			blk.Norm2 = m.Family.layerNorm(norm(pre + preFFN))
		}
		if postAttn != "" {
			pa, pf := norm(pre+postAttn), norm(pre+postFFN)
			blk.PostAttnNorm, blk.PostFFNNorm = &pa, &pf
		}
		if m.Family.LayerScalar {
			blk.OutScale = p(pre + layerScalarName)
		}
		m.blocks[i] = blk
	}
	if m.Family.Extend != nil {
		m.Family.Extend(m, bind)
	}
	m.bindMoE()
	m.bindLoRA()
	m.bindQuant()
	m.head = nn.Head{Name: "lm_head", Norm: norm(m.Family.finalNorm()), ChunkRows: m.opts.ChunkRows, LogitScale: a.LogitScale, Softcap: a.LogitSoftcap}
	switch {
	case a.NumLabels > 0:
		m.score = nn.Linear{Name: "score", W: p(nameScore), GW: g(nameScore)}
	case a.Tied:
		m.head.W, m.head.GW = p(nameEmbed), g(nameEmbed)
	default:
		m.head.W, m.head.GW = p(nameLMHead), g(nameLMHead)
	}
	if a.lmHeadBias() {
		m.head.B, m.head.GB = p(nameLMHeadBias), g(nameLMHeadBias)
	}
	m.collectFresh()
}

// HeldExperts is the range of routed experts the model holds in each MoE layer (every
// expert: [0, E); the zero range for dense models).
func (m *Model) HeldExperts() ExpertRange { return m.Arch.HeldExperts }

// Backend returns the backend the model lives on.
func (m *Model) Backend() backend.Backend { return m.b }

// DType returns the parameter and activation dtype.
func (m *Model) DType() tensor.DType { return m.opts.DType }

// NumParams is the number of trainable parameters this instance holds (tied embeddings counted
// once; of a model holding a subset of the experts, only those experts).
func (m *Model) NumParams() int {
	n := 0
	for _, s := range m.Specs {
		n += s.Numel()
	}
	if m.quant != nil {
		n += m.quant.params
	}
	return n
}

// SetRecompute turns per-layer activation recomputation on or off (between steps).
func (m *Model) SetRecompute(on bool) {
	m.opts.Recompute = on
	for _, b := range m.blocks {
		b.Recompute = on
	}
}

// EnableGrads allocates the gradient arena (zeroed) if it does not exist yet. With adapters
// attached it allocates the adapter gradients only: the base is frozen and Grads stays nil.
func (m *Model) EnableGrads() error {
	if ad := m.lora; ad != nil {
		if ad.Grads != nil {
			return nil
		}
		g, err := newArena(m.b, m.opts.DType, ad.Specs)
		if err != nil {
			return err
		}
		ad.Grads = g
		m.build()
		return nil
	}
	if m.Grads != nil {
		return nil
	}
	if m.quant != nil {
		return errors.New("models: the base is stored in 4 bits and cannot be trained: attach LoRA adapters (use_peft) and train those")
	}
	g, err := newArena(m.b, m.opts.DType, m.Specs)
	if err != nil {
		return err
	}
	m.Grads = g
	m.build()
	return nil
}

// ZeroGrads sets every gradient to zero (call at the start of each optimizer step).
func (m *Model) ZeroGrads() error {
	if ad := m.lora; ad != nil {
		if ad.Grads == nil {
			return m.EnableGrads()
		}
		return m.b.Fill(ad.Grads.Flat, 0)
	}
	if m.Grads == nil {
		return m.EnableGrads()
	}
	if len(m.freshGrads) > 0 && swGradZero.Is("lazy") {
		return m.zeroGradsLazily()
	}
	m.fresh = nil // the fill zeroes every gradient: none is left to its first write
	return m.b.Fill(m.Grads.Flat, 0)
}

// Close frees the parameter and gradient arenas and the RoPE table.
func (m *Model) Close() error {
	var errs []error
	errs = append(errs, m.Params.free(m.b), m.Grads.free(m.b), m.freeQuant())
	if m.lora != nil {
		errs = append(errs, m.lora.Params.free(m.b), m.lora.Grads.free(m.b))
		m.lora = nil
	}
	if !m.invFreq.IsNil() {
		errs = append(errs, m.b.Free(m.invFreq))
		m.invFreq = tensor.Tensor{}
	}
	if !m.localInvFreq.IsNil() {
		errs = append(errs, m.b.Free(m.localInvFreq))
		m.localInvFreq = tensor.Tensor{}
	}
	if !m.ones.IsNil() {
		errs = append(errs, m.b.Free(m.ones))
		m.ones = tensor.Tensor{}
	}
	return errors.Join(errs...)
}

// ParamFloat32 downloads a parameter by HF name (lm_head.weight resolves to the embedding when
// tied).
func (m *Model) ParamFloat32(name string) ([]float32, error) {
	t, ok := m.param(name)
	if !ok {
		return nil, fmt.Errorf("models: no parameter %q", name)
	}
	return backend.ToFloat32(m.b, t)
}

// GradFloat32 downloads a gradient by HF name.
func (m *Model) GradFloat32(name string) ([]float32, error) {
	if m.Grads == nil {
		return nil, fmt.Errorf("models: gradient %q: no gradients yet (run ForwardBackward first)", name)
	}
	t, ok := m.Grads.Get(name)
	if !ok {
		return nil, fmt.Errorf("models: no parameter %q", name)
	}
	return backend.ToFloat32(m.b, t)
}

// SetParam uploads values (converted to the parameter dtype) into a parameter by HF name.
func (m *Model) SetParam(name string, values []float32) error {
	t, ok := m.param(name)
	if !ok {
		return fmt.Errorf("models: no parameter %q", name)
	}
	if len(values) != t.Numel() {
		return fmt.Errorf("models: parameter %q has %d elements (shape %v), got %d values", name, t.Numel(), []int(t.Shape()), len(values))
	}
	raw, err := tensor.EncodeFloat32(t.DType(), values)
	if err != nil {
		return err
	}
	return m.b.Upload(t, raw)
}

func (m *Model) param(name string) (tensor.Tensor, bool) {
	if name == nameLMHead && m.Arch.Tied {
		name = nameEmbed
	}
	return m.Params.Get(name)
}

// ropeFor makes invFreq valid for a micro-batch whose longest position is seqLen-1. For
// length-independent rope types it is computed once. For dynamic NTK scaling it follows
// transformers' stateful rule exactly: the table grows (is recomputed for seqLen) when seqLen
// exceeds the longest length seen so far, and resets to the original table when seqLen drops
// below max_position_embeddings after having grown.
func (m *Model) ropeFor(seqLen int) error {
	r := m.Arch.Rope
	want := m.ropeLen
	if m.invFreq.IsNil() {
		want = r.MaxPositionEmbeddings
	}
	switch {
	case r.Type == "longrope":
		// transformers' longrope update: the long factors once the batch is longer than the
		// original context, the short ones otherwise.
		want = 0
		if r.LongRoPE(seqLen) {
			want = r.OriginalMaxPositionEmbeddings + 1
		}
	case r.DependsOnLength():
		orig := r.MaxPositionEmbeddings
		if seqLen > m.ropeCached {
			want, m.ropeCached = seqLen, seqLen
		}
		if seqLen < orig && m.ropeCached > orig {
			want, m.ropeCached = orig, orig
		}
	}
	if !m.invFreq.IsNil() && want == m.ropeLen {
		return nil
	}
	inv, scale, err := r.Compute(want)
	if err != nil {
		return fmt.Errorf("models: %s: %w", m.Arch.ModelType, err)
	}
	if m.invFreq.IsNil() {
		if m.invFreq, err = m.b.Alloc(tensor.F32, len(inv)); err != nil {
			return err
		}
	}
	raw, err := tensor.EncodeFloat32(tensor.F32, inv)
	if err != nil {
		return err
	}
	if err := m.b.Upload(m.invFreq, raw); err != nil {
		return err
	}
	m.attnScale, m.ropeLen = scale, want
	return nil
}

// uploadRope computes a length-independent rotary table and uploads it.
func uploadRope(b backend.Backend, r backend.RoPEConfig) (tensor.Tensor, float32, error) {
	inv, scale, err := r.Compute(r.MaxPositionEmbeddings)
	if err != nil {
		return tensor.Tensor{}, 0, err
	}
	t, err := b.Alloc(tensor.F32, len(inv))
	if err != nil {
		return tensor.Tensor{}, 0, err
	}
	raw, err := tensor.EncodeFloat32(tensor.F32, inv)
	if err == nil {
		err = b.Upload(t, raw)
	}
	if err != nil {
		_ = b.Free(t)
		return tensor.Tensor{}, 0, err
	}
	return t, scale, nil
}

// embedScale is Gemma's embedding multiplier sqrt(hidden), in the parameter dtype as
// transformers holds it (the float32 value rounded to bf16 for a bf16 model).
func embedScale(hidden int, dt tensor.DType) float32 {
	s := float32(math.Sqrt(float64(hidden)))
	if dt == tensor.BF16 {
		s = tensor.BF16ToF32(tensor.F32ToBF16(s))
	}
	return s
}

// onesMax bounds the ones vector: the widest head a norm without weights normalises.
const onesMax = 1 << 12

// onesOf returns a view of n ones in the model dtype (the zero tensor when n is out of range or
// the allocation fails, which the norm using it then reports).
func (m *Model) onesOf(n int) tensor.Tensor {
	if n <= 0 || n > onesMax {
		return tensor.Tensor{}
	}
	if m.ones.IsNil() {
		vals := make([]float32, onesMax)
		for i := range vals {
			vals[i] = 1
		}
		t, err := backend.FromFloat32(m.b, vals, m.opts.DType, onesMax)
		if err != nil {
			return tensor.Tensor{}
		}
		m.ones = t
	}
	v, err := m.ones.Rows(0, n)
	if err != nil {
		return tensor.Tensor{}
	}
	return v
}
