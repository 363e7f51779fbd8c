package config

// NumParameters is the number of parameters of the model the config describes, counted as
// transformers counts model.parameters() (a tied LM head counted once): embeddings, attention
// projections with their biases, q/k norms, dense MLPs or routed experts with their routers,
// RMSNorm weights and the LM head.
func (c *Config) NumParameters() int64 { return c.countParameters(false) }

// ActiveParameters is the number of parameters one token passes through: NumParameters with
// only NumExpertsPerTok of each MoE layer's experts counted. Used for model FLOPs (6·N·tokens).
func (c *Config) ActiveParameters() int64 { return c.countParameters(true) }

func (c *Config) countParameters(active bool) int64 {
	h := int64(c.HiddenSize)
	v := int64(c.VocabSize)
	q := int64(c.NumAttentionHeads) * int64(c.HeadDim)
	kv := int64(c.NumKeyValueHeads) * int64(c.HeadDim)
	n := v * h // embed_tokens
	if !c.TieWordEmbeddings {
		n += v * h // lm_head
	}
	n += h // final norm

	attn := h*q + 2*h*kv + q*h
	if c.QKVBias() {
		attn += q + 2*kv
	}
	if c.OProjBias() {
		attn += h
	}
	switch c.QKNormKind() {
	case QKNormPerHead:
		attn += 2 * int64(c.HeadDim)
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
	for i := 0; i < c.NumHiddenLayers; i++ {
		n += attn + 2*h // input and post-attention norms
		if c.IsMoELayer(i) {
			experts := int64(c.NumExperts)
			if active {
				experts = int64(c.NumExpertsPerTok)
			}
			n += h*int64(c.NumExperts) + experts*mlp(int64(c.ExpertIntermediateSize()), false)
		} else {
			n += mlp(int64(c.IntermediateSize), c.MLPBias)
		}
	}
	return n
}
