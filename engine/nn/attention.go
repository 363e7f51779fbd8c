package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// KVCache holds one layer's rotated keys and values for incremental decoding.
// K, V [MaxLen, NKV*HD] in the activation dtype. K2 and V2, of the same shape, are needed only
// by passes with Pass.CacheGather: the gather writes into them and then trades them with K and V.
type KVCache struct {
	K, V   T
	K2, V2 T
	// Linear is the decoding state of a gated delta-net layer, which has no K and V.
	Linear *LinearState
}

// Attention is the self-attention of a Llama-style decoder layer: q/k/v projections, optional
// per-head RMSNorm of queries and keys (Qwen3, applied before RoPE), rotary embedding (rotate-half
// or interleaved pairs, or none on a NoPE layer), causal
// GQA attention over packed documents with an optional sliding window, and the output
// projection.
//
// With Sinks set the attention output and log-sum-exp are those of the softmax that includes
// the sinks (backend AttentionSinks), which the backward reads as they are.
//
// Cached for backward (between Forward and Backward): the input x (not owned: the caller keeps
// it alive), q and k after norm and rotation, v, the attention output and its log-sum-exp, and
// with q/k norm the pre-norm q and k (rotated with NormAfterRoPE) with their rstd.
type Attention struct {
	Name         string
	Q, K, V, O   Linear
	QNorm, KNorm *RMSNorm // nil when the family has no q/k norm
	NH, NKV, HD  int
	RotaryDim    int // R; 0 means HD
	Window       int // sliding window in tokens; 0 = full causal
	Layer        int // index into Pass.Cache
	// Latent, when set, is the layer's multi-head latent attention (MLA), which Forward,
	// Backward and Release run in place of the projections above.
	Latent *MLA
	// NoRoPE leaves queries and keys unrotated (smollm3's NoPE layers).
	NoRoPE bool
	// NormAfterRoPE applies QNorm and KNorm to the rotated queries and keys (HunYuan) instead
	// of rotating the normalised ones.
	NormAfterRoPE bool
	// Interleaved rotates the pairs (2i, 2i+1) instead of (i, i+R/2) (glm4).
	Interleaved bool
	// Scale is the score scale; 0 means 1/sqrt(HD) (granite's attention_multiplier, Gemma's
	// query_pre_attn_scalar^-0.5).
	Scale float32
	// Sinks [NH], optional, are learned per-head logits that join every query's softmax
	// without a value (gpt-oss); GSinks is their gradient (+=).
	Sinks, GSinks T
	// LocalRope rotates with the pass's local table (Pass.LocalInvFreq: the sliding layers of
	// families with a second RoPE base) instead of its main one.
	LocalRope bool
	// HeadGate, when set (W [NH, C]), scales each head's output by softplus(x · HeadGate^T)
	// of its own before O (Laguna's g_proj; attention_head_gate.go).
	HeadGate *Linear
	// OutGate: Q also projects a per-head output gate that scales the attention output by its
	// sigmoid before O (attention_gate.go; qwen3_next, qwen3_5_moe_text).
	OutGate bool
	// Linear, when set, is the layer's gated delta-net linear attention, which Forward,
	// Backward and Release run in place of everything above.
	Linear *GatedDeltaNet
	// Conv, when set, is the layer's gated short convolution (LFM2's conv layers), run in
	// place of attention.
	Conv *ShortConv
	// MoA, when set, is the layer's mixture of attention heads (JetMoE), run in place of the
	// projections above (attention_moa.go).
	MoA *MoA
	// VNorm, when set, RMS-normalises each value head (Gemma 4's v_norm: its W is a ones
	// vector of HD, not a parameter, and GW is unset).
	VNorm *RMSNorm
	// KEqV: the layer has no value projection; the values are the key projection's output
	// (before the key norm and RoPE), normalised by VNorm when set (Gemma 4's
	// attention_k_eq_v). Their gradient joins the key projection's.
	KEqV bool
	// KVOut, when set, receives this layer's keys and values after each forward for the later
	// layers that share them, and gives their gradients back in the backward; KVIn, when set,
	// makes the layer attend over another layer's keys and values (K, V, KNorm and VNorm
	// unused). See SharedKV.
	KVOut, KVIn *SharedKV

	c attnCache
}

