package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// MLA is multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash), as transformers'
// DeepseekV3Attention computes it. Letters: NH heads, Nope and R the unrotated and rotated
// dims of each query/key head (QK = Nope + R), V the value head width, r the compressed
// key/value rank (KVRank), qr the query rank (QRank), D = max(QK, V) the width the attention
// op runs at.
//
//	q   = QB(QANorm(QA(x)))  or  Q(x)          [N, NH*QK]   each head: nope | rope
//	kva = KVA(x)                               [N, r+R]     compressed kv | one rotary key
//	kvb = KVB(KVANorm(kva[:, :r]))             [N, NH*(Nope+V)]  each head: k_nope | v
//	Q_h = rope(q_h[Nope:]) | q_h[:Nope]        K_h = rope(kva[:, r:]) | k_nope_h
//	V_h = v_h                                  (each padded with zeros to D)
//	out = O(causal softmax(Scale * Q K^T) V)   [N, C]
//
// The attention op sees each head with its rotary dims first: scores do not depend on the
// order of the dims inside a head as long as queries and keys share it, and the RoPE op
// rotates the first R dims of a head. The one rotary key is rotated once and broadcast to
// every head. With Interleaved the rotary dims are rotated in pairs (2i, 2i+1): transformers
// moves such dims to the rotate-half layout before rotating them, which permutes the rotated
// query and key dims alike and so leaves the scores equal. When V != QK the narrower of the
// query/key and value heads is padded with zero columns to D (the attention op takes one head
// width); zero key dims add nothing to the scores and zero value dims give zero outputs, which
// are dropped.
//
// The column moves run on the backend's CopyColumns op, so every backend that has the ops
// computes the block. Cached for backward (keep): x (not owned), the query path's activations
// (qa, its normed form and rstd) or none for Q, the compressed kv before and after its norm
// with rstd, Q, K, V and the attention output at width D with its log-sum-exp, and the
// attention output at width V when it differs.
type MLA struct {
	Name string
	// Q is q_proj [NH*QK, C] when QRank is 0; QA [qr, C], QANorm [qr] and QB [NH*QK, qr]
	// otherwise.
	Q, QA, QB Linear
	QANorm    RMSNorm
	// KVA is kv_a_proj_with_mqa [r+R, C], KVANorm [r] and KVB kv_b_proj [NH*(Nope+V), r].
	KVA, KVB Linear
	KVANorm  RMSNorm
	// O is o_proj [C, NH*V].
	O Linear

	NH, Nope, Rope, V, KVRank, QRank int
	// Interleaved rotates the pairs (2i, 2i+1) of the rotary dims (rope_interleave).
	Interleaved bool
	// Scale is the softmax scale; 0 means 1/sqrt(QK).
	Scale float32
	// Layer is the index into Pass.Cache: decoding caches the heads' keys and values at width
	// D ([MaxLen, NH*D] each), as the attention op reads them.
	Layer int

	c mlaCache
}

type mlaCache struct {
	x                      T
	qa, qan, qars          T
	ckv, ckvn, ckvrs       T
	q, k, v, attn, lse, vo T // attention at width D; vo the output at width V (when V != D)
	live                   bool
}

// qk is a query/key head's width; d the width the attention op runs at.
func (a *MLA) qk() int { return a.Nope + a.Rope }
func (a *MLA) d() int  { return max(a.qk(), a.V) }

func (a *MLA) shape(p *Pass) backend.AttentionShape {
	scale := a.Scale
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(a.qk())))
	}
	return backend.AttentionShape{CuSeqlens: p.CuSeqlens, CuSeqlensK: p.CuSeqlensK, MaxSeqLen: p.MaxSeqLen,
		NH: a.NH, NKV: a.NH, HD: a.d(), Scale: scale}
}

func (a *MLA) rope(p *Pass, heads, hd int) backend.RoPEArgs {
	return backend.RoPEArgs{Positions: p.Positions, InvFreq: p.InvFreq, Heads: heads, HeadDim: hd,
		RotaryDim: a.Rope, AttentionScaling: p.AttentionScaling, Interleaved: a.Interleaved}
}

// cols copies Width columns of each of Groups groups from src to dst.
func (a *MLA) cols(p *Pass, what string, dst, src T, groups, width, dOff, dStride, sOff, sStride int, acc bool) error {
	return wrap(a.Name+" "+what, p.B.CopyColumns(backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: groups, Width: width,
		DstOffset: dOff, DstStride: dStride, SrcOffset: sOff, SrcStride: sStride, Accumulate: acc}))
}

