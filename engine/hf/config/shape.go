package config

import "slices"

// Shape is the structure of the model a config describes, resolved by its family's rules: the
// sizes, which optional weights exist (biases, q/k norms, a separate LM head) and where the
// mixture-of-experts layers are. It is the one description of a model's structure: engine/models
// builds its parameter table from it (models.Arch embeds it) and engine/mesh checks parallel
// layouts and estimates memory against it (mesh.ModelShape is this type).
//
// Config.Shape derives it; the family files of this package hold the rules (QKVBias, OProjBias,
// QKNorm, MoELayer).
type Shape struct {
	// ModelType is the family (config.json's model_type).
	ModelType string
	Vocab     int // V, rows of the embedding
	Hidden    int // C, the model width
	// Intermediate is the dense SwiGLU MLP width (of the dense layers of MoE models).
	Intermediate int
	Layers       int // L
	Heads        int // NH, query heads
	KVHeads      int // NKV, key/value heads
	HeadDim      int // HD
	// Tied: lm_head shares model.embed_tokens.weight (and is absent from the checkpoint).
	Tied bool
	// NormBias: every norm is a LayerNorm with a bias [C] beside its weight (phimoe);
	// HeadBias: lm_head has a bias [V] (lm_head_bias).
	NormBias, HeadBias bool
	// NormCenter: every norm subtracts its row's mean before the RMS normalisation, a
	// LayerNorm without bias (cohere2_moe); implied by NormBias.
	NormCenter bool
	// QKVBias: q/k/v projections carry biases; OBias: o_proj does; MLPBias: the dense MLP
	// projections do.
	QKVBias, OBias, MLPBias bool
	// QKNorm is the RMSNorm of queries and keys before RoPE (none, per head, or over the whole
	// projection).
	QKNorm QKNorm
	// Experts is the number of routed experts per MoE layer (0 when no layer is MoE),
	// ExpertIntermediate each expert's SwiGLU width and TopK the experts each token uses.
	Experts, ExpertIntermediate, TopK int
	// MoELayers is the number of mixture-of-experts layers (the family's MoELayer rule).
	MoELayers int
	// Norms is the arrangement of each layer's RMSNorms (PreNorms for Llama).
	Norms LayerNorms
	// FusedQKV: q, k and v are one qkv_proj weight [QDim+2·KVDim, C]; FusedGateUp: the dense
	// MLP's gate and up are one gate_up_proj weight [2·Intermediate, C].
	FusedQKV, FusedGateUp bool
	// SharedExpert is the width of the shared-expert SwiGLU MLP of every MoE layer (0: none);
	// SharedExpertGate: a sigmoid gate [1, C] scales its output (qwen2_moe).
	SharedExpert     int
	SharedExpertGate bool
	// RouterBias: each MoE layer's router has DeepSeek's selection-only correction bias [E]
	// (the families with n_group), a checkpoint buffer that NumParameters does not count.
	RouterBias bool
	// RouterBiasParam: that bias is a parameter transformers counts (ERNIE 4.5's
	// moe_statics.e_score_correction_bias [1, E]), not a buffer.
	RouterBiasParam bool
	// HeadGate: each attention layer has g_proj [Heads, C], whose softplus scales each head's
	// output (laguna).
	HeadGate bool
	// Sinks: each attention layer has a learned sink logit per query head (gpt_oss);
	// ExpertBias: the router and the routed experts' projections carry biases (gpt_oss).
	Sinks, ExpertBias bool
	// MoA: the attention is JetMoE's mixture of attention heads (Family.MoA).
	MoA bool
	// Latent is the multi-head latent attention of deepseek_v3 and glm4_moe_lite (zero for
	// the other families); HeadDim is then its rotary width.
	Latent LatentShape
	// AttnOutputGate: q_proj projects each head's queries and then its output gate (2·QDim
	// rows), and sigmoid(gate) scales the attention output (qwen3_next, qwen3_5_moe_text).
	AttnOutputGate bool
	// Linear is the gated delta-net attention of the linear-attention layers (zero when no
	// layer is one).
	Linear LinearShape
	// Global is the full-attention layers' own geometry (gemma4_text; zero for the other
	// families).
	Global GlobalShape
	// Conv is the short convolution of lfm2_moe's conv layers (zero for the other families).
	Conv ConvShape
	// V4 is deepseek_v4's structure (zero for the other families).
	V4 V4Shape
}

