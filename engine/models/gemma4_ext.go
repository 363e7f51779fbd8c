package models

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Gemma 4's optional parts of the decoder (transformers' Gemma4TextModel and
// Gemma4TextDecoderLayer):
//
//   - per-layer input embeddings (hidden_size_per_layer_input P > 0): before the layers,
//     pl = (RMSNorm_P(per_layer_model_projection(x0) / sqrt(C)) +
//     embed_tokens_per_layer(ids) * sqrt(P)) / sqrt(2), [N, L*P] with x0 the scaled token
//     embeddings; layer i ends with nn.PerLayerInput over its P columns;
//   - shared KV layers (num_kv_shared_layers S > 0): the last S layers project no keys or
//     values and attend over those of the last earlier layer of their type (nn.SharedKV);
//     with use_double_wide_mlp their MLP is twice intermediate_size wide;
//   - the MoE block (enable_moe_block): nn.MoEBesideMLP in place of the MLP, reading the
//     residual stream, with the router's scale and per-expert scale and GeGLU experts stored
//     stacked (experts.gate_up_proj [E, 2I, C], experts.down_proj [E, C, I]), bound whole
//     for the block's device path and as per-expert views for its host path.

// gemma4Parts are the optional parts a gemma4_text model has (config.GlobalShape).
type gemma4Parts struct {
	ple, vocabPL int // hidden_size_per_layer_input, vocab_size_per_layer_input
	moe          bool
	experts      int
	topK, moeI   int
	sharedFrom   []int
	wide         []bool
}

// gemma4PartsOf reads the parts from the architecture's shape.
func gemma4PartsOf(a *Arch) gemma4Parts {
	g := a.Global
	return gemma4Parts{ple: g.PerLayerInput, vocabPL: g.PerLayerVocab, moe: g.BesideExperts > 0,
		experts: g.BesideExperts, topK: g.BesideTopK, moeI: g.BesideWidth, sharedFrom: g.SharedFrom, wide: g.WideMLP}
}

// sharedSource returns the layer whose keys and values layer i attends over, or -1 when
// layer i projects its own.
func (g gemma4Parts) sharedSource(_ *Arch, i int) int {
	if i < len(g.sharedFrom) {
		return g.sharedFrom[i]
	}
	return -1
}

// mlpWidth is layer i's dense MLP width.
func (g gemma4Parts) mlpWidth(a *Arch, i int) int {
	if i < len(g.wide) && g.wide[i] {
		return 2 * a.Intermediate
	}
	return a.Intermediate
}

// gemma4CheckParts refuses the combinations of the optional parts the model cannot build.
func gemma4CheckParts(c *config.Config) error {
	if n := c.NumKVSharedLayers; n > 0 {
		if n >= c.NumHiddenLayers {
			return fmt.Errorf("models: gemma4_text: num_kv_shared_layers %d must be below num_hidden_layers %d: the shared layers reuse the keys and values of earlier layers", n, c.NumHiddenLayers)
		}
		if len(c.LayerTypes) != c.NumHiddenLayers {
			return fmt.Errorf("models: gemma4_text: num_kv_shared_layers needs layer_types for each of the %d layers", c.NumHiddenLayers)
		}
		g := c.Shape().Global
		for i := c.NumHiddenLayers - n; i < c.NumHiddenLayers; i++ {
			if !g.Shared(i) {
				return fmt.Errorf("models: gemma4_text: layer %d (%s) shares keys and values but no layer before the %d shared ones has its type; lower num_kv_shared_layers", i, c.LayerTypes[i], n)
			}
		}
	}
	if p := c.HiddenSizePerLayerInput; p > 0 && c.VocabSizePerLayerInput <= 0 {
		return fmt.Errorf("models: gemma4_text: hidden_size_per_layer_input %d needs vocab_size_per_layer_input > 0, got %d", p, c.VocabSizePerLayerInput)
	}
	if c.EnableMoEBlock {
		switch {
		case c.NumExperts < 1:
			return fmt.Errorf("models: gemma4_text: enable_moe_block needs num_experts >= 1, got %d", c.NumExperts)
		case c.TopKExperts < 1 || c.TopKExperts > c.NumExperts:
			return fmt.Errorf("models: gemma4_text: top_k_experts %d must be between 1 and num_experts %d", c.TopKExperts, c.NumExperts)
		case c.MoEIntermediateSize < 1:
			return fmt.Errorf("models: gemma4_text: enable_moe_block needs moe_intermediate_size >= 1, got %d", c.MoEIntermediateSize)
		}
	}
	return nil
}