// Forward returns a new y [N,C] for x [N,C] (the normed hidden states). When keep is true the
// activations are cached for Backward; otherwise they are released before returning.
func (a *MLA) Forward(p *Pass, x T, keep bool) (y T, err error) {
	if a.c.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", a.Name)
	}
	c := &a.c
	c.x, c.live = x, true
	var q, kva, kr, kvb T
	defer func() {
		_ = free(p.B, &q, &kva, &kr, &kvb)
		if err != nil || !keep {
			a.Release(p)
		}
	}()
	n, nh, qk, d, r, rope, nope := x.Dim(0), a.NH, a.qk(), a.d(), a.KVRank, a.Rope, a.Nope
	if a.QRank > 0 {
		if c.qa, err = a.QA.Forward(p, x); err != nil {
			return T{}, err
		}
		if c.qan, c.qars, err = a.QANorm.Forward(p, c.qa); err != nil {
			return T{}, err
		}
		q, err = a.QB.Forward(p, c.qan)
	} else {
		q, err = a.Q.Forward(p, x)
	}
	if err != nil {
		return T{}, err
	}
	if kva, err = a.KVA.Forward(p, x); err != nil {
		return T{}, err
	}
	if c.ckv, err = p.out(n, r); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if kr, err = p.out(n, rope); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.cols(p, "kv split", c.ckv, kva, 1, r, 0, 0, 0, 0, false); err != nil {
		return T{}, err
	}
	if err = a.cols(p, "kv split", kr, kva, 1, rope, 0, 0, r, 0, false); err != nil {
		return T{}, err
	}
	if c.ckvn, c.ckvrs, err = a.KVANorm.Forward(p, c.ckv); err != nil {
		return T{}, err
	}
	if kvb, err = a.KVB.Forward(p, c.ckvn); err != nil {
		return T{}, err
	}
	// Heads at width D, rotary dims first; padding columns stay zero.
	alloc := func(pad bool) (T, error) {
		if pad {
			return p.alloc(n, nh*d)
		}
		return p.out(n, nh*d)
	}
	if c.q, err = alloc(d > qk); err == nil {
		if c.k, err = alloc(d > qk); err == nil {
			c.v, err = alloc(d > a.V)
		}
	}
	if err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.cols(p, "q rope", c.q, q, nh, rope, 0, d, nope, qk, false); err != nil {
		return T{}, err
	}
	if nope > 0 {
		if err = a.cols(p, "q nope", c.q, q, nh, nope, rope, d, 0, qk, false); err != nil {
			return T{}, err
		}
		if err = a.cols(p, "k nope", c.k, kvb, nh, nope, rope, d, 0, nope+a.V, false); err != nil {
			return T{}, err
		}
	}
	if err = a.cols(p, "v", c.v, kvb, nh, a.V, 0, d, nope, nope+a.V, false); err != nil {
		return T{}, err
	}
	if err = p.B.RoPE(kr, kr, a.rope(p, 1, rope)); err != nil {
		return T{}, wrap(a.Name+" rope k", err)
	}
	if err = a.cols(p, "k rope", c.k, kr, nh, rope, 0, d, 0, 0, false); err != nil {
		return T{}, err
	}
	if err = p.B.RoPE(c.q, c.q, a.rope(p, nh, d)); err != nil {
		return T{}, wrap(a.Name+" rope q", err)
	}
	if c.attn, err = p.out(n, nh*d); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if c.lse, err = p.outF32(n, nh); err != nil {
		return T{}, wrap(a.Name, err)
	}
	k, v := c.k, c.v
	if p.Slots != nil {
		return T{}, fmt.Errorf("nn: %s: latent attention has no slotted KV cache; decode with Pass.Cache", a.Name)
	}
	if p.Cache != nil {
		// The KV cache takes the heads as the attention op reads them (Attention's own
		// bookkeeping of the cache rows, on this layer's keys and values).
		kc := &Attention{Name: a.Name, Layer: a.Layer}
		kc.c.k, kc.c.v = c.k, c.v
		if k, v, err = kc.appendCache(p); err != nil {
			return T{}, err
		}
	}
	if err = p.B.Attention(backend.AttentionArgs{AttentionShape: a.shape(p), Out: c.attn, LSE: c.lse, Q: c.q, K: k, V: v}); err != nil {
		return T{}, wrap(a.Name, err)
	}
	out := c.attn
	if d != a.V {
		if c.vo, err = p.out(n, nh*a.V); err != nil {
			return T{}, wrap(a.Name, err)
		}
		if err = a.cols(p, "output", c.vo, c.attn, nh, a.V, 0, a.V, 0, d, false); err != nil {
			return T{}, err
		}
		out = c.vo
	}
	return a.O.Forward(p, out)
}