// V4Shape is deepseek_v4's structure: low-rank queries (QRank), one shared key/value head of
// HeadDim, a grouped output projection (OGroups groups to ORank), HC residual streams mixed by
// hyper-connections, each layer's attention kind (LayerTypes) with its compression rate
// (Rates, 0 for sliding layers), the lightning indexer of compressed sparse layers
// (IndexHeads of IndexDim) and the hash-routed layers (Hash).
type V4Shape struct {
	QRank, OGroups, ORank, HC int
	LayerTypes                []string
	Rates                     []int
	IndexHeads, IndexDim      int
	Hash                      []bool
}

// attention counts layer i's attention parameters, its compressor and indexer included, for
// model width h, heads and head width hd.
func (v V4Shape) attention(i int, h, heads, hd int64) int64 {
	q, r := int64(v.QRank), int64(v.ORank*v.OGroups)
	n := heads + h*q + q + q*heads*hd + h*hd + hd + r*(heads*hd/int64(v.OGroups)) + h*r
	m := int64(v.Rates[i])
	switch v.LayerTypes[i] {
	case DSV4HCA:
		n += 2*h*hd + m*hd + hd
	case DSV4CSA:
		di, hi := int64(v.IndexDim), int64(v.IndexHeads)
		n += 4*h*hd + m*2*hd + hd
		n += 4*h*di + m*2*di + di + q*hi*di + h*hi
	}
	return n
}

// LinearShape is the structure of the gated delta-net layers of a model.
type LinearShape struct {
	// Layers is the number of linear-attention layers.
	Layers int
	// KeyHeads query/key heads of KeyDim serve ValueHeads value heads of ValueDim.
	KeyHeads, ValueHeads, KeyDim, ValueDim int
	// Conv is the causal convolution's kernel size.
	Conv int
}

// ConvDim is the number of channels of the causal convolution: queries, keys and values.
func (l LinearShape) ConvDim() int { return 2*l.KeyHeads*l.KeyDim + l.ValueHeads*l.ValueDim }

// Parameters is one linear-attention layer's parameter count for model width h: the
// convolution, the q/k/v/z and beta/alpha projections, dt_bias and A_log, the gated norm and
// out_proj.
func (l LinearShape) Parameters(h int64) int64 {
	vd := int64(l.ValueHeads * l.ValueDim)
	conv := int64(l.ConvDim())
	return conv*int64(l.Conv) + h*(conv+vd) + h*2*int64(l.ValueHeads) + 2*int64(l.ValueHeads) +
		int64(l.ValueDim) + vd*h
}

// GlobalShape is gemma4_text's full-attention geometry: Full[i] marks layer i as a full
// layer, whose heads are HeadDim wide over KVHeads key/value heads; with KEqV those layers
// have no v_proj (their values are the k_proj output). Each layer also holds a layer_scalar
// buffer [1], which NumParameters does not count (transformers counts parameters only).
//
// Gemma 4's optional parts are here too: PerLayerInput is hidden_size_per_layer_input (P; 0
// for none) and PerLayerVocab vocab_size_per_layer_input (the per-layer input embeddings
// [PerLayerVocab, L·P], their projection [L·P, C] and norm [P], and per layer a gate [P, C], a
// projection [C, P] and a norm [C]); SharedFrom[i] is the layer whose keys and values layer i
// attends over (-1: its own; a sharing layer has no k_proj, v_proj or k_norm), WideMLP[i] marks
// a layer whose MLP is 2·Intermediate wide (use_double_wide_mlp on the sharing layers); the
// MoE block beside every layer's MLP has BesideExperts GeGLU experts of BesideWidth, TopK
// BesideTopK (0: no block).
type GlobalShape struct {
	Full             []bool
	HeadDim, KVHeads int
	KEqV             bool

	PerLayerInput, PerLayerVocab           int
	SharedFrom                             []int
	WideMLP                                []bool
	BesideExperts, BesideWidth, BesideTopK int
}