type attnCache struct {
	x                    T
	qPre, kPre, qRs, kRs T
	vPre, vRs            T // the value projection's output before VNorm, and its rstd
	q, k, v, out, lse    T
	gate, gated          T // the output gate's values and the gated output (OutGate, HeadGate)
	kAll, vAll           T // keys/values attended over (views of the KV cache when decoding)
	live                 bool
}

func (a *Attention) shape(p *Pass) backend.AttentionShape {
	return backend.AttentionShape{
		CuSeqlens: p.CuSeqlens, CuSeqlensK: p.CuSeqlensK, MaxSeqLen: p.MaxSeqLen,
		NH: a.NH, NKV: a.NKV, HD: a.HD, Window: a.Window, Scale: a.Scale,
	}
}

func (a *Attention) rope(p *Pass, heads int) backend.RoPEArgs {
	inv, scaling := p.InvFreq, p.AttentionScaling
	if a.LocalRope {
		inv, scaling = p.LocalInvFreq, p.LocalAttentionScaling
	}
	return backend.RoPEArgs{
		Positions: p.Positions, InvFreq: inv, Heads: heads, HeadDim: a.HD,
		RotaryDim: a.RotaryDim, AttentionScaling: scaling, Interleaved: a.Interleaved,
	}
}

// Forward returns a new y [N,C] for x [N,C] (the normed hidden states). When keep is true the
// activations are cached for Backward; otherwise they are released before returning.
func (a *Attention) Forward(p *Pass, x T, keep bool) (y T, err error) {
	if a.Latent != nil {
		return a.Latent.Forward(p, x, keep)
	}
	if a.Linear != nil {
		return a.Linear.Forward(p, x, keep)
	}
	if a.Conv != nil {
		return a.Conv.Forward(p, x, keep)
	}
	if a.MoA != nil {
		return a.MoA.Forward(p, x, keep)
	}
	if a.KVIn != nil {
		return a.forwardShared(p, x, keep)
	}
	if a.c.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", a.Name)
	}
	c := &a.c
	c.x = x
	c.live = true
	defer func() {
		if err != nil || !keep {
			a.Release(p)
		}
	}()
	if c.q, err = a.Q.Forward(p, x); err != nil {
		return T{}, err
	}
	if a.OutGate {
		qg := c.q
		c.q, c.gate, err = a.splitGate(p, qg)
		_ = free(p.B, &qg)
		if err != nil {
			return T{}, err
		}
	}
	if c.k, err = a.K.Forward(p, x); err != nil {
		return T{}, err
	}
	if !a.KEqV {
		if c.v, err = a.V.Forward(p, x); err != nil {
			return T{}, err
		}
	}
	if err = a.values(p); err != nil {
		return T{}, err
	}
	if a.NormAfterRoPE {
		if err = a.ropeForward(p); err != nil {
			return T{}, err
		}
	}
	if a.QNorm != nil {
		c.qPre, c.kPre = c.q, c.k
		c.q, c.k = T{}, T{}
		if c.q, c.qRs, err = a.QNorm.Forward(p, c.qPre); err != nil {
			return T{}, err
		}
		if c.k, c.kRs, err = a.KNorm.Forward(p, c.kPre); err != nil {
			return T{}, err
		}
	}
	if !a.NormAfterRoPE {
		if err = a.ropeForward(p); err != nil {
			return T{}, err
		}
	}
	c.kAll, c.vAll = c.k, c.v
	if p.Slots != nil {
		if a.KVOut != nil {
			if err = a.KVOut.publish(p, c.k, c.v, false); err != nil {
				return T{}, wrap(a.Name+" shared keys and values", err)
			}
		}
		if err = a.attendSlots(p); err != nil {
			return T{}, err
		}
		return a.project(p, x)
	}
	if p.Cache != nil {
		if c.kAll, c.vAll, err = a.appendCache(p); err != nil {
			return T{}, err
		}
	}
	if a.KVOut != nil {
		if err = a.KVOut.publish(p, c.kAll, c.vAll, p.Cache != nil); err != nil {
			return T{}, wrap(a.Name+" shared keys and values", err)
		}
	}
	if err = a.attend(p); err != nil {
		return T{}, err
	}
	if !a.Sinks.IsNil() {
		if err = p.B.AttentionSinks(c.out, c.lse, a.Sinks); err != nil {
			return T{}, wrap(a.Name+" sinks", err)
		}
	}
	if keep && a.remakesQK(p) {
		// The normed and rotated queries and keys are made again from qPre and kPre in
		// Backward (remakeQK): (H + H_kv) * D activation elements per token fewer held.
		_ = free(p.B, &c.q, &c.k)
		c.kAll = T{}
	}
	return a.project(p, x)
}