// gemma4FFN are the feed-forward hooks: the MLP at its layer's width, beside the MoE block
// when enabled.
type gemma4FFN struct{}

// Specs implements FFNHooks: the MLP (the MoE block's parameters are in the layer's tail, where
// transformers lists them).
func (gemma4FFN) Specs(a *Arch, i int) []ParamSpec {
	f := gemma4PartsOf(a).mlpWidth(a, i)
	return []ParamSpec{matrix(layerName(i, "mlp.gate_proj.weight"), f, a.Hidden),
		matrix(layerName(i, "mlp.up_proj.weight"), f, a.Hidden),
		matrix(layerName(i, "mlp.down_proj.weight"), a.Hidden, f)}
}

// Build implements FFNHooks.
func (gemma4FFN) Build(a *Arch, i int, param, grad func(string) tensor.Tensor) nn.FFN {
	lin := func(module string) nn.Linear {
		return nn.Linear{Name: module, W: param(module + ".weight"), GW: grad(module + ".weight")}
	}
	norm := func(module string) nn.RMSNorm {
		return nn.RMSNorm{Name: module, W: param(module + ".weight"), GW: grad(module + ".weight"), Eps: a.NormEps}
	}
	pre := layerName(i, "")
	mlp := &nn.MLP{Name: pre + "mlp", Gate: lin(pre + "mlp.gate_proj"), Up: lin(pre + "mlp.up_proj"),
		Down: lin(pre + "mlp.down_proj"), Act: a.Act}
	g := gemma4PartsOf(a)
	if !g.moe {
		return mlp
	}
	m := &nn.MoEBesideMLP{
		Name: pre[:len(pre)-1], PreMLP: norm(pre + "pre_feedforward_layernorm"), MLP: mlp,
		PostMLP: norm(pre + "post_feedforward_layernorm_1"), Router: lin(pre + "router.proj"),
		RouterScale: param(pre + "router.scale"), GRouterScale: grad(pre + "router.scale"),
		PerExpertScale: param(pre + "router.per_expert_scale"), GPerExpertScale: grad(pre + "router.per_expert_scale"),
		RouterEps: a.NormEps, PreExperts: norm(pre + "pre_feedforward_layernorm_2"),
		PostExperts: norm(pre + "post_feedforward_layernorm_2"), TopK: g.topK,
	}
	gu, dn := param(pre+"experts.gate_up_proj"), param(pre+"experts.down_proj")
	ggu, gdn := grad(pre+"experts.gate_up_proj"), grad(pre+"experts.down_proj")
	// The checkpoint stores the experts stacked: the device path's grouped GEMMs read these
	// tensors, the host path the per-expert views below (the same memory).
	m.GateUp = nn.Linear{Name: pre + "experts.gate_up_proj", W: gu, GW: ggu}
	m.Down = nn.Linear{Name: pre + "experts.down_proj", W: dn, GW: gdn}
	c, e := a.Hidden, g.moeI
	view := func(t tensor.Tensor, off int, shape ...int) tensor.Tensor {
		if t.IsNil() {
			return t
		}
		v, _ := t.View(off, shape...)
		return v
	}
	for x := 0; x < g.experts; x++ {
		name := fmt.Sprintf("%sexperts.%d.", pre, x)
		m.Experts = append(m.Experts, nn.Expert{
			Gate: nn.Linear{Name: name + "gate", W: view(gu, x*2*e*c, e, c), GW: view(ggu, x*2*e*c, e, c)},
			Up:   nn.Linear{Name: name + "up", W: view(gu, x*2*e*c+e*c, e, c), GW: view(ggu, x*2*e*c+e*c, e, c)},
			Down: nn.Linear{Name: name + "down", W: view(dn, x*c*e, c, e), GW: view(gdn, x*c*e, c, e)},
		})
	}
	return m
}