// Shared reports whether layer i attends over an earlier layer's keys and values.
func (g GlobalShape) Shared(i int) bool { return i < len(g.SharedFrom) && g.SharedFrom[i] >= 0 }

// ConvShape is lfm2_moe's short convolution: Layers[i] marks layer i as a conv layer (in_proj
// [3C, C], conv.weight [C, 1, Taps], out_proj [C, C], each with a bias when Bias) in place of
// attention.
type ConvShape struct {
	Layers []bool
	Taps   int
	Bias   bool
}

// LayerHeads returns layer i's query/key head width and key/value heads: Global's on
// gemma4_text's full layers, HeadDim and KVHeads elsewhere.
func (s Shape) LayerHeads(i int) (headDim, kvHeads int) {
	if i >= 0 && i < len(s.Global.Full) && s.Global.Full[i] {
		return s.Global.HeadDim, s.Global.KVHeads
	}
	return s.HeadDim, s.KVHeads
}

// IsConv reports whether layer i is a short-convolution layer (lfm2_moe).
func (s Shape) IsConv(i int) bool { return i >= 0 && i < len(s.Conv.Layers) && s.Conv.Layers[i] }

// AttentionDims are the widths of a query/key head and of a value head (HeadDim for both but
// under latent attention), for counting attention FLOPs.
func (s Shape) AttentionDims() (qk, v int) {
	if s.Latent.KVRank > 0 {
		return s.Latent.QKHead(), s.Latent.V
	}
	return s.HeadDim, s.HeadDim
}