// remakesQK reports whether a kept forward drops its normed (and rotated) queries and keys for
// Backward to make again from the pre-norm ones it keeps: with q/k norms, outside decoding and
// key/value sharing, under HALO_ATTN_QK=recompute.
func (a *Attention) remakesQK(p *Pass) bool {
	return a.QNorm != nil && a.KNorm != nil && p.Cache == nil && p.Slots == nil && a.KVOut == nil && AttentionRemakesQK()
}

// remakeQK makes the cached queries and keys again from qPre and kPre: the norms' forward
// (their new rstd is dropped: the forward's qRs and kRs are the same numbers) and, when the
// norms come before it, RoPE; the forward's ops on the same inputs, so the values are the
// forward's bit for bit. (With NormAfterRoPE, qPre and kPre are already rotated.)
func (a *Attention) remakeQK(p *Pass) (err error) {
	c := &a.c
	var rs T
	if c.q, rs, err = a.QNorm.Forward(p, c.qPre); err != nil {
		return err
	}
	_ = free(p.B, &rs)
	if c.k, rs, err = a.KNorm.Forward(p, c.kPre); err != nil {
		return err
	}
	_ = free(p.B, &rs)
	if !a.NormAfterRoPE {
		if err = a.ropeForward(p); err != nil {
			return err
		}
	}
	c.kAll = c.k
	return nil
}

// attend runs the fused attention of the cached c.q over c.kAll and c.vAll into new c.out and
// its log-sum-exp c.lse (kept for the backward).
func (a *Attention) attend(p *Pass) (err error) {
	c := &a.c
	if c.out, err = p.out(p.N, a.NH*a.HD); err != nil {
		return wrap(a.Name, err)
	}
	if c.lse, err = p.outF32(p.N, a.NH); err != nil {
		return wrap(a.Name, err)
	}
	if err = p.B.Attention(backend.AttentionArgs{
		AttentionShape: a.shape(p), Out: c.out, LSE: c.lse, Q: c.q, K: c.kAll, V: c.vAll,
	}); err != nil {
		return wrap(a.Name, err)
	}
	return nil
}

// project returns O of the attention output c.out, gated first by the output gate (OutGate) or
// the per-head gate of x (HeadGate) when the layer has one.
func (a *Attention) project(p *Pass, x T) (y T, err error) {
	c := &a.c
	if a.OutGate {
		if c.gated, err = a.applyGate(p, c.out, c.gate); err != nil {
			return T{}, err
		}
		return a.O.Forward(p, c.gated)
	}
	if a.HeadGate != nil {
		if c.gate, err = a.HeadGate.Forward(p, x); err != nil {
			return T{}, err
		}
		if c.gated, err = a.applyHeadGate(p, c.out, c.gate); err != nil {
			return T{}, err
		}
		return a.O.Forward(p, c.gated)
	}
	return a.O.Forward(p, c.out)
}

// ropeForward rotates the cached queries and keys in place (unless NoRoPE).
func (a *Attention) ropeForward(p *Pass) error {
	if a.NoRoPE {
		return nil
	}
	if err := p.B.RoPE(a.c.q, a.c.q, a.rope(p, a.NH)); err != nil {
		return wrap(a.Name+" rope q", err)
	}
	if err := p.B.RoPE(a.c.k, a.c.k, a.rope(p, a.NKV)); err != nil {
		return wrap(a.Name+" rope k", err)
	}
	return nil
}

// ropeBackward turns dq and dk, gradients with respect to the rotated queries and keys, into
// gradients with respect to the unrotated ones, in place (unless NoRoPE).
func (a *Attention) ropeBackward(p *Pass, dq, dk T) error {
	if a.NoRoPE {
		return nil
	}
	if err := p.B.RoPEBackward(dq, dq, a.rope(p, a.NH)); err != nil {
		return wrap(a.Name+" rope q", err)
	}
	if err := p.B.RoPEBackward(dk, dk, a.rope(p, a.NKV)); err != nil {
		return wrap(a.Name+" rope k", err)
	}
	return nil
}