// gemma4LayerTail lists layer i's per-layer input stage and MoE block, in transformers' order.
func gemma4LayerTail(a *Arch, i int) []ParamSpec {
	g := gemma4PartsOf(a)
	var s []ParamSpec
	if g.ple > 0 {
		s = append(s, matrix(layerName(i, "per_layer_input_gate.weight"), g.ple, a.Hidden),
			matrix(layerName(i, "per_layer_projection.weight"), a.Hidden, g.ple),
			normWeight(layerName(i, "post_per_layer_input_norm.weight"), a.Hidden))
	}
	if g.moe {
		c, e, x := a.Hidden, g.moeI, g.experts
		s = append(s, normWeight(layerName(i, "router.scale"), c),
			normWeight(layerName(i, "router.per_expert_scale"), x),
			matrix(layerName(i, "router.proj.weight"), x, c),
			ParamSpec{Name: layerName(i, "experts.gate_up_proj"), Shape: []int{x, 2 * e, c}, Decay: true, Init: InitNormal, ZeroRow: -1},
			ParamSpec{Name: layerName(i, "experts.down_proj"), Shape: []int{x, c, e}, Decay: true, Init: InitNormal, ZeroRow: -1},
			normWeight(layerName(i, "post_feedforward_layernorm_1.weight"), c),
			normWeight(layerName(i, "post_feedforward_layernorm_2.weight"), c),
			normWeight(layerName(i, "pre_feedforward_layernorm_2.weight"), c))
	}
	return s
}

// Names of the model-level per-layer input parameters.
const (
	namePLEmbed = "model.embed_tokens_per_layer.weight"
	namePLProj  = "model.per_layer_model_projection"
	namePLNorm  = "model.per_layer_projection_norm"
)

// gemma4ModelTail lists the per-layer input embeddings, their projection and norm.
func gemma4ModelTail(a *Arch) []ParamSpec {
	g := gemma4PartsOf(a)
	if g.ple <= 0 {
		return nil
	}
	emb := matrix(namePLEmbed, g.vocabPL, a.Layers*g.ple)
	if a.PadID >= 0 && a.PadID < g.vocabPL {
		emb.ZeroRow = a.PadID
	}
	return []ParamSpec{emb, matrix(namePLProj+".weight", a.Layers*g.ple, a.Hidden), normWeight(namePLNorm+".weight", g.ple)}
}

// gemma4Extend wires the optional parts into the built layers.
func gemma4Extend(m *Model, b *binder) {
	a := &m.Arch
	g := gemma4PartsOf(a)
	m.ple = nil
	shares := map[int]*nn.SharedKV{}
	for i, blk := range m.blocks {
		if g.moe {
			blk.FFNOnResidual = true
		}
		if src := g.sharedSource(a, i); src >= 0 {
			s := shares[src]
			if s == nil {
				s = &nn.SharedKV{Layer: src}
				shares[src] = s
				m.blocks[src].Attn.KVOut = s
			}
			blk.Attn.KVIn = s
		}
		if g.ple > 0 {
			blk.PerLayer = &nn.PerLayerInput{
				Name: layerName(i, "per_layer_input"), Gate: b.lin(layerName(i, "per_layer_input_gate")),
				Proj: b.lin(layerName(i, "per_layer_projection")), Norm: b.norm(layerName(i, "post_per_layer_input_norm")),
				Col: i * g.ple,
			}
		}
	}
	pl := &perLayerInputs{width: g.ple}
	for _, s := range shares {
		pl.shares = append(pl.shares, s)
	}
	if g.ple > 0 {
		pl.embed = nn.Embedding{Name: "model.embed_tokens_per_layer", W: b.param(namePLEmbed), GW: b.grad(namePLEmbed),
			Scale: embedScale(g.ple, m.opts.DType)}
		pl.proj, pl.norm = b.lin(namePLProj), b.norm(namePLNorm)
	}
	if g.ple > 0 || len(pl.shares) > 0 {
		m.ple = pl
	}
}