// Shape resolves the model structure c describes. A config that was edited in code without
// Validate still gets a usable shape: a zero head_dim means hidden_size / num_attention_heads
// and zero key/value heads mean num_attention_heads, as Validate would derive them.
func (c *Config) Shape() Shape {
	s := Shape{
		ModelType: c.ModelType, Vocab: c.VocabSize, Hidden: c.HiddenSize,
		Intermediate: c.IntermediateSize, Layers: c.NumHiddenLayers,
		Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim,
		Tied: c.TieWordEmbeddings, QKVBias: c.QKVBias(), OBias: c.OProjBias(), MLPBias: c.MLPBias,
		QKNorm: c.QKNormKind(), HeadBias: c.LMHeadBias,
	}
	if f := c.Family(); f != nil {
		s.Sinks, s.ExpertBias, s.MoA = f.Sinks, f.ExpertBias, f.MoA
		s.Norms, s.FusedQKV, s.FusedGateUp = f.Norms, f.FusedQKV, f.FusedGateUp
		if f.SharedExpert != nil {
			s.SharedExpert, s.SharedExpertGate = f.SharedExpert(c)
		}
		s.AttnOutputGate = f.AttnOutputGate
		s.HeadGate = f.HeadGate
		s.NormBias = f.LayerNorm
		s.NormCenter = f.LayerNorm || (f.CenterNorm != nil && f.CenterNorm(c))
		if f.DenseIntermediate != nil {
			s.Intermediate = f.DenseIntermediate(c)
		}
	}
	for i := 0; i < c.NumHiddenLayers; i++ {
		if c.IsLinearLayer(i) {
			s.Linear.Layers++
		}
	}
	if s.Linear.Layers > 0 {
		s.Linear.KeyHeads, s.Linear.ValueHeads = c.LinearNumKeyHeads, c.LinearNumValueHeads
		s.Linear.KeyDim, s.Linear.ValueDim, s.Linear.Conv = c.LinearKeyHeadDim, c.LinearValueHeadDim, c.LinearConvKernelDim
	}
	if c.IsLatent() {
		// Latent attention has one key and value per query head; head_dim is its rotary width.
		s.Latent = LatentShape{QRank: c.QLoRARank, KVRank: c.KVLoRARank, Nope: c.QKNopeHeadDim, Rope: c.QKRopeHeadDim, V: c.VHeadDim}
		s.KVHeads, s.HeadDim = s.Heads, c.QKRopeHeadDim
	}
	if s.KVHeads == 0 {
		s.KVHeads = s.Heads
	}
	if c.ModelType == "gemma4_text" {
		s.Global = GlobalShape{Full: make([]bool, c.NumHiddenLayers), HeadDim: c.GlobalHead(),
			KVHeads: c.GlobalKVHeads(), KEqV: c.AttentionKEqV}
		for i := range s.Global.Full {
			s.Global.Full[i] = i < len(c.LayerTypes) && c.LayerTypes[i] == FullAttention
		}
		gemma4Parts(c, &s.Global)
	}
	if c.ModelType == "lfm2_moe" {
		s.Conv = ConvShape{Layers: make([]bool, c.NumHiddenLayers), Taps: c.ConvLCache, Bias: c.ConvBias}
		for i := range s.Conv.Layers {
			s.Conv.Layers[i] = c.IsConvLayer(i)
		}
	}
	if c.ModelType == "deepseek_v4" {
		s.V4 = V4Shape{QRank: c.QLoRARank, OGroups: c.OGroups, ORank: c.OLoRARank, HC: c.HCMult,
			LayerTypes: slices.Clone(c.LayerTypes), Rates: make([]int, len(c.LayerTypes)),
			IndexHeads: c.IndexNHeads, IndexDim: c.IndexHeadDim, Hash: make([]bool, len(c.MLPLayerTypes))}
		for i, t := range c.LayerTypes {
			s.V4.Rates[i] = c.CompressRates[t]
		}
		for i, t := range c.MLPLayerTypes {
			s.V4.Hash[i] = t == DSV4HashMoE
		}
	}
	if s.HeadDim == 0 && s.Heads > 0 {
		s.HeadDim = s.Hidden / s.Heads
	}
	for i := 0; i < c.NumHiddenLayers; i++ {
		if c.IsMoELayer(i) {
			s.MoELayers++
		}
	}
	if s.MoELayers > 0 {
		s.Experts, s.ExpertIntermediate, s.TopK = c.NumExperts, c.ExpertIntermediateSize(), c.NumExpertsPerTok
		s.RouterBias = c.NGroup > 0
		if f := c.Family(); f != nil && f.RouterBiasParam {
			s.RouterBias, s.RouterBiasParam = true, true
		}
		if f := c.Family(); f != nil && f.RouterBias != nil {
			s.RouterBias = f.RouterBias(c)
		}
	}
	return s
}

// MoE reports whether the model has mixture-of-experts layers.
func (s Shape) MoE() bool { return s.Experts > 0 && s.MoELayers > 0 }

// QDim is the q_proj output width, Heads·HeadDim.
func (s Shape) QDim() int { return s.Heads * s.HeadDim }

// KVDim is the k_proj and v_proj output width, KVHeads·HeadDim.
func (s Shape) KVDim() int { return s.KVHeads * s.HeadDim }

// NumParameters is the number of parameters, counted as transformers counts
// model.parameters() (a tied LM head once): embeddings, attention projections with their
// biases, q/k norms, dense MLPs or routed experts with their routers, RMSNorm weights and the
// LM head.
func (s Shape) NumParameters() int64 { return s.countParameters(false) }

// ActiveParameters is the number of parameters one token passes through: NumParameters with
// only TopK of each MoE layer's experts counted. Used for model FLOPs (6·N·tokens).
func (s Shape) ActiveParameters() int64 { return s.countParameters(true) }