// attendSlots is the attention of a pass over a slotted KV cache (Pass.Slots): the prefill
// pass attends over its own keys and then copies them into the slots; a decoding step appends
// and attends in one DecodeAttention. It leaves the attention output (with the sinks applied)
// in the cache's out.
func (a *Attention) attendSlots(p *Pass) error {
	c, s := &a.c, p.Slots
	if a.Layer >= len(s.Layers) || s.Layers[a.Layer] == nil {
		return fmt.Errorf("nn: %s: no slotted KV cache for layer %d", a.Name, a.Layer)
	}
	kv := s.Layers[a.Layer]
	var err error
	if c.out, err = p.out(p.N, a.NH*a.HD); err != nil {
		return wrap(a.Name, err)
	}
	prefill := !s.Fill.IsNil()
	if prefill || !a.Sinks.IsNil() {
		if c.lse, err = p.outF32(p.N, a.NH); err != nil {
			return wrap(a.Name, err)
		}
	}
	if prefill {
		if err = p.B.Attention(backend.AttentionArgs{
			AttentionShape: a.shape(p), Out: c.out, LSE: c.lse, Q: c.q, K: c.k, V: c.v,
		}); err != nil {
			return wrap(a.Name, err)
		}
		if err = p.B.Embedding(kv.K, c.k, s.Fill); err != nil {
			return wrap(a.Name+" kv slots", err)
		}
		if err = p.B.Embedding(kv.V, c.v, s.Fill); err != nil {
			return wrap(a.Name+" kv slots", err)
		}
	} else {
		dec := p.B.Optional().DecodeAttention
		if dec == nil {
			return fmt.Errorf("nn: %s: a slotted KV cache needs a backend with DecodeAttention", a.Name)
		}
		if err = dec(backend.DecodeAttentionArgs{
			Out: c.out, LSE: c.lse, Q: c.q, K: c.k, V: c.v, CacheK: kv.K, CacheV: kv.V,
			Positions: p.Positions, Cap: s.Cap, NH: a.NH, NKV: a.NKV, HD: a.HD, Scale: a.Scale, Window: a.Window,
		}); err != nil {
			return wrap(a.Name, err)
		}
	}
	if !a.Sinks.IsNil() {
		if err = p.B.AttentionSinks(c.out, c.lse, a.Sinks); err != nil {
			return wrap(a.Name+" sinks", err)
		}
	}
	return nil
}

// values makes the attended values from the projections' outputs (before the q/k norms and
// RoPE): with KEqV a copy of the keys, and with VNorm their per-head norm (the pre-norm values
// kept in vPre when they are the value projection's own output).
func (a *Attention) values(p *Pass) (err error) {
	c := &a.c
	src := c.v
	if a.KEqV {
		src = c.k
	}
	switch {
	case a.VNorm != nil:
		out, rs, err := a.VNorm.Forward(p, src)
		if err != nil {
			return err
		}
		if !a.KEqV {
			c.vPre = c.v
		}
		c.v, c.vRs = out, rs
	case a.KEqV:
		if c.v, err = p.out(src.Shape()...); err != nil {
			return wrap(a.Name, err)
		}
		if err = p.B.Copy(c.v, src); err != nil {
			return wrap(a.Name+" values", err)
		}
	}
	return nil
}

// valuesBackward turns dv (the gradient of the attended values) into the gradient of the
// value projection's output: through VNorm when set; with KEqV it is added into dkRaw (the
// gradient of the key projection's output) and nil is returned.
func (a *Attention) valuesBackward(p *Pass, dv, dkRaw T) (dvIn T, owned bool, err error) {
	c := &a.c
	dvIn = dv
	if a.VNorm != nil {
		src := c.vPre
		if a.KEqV {
			src = c.kPre
			if a.QNorm == nil || a.NormAfterRoPE {
				return T{}, false, fmt.Errorf("nn: %s: values shared with the keys need the key norm's cached input", a.Name)
			}
		}
		if dvIn, err = p.out(dv.Shape()...); err != nil {
			return T{}, false, wrap(a.Name, err)
		}
		if err = a.VNorm.Backward(p, dvIn, dv, src, c.vRs, false); err != nil {
			_ = free(p.B, &dvIn)
			return T{}, false, err
		}
		owned = true
	}
	if !a.KEqV {
		return dvIn, owned, nil
	}
	err = p.B.Add(dkRaw, dkRaw, dvIn)
	if owned {
		_ = free(p.B, &dvIn)
	}
	return T{}, false, wrap(a.Name+" values", err)
}

