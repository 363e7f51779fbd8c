package nn

import (
	"fmt"
	"math"
)

// DSV4 attention kinds (config.json's layer_types of deepseek_v4).
const (
	DSV4Sliding   = "sliding_attention"
	DSV4CSA       = "compressed_sparse_attention"
	DSV4HCA       = "heavily_compressed_attention"
	DSV4HashMoE   = "hash_moe"
	DSV4RoutedMoE = "moe"
)

// DSV4Config is the shape of a DeepSeek-V4 decoder (transformers' DeepseekV4ForCausalLM).
type DSV4Config struct {
	Vocab, Hidden, Heads, HeadDim int
	// QRank is q_lora_rank; OGroups and ORank shape the grouped output projection.
	QRank, OGroups, ORank int
	// Window is the sliding window every layer's own keys use.
	Window int
	// LayerTypes and MLPTypes give each layer's attention and routing kind; Rates the
	// compression rate of each layer's compressor (0 for sliding layers).
	LayerTypes, MLPTypes []string
	Rates                []int
	// Experts routed, TopK per token, ExpertDim their width (also the shared expert's).
	Experts, TopK, ExpertDim int
	// SharedBias: the shared expert's projections carry biases (mlp_bias).
	SharedBias               bool
	RoutedScale, SwigluLimit float64
	// HC streams, HCIters Sinkhorn iterations, HCEps their floor.
	HC, HCIters int
	HCEps, Eps  float64
	// The lightning indexer of compressed sparse attention.
	IndexHeads, IndexDim, IndexTopK int
	// MainInvFreq is the rotary table of sliding layers, CompressInvFreq that of compressed
	// layers, their compressors and indexers (one frequency per rotated pair, float32-rounded);
	// MainScale and CompressScale multiply their cos and sin (a rope type's attention
	// scaling; 0 means 1).
	MainInvFreq, CompressInvFreq []float64
	MainScale, CompressScale     float64
}

func (c *DSV4Config) compressScale() float64 {
	if c.CompressScale == 0 {
		return 1
	}
	return c.CompressScale
}

// RopeInvFreq returns transformers' default inverse frequencies for rotating dim channels
// with base theta, computed in float32 as torch does.
func RopeInvFreq(theta float64, dim int) []float64 {
	out := make([]float64, dim/2)
	for i := range out {
		e := float32(2*i) / float32(dim)
		out[i] = float64(float32(1 / float32(math.Pow(float64(float32(theta)), float64(e)))))
	}
	return out
}

// DSV4 runs a DeepSeek-V4 decoder on the host tape: manifold-constrained hyper-connections
// (HC residual streams mixed by Sinkhorn-projected matrices), shared-key-value multi-query
// attention with a learned sink per head over a sliding window, plus compressed key-value
// entries (heavily compressed attention: one pooled entry per Rates[i] tokens; compressed
// sparse attention: overlapping windows, of which a lightning indexer keeps IndexTopK per
// query), a grouped low-rank output projection, and a mixture of clamped-SwiGLU experts
// routed by sqrt(softplus) scores (learned top-k with a correction bias, or a fixed token
// table for hash layers) beside a shared expert.
//
// Param looks parameters up by transformers' names (model.layers.0.self_attn.q_a_proj.weight
// ...); Tid2Eid[i] is the token-to-experts table of hash layer i ([Vocab*TopK]).
type DSV4 struct {
	Cfg     DSV4Config
	Param   func(name string) *HVar
	Tid2Eid [][]int
}

func (m *DSV4) p(name string) *HVar {
	v := m.Param(name)
	if v == nil {
		panic("nn: DSV4: no parameter " + name)
	}
	return v
}

// Logits runs one document (positions 0..len(ids)-1) and returns its logits [T, Vocab].
func (m *DSV4) Logits(t *HostTape, ids []int) (*HVar, error) {
	c := &m.Cfg
	for _, id := range ids {
		if id < 0 || id >= c.Vocab {
			return nil, fmt.Errorf("nn: DSV4: token id %d outside the vocabulary of %d", id, c.Vocab)
		}
	}
	pos := make([]int, len(ids))
	for i := range pos {
		pos[i] = i
	}
	x := t.Repeat(t.Rows(m.p("model.embed_tokens.weight"), ids), c.HC)
	for i := range c.LayerTypes {
		x = m.layer(t, i, x, ids, pos)
	}
	flat := t.RMSNorm(x, c.HC*c.Hidden, nil, c.Eps)
	mix := t.Linear(flat, m.p("model.hc_head.hc_fn"))
	mix = t.ScaleShift(mix, m.p("model.hc_head.hc_scale"), m.p("model.hc_head.hc_base"), func(int) int { return 0 })
	y := t.StreamCollapse(t.Sigmoid(mix, 1, c.HCEps), x)
	y = t.RMSNorm(y, c.Hidden, m.p("model.norm.weight"), c.Eps)
	return t.Linear(y, m.p("lm_head.weight")), nil
}