// perLayerInputs is the model's per-pass state of Gemma 4's optional parts: the per-layer
// inputs (when P > 0) and the shared keys and values, which it frees after each pass.
type perLayerInputs struct {
	width       int
	embed       nn.Embedding
	proj        nn.Linear
	norm        nn.RMSNorm
	shares      []*nn.SharedKV
	in, din     tensor.Tensor
	pj, rstd, x tensor.Tensor
}

// forward computes the per-layer inputs from the token ids and the scaled embeddings x0 (kept,
// not owned, for the backward when train) and hands them to the blocks.
func (s *perLayerInputs) forward(p *nnPass, ids, x0 tensor.Tensor, blocks []*nn.Block, train bool) (err error) {
	if s.width == 0 {
		return nil
	}
	defer func() {
		if err != nil {
			s.release(p)
		}
	}()
	c := x0.Dim(1)
	e, err := s.embed.Forward(p, ids)
	if err != nil {
		return err
	}
	defer func() { _ = p.B.Free(e) }()
	if s.pj, err = s.proj.Forward(p, x0); err != nil {
		return err
	}
	if err = p.B.Scale(s.pj, float32(1/math.Sqrt(float64(c)))); err != nil {
		return fmt.Errorf("models: per-layer inputs: %w", err)
	}
	if s.in, s.rstd, err = s.norm.Forward(p, s.pj); err != nil {
		return err
	}
	if err = p.B.Add(s.in, s.in, e); err == nil {
		err = p.B.Scale(s.in, float32(1/math.Sqrt2))
	}
	if err != nil {
		return fmt.Errorf("models: per-layer inputs: %w", err)
	}
	if train {
		s.x = x0
		if s.din, err = p.B.Alloc(p.DType, s.in.Shape()...); err != nil {
			return fmt.Errorf("models: per-layer inputs: %w", err)
		}
	} else {
		_ = p.B.Free(s.pj)
		_ = p.B.Free(s.rstd)
		s.pj, s.rstd = tensor.Tensor{}, tensor.Tensor{}
	}
	for _, b := range blocks {
		b.PerLayer.In, b.PerLayer.DIn = s.in, s.din
	}
	return nil
}

// backward adds the gradient of the per-layer inputs' projection into dx0 (the gradient of
// the scaled embeddings) and accumulates the per-layer parameters' gradients.
func (s *perLayerInputs) backward(p *nnPass, dx0, ids tensor.Tensor) error {
	if s.width == 0 {
		return nil
	}
	if s.din.IsNil() || s.pj.IsNil() {
		return fmt.Errorf("models: per-layer inputs: backward without a training forward")
	}
	if err := p.B.Scale(s.din, float32(1/math.Sqrt2)); err != nil {
		return fmt.Errorf("models: per-layer inputs: %w", err)
	}
	dpj, err := p.B.Empty(p.DType, s.pj.Shape()...)
	if err != nil {
		return fmt.Errorf("models: per-layer inputs: %w", err)
	}
	defer func() { _ = p.B.Free(dpj) }()
	if err = s.norm.Backward(p, dpj, s.din, s.pj, s.rstd, false); err != nil {
		return err
	}
	if err = s.embed.Backward(p, s.din, ids); err != nil {
		return err
	}
	if err = p.B.Scale(dpj, float32(1/math.Sqrt(float64(dx0.Dim(1))))); err != nil {
		return fmt.Errorf("models: per-layer inputs: %w", err)
	}
	return s.proj.Backward(p, dx0, dpj, s.x, true)
}

// release frees the pass's per-layer inputs and shared keys and values.
func (s *perLayerInputs) release(p *nnPass) {
	for _, t := range []*tensor.Tensor{&s.in, &s.din, &s.pj, &s.rstd} {
		if !t.IsNil() {
			_ = p.B.Free(*t)
			*t = tensor.Tensor{}
		}
	}
	s.x = tensor.Tensor{}
	for _, sh := range s.shares {
		sh.Release(p)
	}
}