func (s Shape) countParameters(active bool) int64 {
	if s.V4.HC > 0 {
		return s.v4Parameters(active)
	}
	h, v := int64(s.Hidden), int64(s.Vocab)
	q, kv := int64(s.QDim()), int64(s.KVDim())
	n := v * h // embed_tokens
	if !s.Tied {
		n += v * h // lm_head
	}
	n += h           // final norm
	norm := int64(1) // parameter vectors per norm
	if s.NormBias {
		n += h
		norm = 2
	}
	if s.HeadBias {
		n += v
	}

	attn := h*q + 2*h*kv + q*h
	if s.QKVBias {
		attn += q + 2*kv
	}
	if s.AttnOutputGate {
		attn += h * q // the gate rows of q_proj
		if s.QKVBias {
			attn += q
		}
	}
	if s.OBias {
		attn += h
	}
	if s.HeadGate {
		attn += int64(s.Heads) * h // g_proj
	}
	if s.Latent.KVRank > 0 {
		attn = s.Latent.Parameters(h, int64(s.Heads), s.QKVBias, s.OBias)
	}
	if s.Sinks {
		attn += int64(s.Heads)
	}
	if s.MoA {
		// The router, each expert's query and output projections (for the key/value heads;
		// top-k of them with active), the output bias and kv_proj.
		e, kvw := int64(s.Experts), int64(s.KVHeads*s.HeadDim)
		used := e
		if active {
			used = int64(s.TopK)
		}
		attn = e*h + used*2*kvw*h + h + 2*kvw*h
	}
	switch s.QKNorm {
	case QKNormPerHead:
		attn += 2 * int64(s.HeadDim)
	case QKNormProjection:
		attn += q + kv
	}
	mlp := func(inter int64, bias bool) int64 {
		p := 3 * h * inter
		if bias {
			p += 2*inter + h
		}
		return p
	}
	layers, moe := int64(s.Layers), int64(s.MoELayers)
	lin := int64(s.Linear.Layers)
	n += (layers-lin)*attn + lin*s.Linear.Parameters(h)
	n += layers * int64(s.Norms.PerLayer()) * norm * h // the layers' norms
	if s.Global.Full != nil || s.Conv.Layers != nil {
		// Layers of two kinds: count each layer's mixer by its own geometry.
		n -= layers * attn
		for i := 0; i < s.Layers; i++ {
			n += s.layerMixer(i)
		}
	}
	n += (layers - moe) * mlp(int64(s.Intermediate), s.MLPBias)
	n += s.Global.parameters(s, active)
	if moe > 0 {
		experts := int64(s.Experts)
		if active {
			experts = int64(s.TopK)
		}
		n += moe * (h*int64(s.Experts) + experts*mlp(int64(s.ExpertIntermediate), s.ExpertBias))
		if s.ExpertBias || s.RouterBiasParam {
			n += moe * int64(s.Experts) // the router's bias
		}
		if s.MoA {
			n += moe * h // the block's output bias
		}
		if s.SharedExpert > 0 {
			n += moe * mlp(int64(s.SharedExpert), false)
			if s.SharedExpertGate {
				n += moe * h
			}
		}
	}
	return n
}

// v4Parameters counts deepseek_v4's parameters: embeddings, LM head and final norm, the final
// hyper-connection head, and per layer its attention (V4Shape.attention), two RMSNorms, two
// hyper-connections, the router, the routed experts and the shared expert with its biases
// under mlp_bias (the correction bias and the token table are buffers).
func (s Shape) v4Parameters(active bool) int64 {
	h, v, hc := int64(s.Hidden), int64(s.Vocab), int64(s.V4.HC)
	n := v * h
	if !s.Tied {
		n += v * h
	}
	n += h + hc*hc*h + hc + 1 // final norm, hc_head
	experts := int64(s.Experts)
	if active {
		experts = int64(s.TopK)
	}
	mix := (2 + hc) * hc
	for i := 0; i < s.Layers; i++ {
		n += s.V4.attention(i, h, int64(s.Heads), int64(s.HeadDim))
		n += 2*h + 2*(mix*hc*h+mix+3)
		n += h*int64(s.Experts) + experts*3*h*int64(s.ExpertIntermediate) + 3*h*int64(s.SharedExpert)
		if s.MLPBias {
			n += 2*int64(s.SharedExpert) + h // the shared expert's biases
		}
	}
	return n
}