// layer is decoder layer i on the streams x [T, HC*C].
func (m *DSV4) layer(t *HostTape, i int, x *HVar, ids, pos []int) *HVar {
	c := &m.Cfg
	pre := fmt.Sprintf("model.layers.%d.", i)
	coll, post, comb := m.hyper(t, pre+"attn_hc", x)
	h := t.RMSNorm(coll, c.Hidden, m.p(pre+"input_layernorm.weight"), c.Eps)
	x = t.StreamExpand(post, m.attention(t, i, h, pos), comb, x)
	coll, post, comb = m.hyper(t, pre+"ffn_hc", x)
	h = t.RMSNorm(coll, c.Hidden, m.p(pre+"post_attention_layernorm.weight"), c.Eps)
	return t.StreamExpand(post, m.moe(t, i, h, ids), comb, x)
}

// hyper computes one hyper-connection's weights from the streams x: the collapsed block
// input, the expansion weights post [T, HC] and the Sinkhorn-projected mixing matrices comb
// [T, HC*HC] (row j, column k: stream j's share of output stream k).
func (m *DSV4) hyper(t *HostTape, name string, x *HVar) (coll, post, comb *HVar) {
	c := &m.Cfg
	n := c.HC
	flat := t.RMSNorm(x, n*c.Hidden, nil, c.Eps)
	z := t.Linear(flat, m.p(name+".fn"))
	z = t.ScaleShift(z, m.p(name+".scale"), m.p(name+".base"), func(j int) int {
		switch {
		case j < n:
			return 0
		case j < 2*n:
			return 1
		}
		return 2
	})
	preW := t.Sigmoid(t.Cols(z, 0, n), 1, c.HCEps)
	post = t.Sigmoid(t.Cols(z, n, 2*n), 2, 0)
	comb = t.AddConst(t.Softmax(t.Cols(z, 2*n, 2*n+n*n), n), c.HCEps)
	comb = t.Normalize(comb, n, true, c.HCEps)
	for it := 1; it < c.HCIters; it++ {
		comb = t.Normalize(comb, n, false, c.HCEps)
		comb = t.Normalize(comb, n, true, c.HCEps)
	}
	return t.StreamCollapse(preW, x), post, comb
}

// attention is layer i's attention on the normalised input h [T, C].
func (m *DSV4) attention(t *HostTape, i int, h *HVar, pos []int) *HVar {
	c := &m.Cfg
	sa := fmt.Sprintf("model.layers.%d.self_attn.", i)
	D, T := c.HeadDim, h.R
	kind := c.LayerTypes[i]
	inv, scale := c.CompressInvFreq, c.CompressScale
	if kind == DSV4Sliding {
		inv, scale = c.MainInvFreq, c.MainScale
	}
	if scale == 0 {
		scale = 1
	}
	qres := t.RMSNorm(t.Linear(h, m.p(sa+"q_a_proj.weight")), c.QRank, m.p(sa+"q_a_norm.weight"), c.Eps)
	q := t.RMSNorm(t.Linear(qres, m.p(sa+"q_b_proj.weight")), D, nil, c.Eps)
	q = t.RopeScaled(q, D, pos, inv, 1, scale)
	kv := t.RMSNorm(t.Linear(h, m.p(sa+"kv_proj.weight")), D, m.p(sa+"kv_norm.weight"), c.Eps)
	kv = t.RopeScaled(kv, D, pos, inv, 1, scale)
	win := c.Window
	allow := func(q, s int) bool { return s <= q && q-s < win }
	if kind != DSV4Sliding {
		rate := c.Rates[i]
		ck := m.compress(t, h, sa+"compressor.", rate, kind == DSV4CSA)
		if ck != nil {
			kv = t.ConcatRows(kv, ck)
			var picked [][]bool
			if kind == DSV4CSA {
				picked = m.index(t, h, qres, sa+"compressor.indexer.", rate, ck.R)
			}
			allow = func(q, s int) bool {
				if s < T {
					return s <= q && q-s < win
				}
				w := s - T
				if w >= (q+1)/rate {
					return false
				}
				return picked == nil || picked[q][w]
			}
		}
	}
	o := t.SinkAttention(q, kv, m.p(sa+"sinks"), allow, 1/math.Sqrt(float64(D)))
	o = t.RopeScaled(o, D, pos, inv, -1, scale)
	o = t.GroupedLinear(o, m.p(sa+"o_a_proj.weight"), c.OGroups)
	return t.Linear(o, m.p(sa+"o_b_proj.weight"))
}