// appendCache writes this pass's keys and values into the layer's KV cache and returns views of
// every cached row so far.
func (a *Attention) appendCache(p *Pass) (k, v T, err error) {
	if a.Layer >= len(p.Cache) || p.Cache[a.Layer] == nil {
		return T{}, T{}, fmt.Errorf("nn: %s: no KV cache for layer %d", a.Name, a.Layer)
	}
	kv := p.Cache[a.Layer]
	lo, hi := p.CacheLen, p.CacheLen+p.N
	if hi > kv.K.Dim(0) {
		return T{}, T{}, fmt.Errorf("nn: %s: KV cache holds %d tokens, %d needed; allocate a longer cache", a.Name, kv.K.Dim(0), hi)
	}
	for _, pair := range [][2]T{{kv.K, a.c.k}, {kv.V, a.c.v}} {
		dst, err := pair[0].Rows(lo, hi)
		if err != nil {
			return T{}, T{}, wrap(a.Name, err)
		}
		if err := p.B.Copy(dst, pair[1]); err != nil {
			return T{}, T{}, wrap(a.Name+" kv cache", err)
		}
	}
	if !p.CacheGather.IsNil() {
		if hi, err = a.gatherCache(p, kv, hi); err != nil {
			return T{}, T{}, err
		}
	}
	if k, err = kv.K.Rows(0, hi); err != nil {
		return T{}, T{}, wrap(a.Name, err)
	}
	if v, err = kv.V.Rows(0, hi); err != nil {
		return T{}, T{}, wrap(a.Name, err)
	}
	return k, v, nil
}

// gatherCache rewrites the first hi cached rows as rows CacheGather of them (in the spare
// buffers, which then become K and V) and returns the new row count.
func (a *Attention) gatherCache(p *Pass, kv *KVCache, hi int) (int, error) {
	nk := p.CacheGather.Numel()
	if kv.K2.IsNil() || kv.V2.IsNil() {
		return 0, fmt.Errorf("nn: %s: a gathered KV cache needs spare buffers K2 and V2", a.Name)
	}
	if nk > kv.K2.Dim(0) {
		return 0, fmt.Errorf("nn: %s: KV cache holds %d tokens, the gather writes %d", a.Name, kv.K2.Dim(0), nk)
	}
	for _, pair := range [][2]T{{kv.K2, kv.K}, {kv.V2, kv.V}} {
		src, err := pair[1].Rows(0, hi)
		if err != nil {
			return 0, wrap(a.Name, err)
		}
		dst, err := pair[0].Rows(0, nk)
		if err != nil {
			return 0, wrap(a.Name, err)
		}
		if err := p.B.Embedding(dst, src, p.CacheGather); err != nil {
			return 0, wrap(a.Name+" kv cache gather", err)
		}
	}
	kv.K, kv.K2 = kv.K2, kv.K
	kv.V, kv.V2 = kv.V2, kv.V
	return nk, nil
}