// layerMixer counts layer i's attention (or short convolution) parameters for the families
// whose layers differ (gemma4_text, lfm2_moe).
func (s Shape) layerMixer(i int) int64 {
	h := int64(s.Hidden)
	if s.IsConv(i) {
		n := 3*h*h + h*int64(s.Conv.Taps) + h*h
		if s.Conv.Bias {
			n += 3*h + h + h
		}
		return n
	}
	hd, kvh := s.LayerHeads(i)
	q, kv := int64(s.Heads*hd), int64(kvh*hd)
	if s.Global.Shared(i) {
		n := h*q + q*h + int64(hd) // q, o, q_norm
		if s.QKVBias {
			n += q
		}
		if s.OBias {
			n += h
		}
		return n
	}
	n := h*q + h*kv + q*h // q, k, o
	if s.QKVBias {
		n += q + kv
	}
	if !(s.Global.KEqV && s.Global.Full != nil && s.Global.Full[i]) {
		n += h * kv // v_proj
		if s.QKVBias {
			n += kv
		}
	}
	if s.OBias {
		n += h
	}
	if s.QKNorm == QKNormPerHead {
		n += 2 * int64(hd)
	}
	return n
}

// gemma4Parts fills g with the optional parts c turns on (GlobalShape).
func gemma4Parts(c *Config, g *GlobalShape) {
	l := c.NumHiddenLayers
	if c.HiddenSizePerLayerInput > 0 {
		g.PerLayerInput, g.PerLayerVocab = c.HiddenSizePerLayerInput, c.VocabSizePerLayerInput
	}
	if c.EnableMoEBlock {
		g.BesideExperts, g.BesideWidth, g.BesideTopK = c.NumExperts, c.MoEIntermediateSize, c.TopKExperts
	}
	if c.NumKVSharedLayers <= 0 {
		return
	}
	g.SharedFrom, g.WideMLP = make([]int, l), make([]bool, l)
	first := l - c.NumKVSharedLayers
	for i := range g.SharedFrom {
		g.SharedFrom[i] = -1
		if i < first || len(c.LayerTypes) != l {
			continue
		}
		g.WideMLP[i] = c.UseDoubleWideMLP && first > 0
		for j := first - 1; j >= 0; j-- {
			if c.LayerTypes[j] == c.LayerTypes[i] {
				g.SharedFrom[i] = j
				break
			}
		}
	}
}

// parameters counts what Gemma 4's optional parts add to the layers counted elsewhere: the
// per-layer inputs, the wider MLPs and the MoE blocks (active: TopK experts of each).
func (g GlobalShape) parameters(s Shape, active bool) int64 {
	h, l := int64(s.Hidden), int64(s.Layers)
	var n int64
	if p := int64(g.PerLayerInput); p > 0 {
		n += int64(g.PerLayerVocab)*l*p + l*p*h + p // embeddings, projection, norm
		n += l * (p*h + h*p + h)                    // each layer's gate, projection, norm
	}
	for _, w := range g.WideMLP {
		if w {
			n += 3 * h * int64(s.Intermediate) // the second half of a double-wide MLP
		}
	}
	if e := int64(g.BesideExperts); e > 0 {
		used := e
		if active {
			used = int64(g.BesideTopK)
		}
		// router scale, per-expert scale, proj; experts; three norms.
		n += l * (h + e + e*h + used*3*h*int64(g.BesideWidth) + 3*h)
	}
	return n
}