// compress pools h [T, C] into one entry per rate tokens (overlapping windows when overlap),
// normalised and rotated at each window's first position; nil when T < rate.
func (m *DSV4) compress(t *HostTape, h *HVar, pre string, rate int, overlap bool) *HVar {
	n := h.R / rate
	if n == 0 {
		return nil
	}
	kv := t.Linear(h, m.p(pre+"kv_proj.weight"))
	gate := t.Linear(h, m.p(pre+"gate_proj.weight"))
	pooled := t.WindowPool(kv, gate, m.p(pre+"position_bias"), rate, overlap)
	norm := m.p(pre + "kv_norm.weight")
	pooled = t.RMSNorm(pooled, norm.R*norm.C, norm, m.Cfg.Eps)
	pos := make([]int, n)
	for w := range pos {
		pos[w] = w * rate
	}
	return t.RopeScaled(pooled, pooled.C, pos, m.Cfg.CompressInvFreq, 1, m.Cfg.compressScale())
}

// index is the lightning indexer: for each query it marks the IndexTopK compressed entries
// (of n) with the highest Σ_h w_h relu(q_h·k) among those the query may see. The choice is
// discrete, so no gradient flows through it (as in transformers, where only indices leave it).
func (m *DSV4) index(t *HostTape, h, qres *HVar, pre string, rate, n int) [][]bool {
	c := &m.Cfg
	keys := m.compress(t, h, pre, rate, true)
	T, Di, Hi := h.R, c.IndexDim, c.IndexHeads
	pos := make([]int, T)
	for i := range pos {
		pos[i] = i
	}
	q := t.RopeScaled(t.Linear(qres, m.p(pre+"q_b_proj.weight")), Di, pos, c.CompressInvFreq, 1, c.compressScale())
	wts := t.Linear(h, m.p(pre+"scorer.weights_proj.weight"))
	k := min(c.IndexTopK, n)
	out := make([][]bool, T)
	score := make([]float64, n)
	for ti := 0; ti < T; ti++ {
		out[ti] = make([]bool, n)
		limit := (ti + 1) / rate
		for w := 0; w < n; w++ {
			if w >= limit {
				score[w] = math.Inf(-1)
				continue
			}
			s := 0.0
			for hh := 0; hh < Hi; hh++ {
				d := 0.0
				for j := 0; j < Di; j++ {
					d += q.V[ti*q.C+hh*Di+j] * keys.V[w*Di+j]
				}
				s += math.Max(d, 0) / math.Sqrt(float64(Di)) * wts.V[ti*Hi+hh] / math.Sqrt(float64(Hi))
			}
			score[w] = s
		}
		// Exact ties (a query whose every head scores 0 on several entries after the ReLU)
		// are kept as torch's top-k keeps them.
		for _, w := range torchTopK(score, k) {
			if w < limit {
				out[ti][w] = true
			}
		}
	}
	return out
}

// moe is layer i's mixture of experts on h [T, C] for the tokens ids.
func (m *DSV4) moe(t *HostTape, i int, h *HVar, ids []int) *HVar {
	c := &m.Cfg
	mlp := fmt.Sprintf("model.layers.%d.mlp.", i)
	T, E, K := h.R, c.Experts, c.TopK
	scores := t.SqrtSoftplus(t.Linear(h, m.p(mlp+"gate.weight")))
	idx := make([]int, T*K)
	if c.MLPTypes[i] == DSV4HashMoE {
		table := m.Tid2Eid[i]
		for r, id := range ids {
			copy(idx[r*K:(r+1)*K], table[id*K:(id+1)*K])
		}
	} else {
		bias := m.p(mlp + "gate.e_score_correction_bias")
		sel := make([]float64, E)
		for r := 0; r < T; r++ {
			for e := range sel {
				sel[e] = scores.V[r*E+e] + bias.V[e]
			}
			copy(idx[r*K:(r+1)*K], torchTopK(sel, K))
		}
	}
	w := t.RouteWeights(scores, idx, K, c.RoutedScale)
	var parts []*HVar
	var rows [][]int
	for e := 0; e < E; e++ {
		var toks, at []int
		for j, x := range idx {
			if x == e {
				toks, at = append(toks, j/K), append(at, j)
			}
		}
		if len(toks) == 0 {
			continue
		}
		ex := fmt.Sprintf("%sexperts.%d.", mlp, e)
		xe := t.Rows(h, toks)
		a := t.ClampSwiGLU(t.Linear(xe, m.p(ex+"gate_proj.weight")), t.Linear(xe, m.p(ex+"up_proj.weight")), c.SwigluLimit)
		parts = append(parts, t.ScaleRowsBy(t.Linear(a, m.p(ex+"down_proj.weight")), w, at))
		rows = append(rows, toks)
	}
	routed := t.ScatterRows(T, c.Hidden, parts, rows)
	se := mlp + "shared_experts."
	lin := func(x *HVar, name string) *HVar {
		y := t.Linear(x, m.p(se+name+".weight"))
		if c.SharedBias {
			y = t.AddRow(y, m.p(se+name+".bias"))
		}
		return y
	}
	a := t.ClampSwiGLU(lin(h, "gate_proj"), lin(h, "up_proj"), c.SwigluLimit)
	return t.Add(routed, lin(a, "down_proj"))
}