// Backward returns a new dx [N,C] (=) for dy [N,C] and accumulates every parameter gradient
// (+=); it releases the cache.
func (a *Attention) Backward(p *Pass, dy T) (dx T, err error) {
	if a.Latent != nil {
		return a.Latent.Backward(p, dy)
	}
	if a.Linear != nil {
		return a.Linear.Backward(p, dy)
	}
	if a.Conv != nil {
		return a.Conv.Backward(p, dy)
	}
	if a.MoA != nil {
		return a.MoA.Backward(p, dy)
	}
	if a.KVIn != nil {
		return a.backwardShared(p, dy)
	}
	if !a.c.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", a.Name)
	}
	c := &a.c
	defer a.Release(p)
	var dattn, dq, dk, dv, dqPre, dkPre T
	defer func() { _ = free(p.B, &dattn, &dq, &dk, &dv, &dqPre, &dkPre) }()
	if dattn, err = p.out(p.N, a.NH*a.HD); err != nil {
		return T{}, wrap(a.Name, err)
	}
	var dgate T
	defer func() { _ = free(p.B, &dgate) }()
	if a.OutGate {
		if err = a.O.Backward(p, dattn, dy, c.gated, false); err != nil {
			return T{}, err
		}
		dgated := dattn
		dattn, dgate, err = a.gateBackward(p, dgated, c.out, c.gate)
		_ = free(p.B, &dgated)
		if err != nil {
			return T{}, err
		}
	} else if a.HeadGate != nil {
		if err = a.O.Backward(p, dattn, dy, c.gated, false); err != nil {
			return T{}, err
		}
		dgated := dattn
		dattn, dgate, err = a.headGateBackward(p, dgated, c.out, c.gate)
		_ = free(p.B, &dgated)
		if err != nil {
			return T{}, err
		}
	} else if err = a.O.Backward(p, dattn, dy, c.out, false); err != nil {
		return T{}, err
	}
	if c.q.IsNil() {
		if err = a.remakeQK(p); err != nil {
			return T{}, err
		}
	}
	if dq, err = p.out(c.q.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if dk, err = p.out(c.k.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if dv, err = p.out(c.v.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if !a.Sinks.IsNil() && !a.GSinks.IsNil() {
		if err = p.B.AttentionSinksBackward(a.GSinks, dattn, c.out, c.lse, a.Sinks); err != nil {
			return T{}, wrap(a.Name+" sinks", err)
		}
	}
	if err = p.B.AttentionBackward(backend.AttentionBackwardArgs{
		AttentionShape: a.shape(p), DQ: dq, DK: dk, DV: dv, DOut: dattn,
		Q: c.q, K: c.k, V: c.v, Out: c.out, LSE: c.lse,
	}); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if a.KVOut != nil {
		if err = a.KVOut.takeGrads(p, dk, dv); err != nil {
			return T{}, wrap(a.Name+" shared keys and values", err)
		}
	}
	if !a.NormAfterRoPE {
		if err = a.ropeBackward(p, dq, dk); err != nil {
			return T{}, err
		}
	}
	if a.QNorm != nil {
		if dqPre, err = p.out(c.qPre.Shape()...); err != nil {
			return T{}, wrap(a.Name, err)
		}
		if dkPre, err = p.out(c.kPre.Shape()...); err != nil {
			return T{}, wrap(a.Name, err)
		}
		if err = a.QNorm.Backward(p, dqPre, dq, c.qPre, c.qRs, false); err != nil {
			return T{}, err
		}
		if err = a.KNorm.Backward(p, dkPre, dk, c.kPre, c.kRs, false); err != nil {
			return T{}, err
		}
		dq, dqPre = dqPre, dq
		dk, dkPre = dkPre, dk
	}
	if a.NormAfterRoPE {
		if err = a.ropeBackward(p, dq, dk); err != nil {
			return T{}, err
		}
	}
	if a.OutGate {
		dqg, err := a.joinGate(p, dq, dgate)
		if err != nil {
			return T{}, err
		}
		_ = free(p.B, &dq)
		dq = dqg
	}
	dvIn, dvOwned, err := a.valuesBackward(p, dv, dk)
	if err != nil {
		return T{}, err
	}
	if dvOwned {
		defer func() { _ = free(p.B, &dvIn) }()
	}
	if dx, err = p.out(c.x.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.Q.Backward(p, dx, dq, c.x, false); err == nil {
		if err = a.K.Backward(p, dx, dk, c.x, true); err == nil && !a.KEqV {
			err = a.V.Backward(p, dx, dvIn, c.x, true)
		}
	}
	if err == nil && a.HeadGate != nil {
		err = a.HeadGate.Backward(p, dx, dgate, c.x, true)
	}
	if err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// Release frees the cached activations without a backward (evaluation, abandoned steps).
func (a *Attention) Release(p *Pass) {
	if a.Latent != nil {
		a.Latent.Release(p)
		return
	}
	if a.Linear != nil {
		a.Linear.Release(p)
		return
	}
	if a.Conv != nil {
		a.Conv.Release(p)
		return
	}
	if a.MoA != nil {
		a.MoA.Release(p)
		return
	}
	c := &a.c
	_ = free(p.B, &c.qPre, &c.kPre, &c.qRs, &c.kRs, &c.q, &c.k, &c.v, &c.vPre, &c.vRs, &c.out, &c.lse, &c.gate, &c.gated)
	*c = attnCache{}
}