// Backward returns a new dx [N,C] (=) for dy [N,C] and accumulates every parameter gradient
// (+=); it releases the cache.
func (a *MLA) Backward(p *Pass, dy T) (dx T, err error) {
	if !a.c.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", a.Name)
	}
	c := &a.c
	defer a.Release(p)
	n, nh, qk, d, r, rope, nope := c.x.Dim(0), a.NH, a.qk(), a.d(), a.KVRank, a.Rope, a.Nope
	var dout, dattn, dq, dk, dv, dqh, dkvb, dkr, dckvn, dckv, dkva, dqan, dqa T
	defer func() {
		_ = free(p.B, &dout, &dattn, &dq, &dk, &dv, &dqh, &dkvb, &dkr, &dckvn, &dckv, &dkva, &dqan, &dqa)
		if err != nil {
			_ = free(p.B, &dx)
		}
	}()
	if dout, err = p.out(n, nh*a.V); err != nil {
		return T{}, wrap(a.Name, err)
	}
	out := c.attn
	if d != a.V {
		out = c.vo
	}
	if err = a.O.Backward(p, dout, dy, out, false); err != nil {
		return T{}, err
	}
	dattn = dout
	if d != a.V {
		if dattn, err = p.alloc(n, nh*d); err != nil {
			return T{}, wrap(a.Name, err)
		}
		if err = a.cols(p, "output", dattn, dout, nh, a.V, 0, d, 0, a.V, false); err != nil {
			return T{}, err
		}
	} else {
		dout = T{} // dattn owns it now
	}
	if dq, err = p.out(n, nh*d); err == nil {
		if dk, err = p.out(n, nh*d); err == nil {
			dv, err = p.out(n, nh*d)
		}
	}
	if err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = p.B.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: a.shape(p), DQ: dq, DK: dk, DV: dv, DOut: dattn,
		Q: c.q, K: c.k, V: c.v, Out: c.attn, LSE: c.lse}); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = p.B.RoPEBackward(dq, dq, a.rope(p, nh, d)); err != nil {
		return T{}, wrap(a.Name+" rope q", err)
	}
	// Back to the projections' layouts.
	if dqh, err = p.out(n, nh*qk); err == nil {
		if dkvb, err = p.out(n, nh*(nope+a.V)); err == nil {
			dkr, err = p.out(n, rope)
		}
	}
	if err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.cols(p, "q rope", dqh, dq, nh, rope, nope, qk, 0, d, false); err != nil {
		return T{}, err
	}
	if nope > 0 {
		if err = a.cols(p, "q nope", dqh, dq, nh, nope, 0, qk, rope, d, false); err != nil {
			return T{}, err
		}
		if err = a.cols(p, "k nope", dkvb, dk, nh, nope, 0, nope+a.V, rope, d, false); err != nil {
			return T{}, err
		}
	}
	if err = a.cols(p, "v", dkvb, dv, nh, a.V, nope, nope+a.V, 0, d, false); err != nil {
		return T{}, err
	}
	// The broadcast rotary key's gradient is the sum over the heads.
	if err = a.cols(p, "k rope", dkr, dk, nh, rope, 0, 0, 0, d, false); err != nil {
		return T{}, err
	}
	if err = p.B.RoPEBackward(dkr, dkr, a.rope(p, 1, rope)); err != nil {
		return T{}, wrap(a.Name+" rope k", err)
	}
	_ = free(p.B, &dq, &dk, &dv)
	if dckvn, err = p.out(n, r); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.KVB.Backward(p, dckvn, dkvb, c.ckvn, false); err != nil {
		return T{}, err
	}
	if dckv, err = p.out(n, r); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.KVANorm.Backward(p, dckv, dckvn, c.ckv, c.ckvrs, false); err != nil {
		return T{}, err
	}
	if dkva, err = p.out(n, r+rope); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.cols(p, "kv split", dkva, dckv, 1, r, 0, 0, 0, 0, false); err != nil {
		return T{}, err
	}
	if err = a.cols(p, "kv split", dkva, dkr, 1, rope, r, 0, 0, 0, false); err != nil {
		return T{}, err
	}
	if dx, err = p.out(c.x.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.KVA.Backward(p, dx, dkva, c.x, false); err != nil {
		return T{}, err
	}
	if a.QRank == 0 {
		return dx, a.Q.Backward(p, dx, dqh, c.x, true)
	}
	if dqan, err = p.out(c.qan.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.QB.Backward(p, dqan, dqh, c.qan, false); err != nil {
		return T{}, err
	}
	if dqa, err = p.out(c.qa.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.QANorm.Backward(p, dqa, dqan, c.qa, c.qars, false); err != nil {
		return T{}, err
	}
	return dx, a.QA.Backward(p, dx, dqa, c.x, true)
}

// Release frees the cached activations without a backward (evaluation, abandoned steps).
func (a *MLA) Release(p *Pass) {
	c := &a.c
	_ = free(p.B, &c.qa, &c.qan, &c.qars, &c.ckv, &c.ckvn, &c.ckvrs, &c.q, &c.k, &c.v, &c.attn, &c.lse, &c.vo)
	*c = mlaCache{}
}

// Linears returns the block's linear layers that exist (q_proj or q_a_proj and q_b_proj,
// kv_a_proj_with_mqa, kv_b_proj, o_proj), for adapters and quantisation to reach them.
func (a *MLA) Linears() []*Linear {
	if a.QRank > 0 {
		return []*Linear{&a.QA, &a.QB, &a.KVA, &a.KVB, &a.O}
	}
	return []*Linear{&a.Q, &a.KVA, &a.KVB, &a.O}
}
