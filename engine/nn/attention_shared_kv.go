package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// SharedKV carries one layer's keys and values to the later layers that attend over them
// instead of projecting their own (Gemma 4's num_kv_shared_layers). The source layer
// (Attention.KVOut) publishes its rotated, normalised keys and values after each forward;
// each consumer (Attention.KVIn) attends over them with its own queries and adds its key and
// value gradients into DK and DV, which the source's backward (run after the consumers', the
// layers going backward) adds to its own before the norms and RoPE.
//
// Without a KV cache K and V are copies the SharedKV owns (the source's cache may be released
// before the consumers run); with one they are views of the source layer's cache rows. The
// model frees them with Release after each pass.
//
// Under a slotted cache (Pass.Slots) K and V are copies of the pass's new keys and values and
// the consumers attend over the slots of the source layer, Layer: a decoding step hands
// DecodeAttention the same new rows the source appended, which it writes again in place.
type SharedKV struct {
	K, V   T
	DK, DV T
	// Layer is the source layer's index (Attention.Layer), whose slots the consumers read.
	Layer int
	owned bool
}

// publish makes k and v the shared keys and values: views when cached is set, else copies.
// Pending gradients stay (a recomputed forward republishes before its backward takes them).
func (s *SharedKV) publish(p *Pass, k, v T, cached bool) error {
	s.dropKV(p)
	if cached {
		s.K, s.V = k, v
		return nil
	}
	var err error
	if s.K, err = p.out(k.Shape()...); err == nil {
		if s.V, err = p.out(v.Shape()...); err == nil {
			s.owned = true
			if err = p.B.Copy(s.K, k); err == nil {
				err = p.B.Copy(s.V, v)
			}
		}
	}
	if err != nil {
		s.dropKV(p)
	}
	return err
}

// dropKV frees the shared keys and values when owned and forgets them.
func (s *SharedKV) dropKV(p *Pass) {
	if s.owned {
		_ = free(p.B, &s.K, &s.V)
	}
	s.K, s.V, s.owned = T{}, T{}, false
}

// accumulate adds a consumer's dk and dv into DK and DV (allocated zero on first use).
func (s *SharedKV) accumulate(p *Pass, dk, dv T) error {
	for _, g := range []struct {
		acc *T
		d   T
	}{{&s.DK, dk}, {&s.DV, dv}} {
		if g.acc.IsNil() {
			var err error
			if *g.acc, err = p.alloc(g.d.Shape()...); err != nil {
				return err
			}
		}
		if err := p.B.Add(*g.acc, *g.acc, g.d); err != nil {
			return err
		}
	}
	return nil
}

// takeGrads adds DK and DV (when a consumer left any) into dk and dv and frees them.
func (s *SharedKV) takeGrads(p *Pass, dk, dv T) error {
	var err error
	if !s.DK.IsNil() {
		err = p.B.Add(dk, dk, s.DK)
	}
	if err == nil && !s.DV.IsNil() {
		err = p.B.Add(dv, dv, s.DV)
	}
	_ = free(p.B, &s.DK, &s.DV)
	return err
}

// Release frees the shared keys and values (when owned) and any pending gradients.
func (s *SharedKV) Release(p *Pass) {
	s.dropKV(p)
	_ = free(p.B, &s.DK, &s.DV)
}

// forwardShared is Forward for a layer with KVIn: queries of its own (projected, normed,
// rotated) over the source layer's keys and values.
func (a *Attention) forwardShared(p *Pass, x T, keep bool) (y T, err error) {
	if a.c.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", a.Name)
	}
	s := a.KVIn
	if s.K.IsNil() {
		return T{}, fmt.Errorf("nn: %s: the layer whose keys and values it shares has not run in this pass", a.Name)
	}
	if a.NormAfterRoPE || a.OutGate || a.HeadGate != nil || !a.Sinks.IsNil() {
		return T{}, fmt.Errorf("nn: %s: a layer sharing keys and values supports none of q/k norm after RoPE, output gates and sinks", a.Name)
	}
	c := &a.c
	c.x, c.live = x, true
	defer func() {
		if err != nil || !keep {
			a.Release(p)
		}
	}()
	if c.q, err = a.Q.Forward(p, x); err != nil {
		return T{}, err
	}
	if a.QNorm != nil {
		c.qPre = c.q
		c.q = T{}
		if c.q, c.qRs, err = a.QNorm.Forward(p, c.qPre); err != nil {
			return T{}, err
		}
	}
	if !a.NoRoPE {
		if err = p.B.RoPE(c.q, c.q, a.rope(p, a.NH)); err != nil {
			return T{}, wrap(a.Name+" rope q", err)
		}
	}
	c.kAll, c.vAll = s.K, s.V
	if p.Slots != nil {
		if err = a.attendSharedSlots(p); err != nil {
			return T{}, err
		}
		return a.O.Forward(p, c.out)
	}
	if err = a.attend(p); err != nil {
		return T{}, err
	}
	return a.O.Forward(p, c.out)
}

// backwardShared is Backward for a layer with KVIn: the key and value gradients go to the
// source layer through KVIn.
func (a *Attention) backwardShared(p *Pass, dy T) (dx T, err error) {
	if !a.c.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", a.Name)
	}
	c := &a.c
	defer a.Release(p)
	var dattn, dq, dk, dv, dqPre T
	defer func() { _ = free(p.B, &dattn, &dq, &dk, &dv, &dqPre) }()
	if dattn, err = p.out(p.N, a.NH*a.HD); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.O.Backward(p, dattn, dy, c.out, false); err != nil {
		return T{}, err
	}
	if dq, err = p.out(c.q.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if dk, err = p.out(c.kAll.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if dv, err = p.out(c.vAll.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = p.B.AttentionBackward(backend.AttentionBackwardArgs{
		AttentionShape: a.shape(p), DQ: dq, DK: dk, DV: dv, DOut: dattn,
		Q: c.q, K: c.kAll, V: c.vAll, Out: c.out, LSE: c.lse,
	}); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.KVIn.accumulate(p, dk, dv); err != nil {
		return T{}, wrap(a.Name+" shared keys and values", err)
	}
	if !a.NoRoPE {
		if err = p.B.RoPEBackward(dq, dq, a.rope(p, a.NH)); err != nil {
			return T{}, wrap(a.Name+" rope q", err)
		}
	}
	if a.QNorm != nil {
		if dqPre, err = p.out(c.qPre.Shape()...); err != nil {
			return T{}, wrap(a.Name, err)
		}
		if err = a.QNorm.Backward(p, dqPre, dq, c.qPre, c.qRs, false); err != nil {
			return T{}, err
		}
		dq, dqPre = dqPre, dq
	}
	if dx, err = p.out(c.x.Shape()...); err != nil {
		return T{}, wrap(a.Name, err)
	}
	if err = a.Q.Backward(p, dx, dq, c.x, false); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// attendSharedSlots is the attention of a KVIn layer over a slotted cache: the prefill attends
// over the pass's shared keys, a decoding step over the source layer's slots (DecodeAttention
// rewrites the new rows the source appended with the same values).
func (a *Attention) attendSharedSlots(p *Pass) error {
	c, s, sl := &a.c, a.KVIn, p.Slots
	var err error
	if c.out, err = p.out(p.N, a.NH*a.HD); err != nil {
		return wrap(a.Name, err)
	}
	if !sl.Fill.IsNil() {
		if c.lse, err = p.outF32(p.N, a.NH); err != nil {
			return wrap(a.Name, err)
		}
		return wrap(a.Name, p.B.Attention(backend.AttentionArgs{
			AttentionShape: a.shape(p), Out: c.out, LSE: c.lse, Q: c.q, K: s.K, V: s.V,
		}))
	}
	if s.Layer >= len(sl.Layers) || sl.Layers[s.Layer] == nil {
		return fmt.Errorf("nn: %s: no slotted KV cache for layer %d, whose keys and values it shares", a.Name, s.Layer)
	}
	dec := p.B.Optional().DecodeAttention
	if dec == nil {
		return fmt.Errorf("nn: %s: a slotted KV cache needs a backend with DecodeAttention", a.Name)
	}
	kv := sl.Layers[s.Layer]
	return wrap(a.Name, dec(backend.DecodeAttentionArgs{
		Out: c.out, Q: c.q, K: s.K, V: s.V, CacheK: kv.K, CacheV: kv.V,
		Positions: p.Positions, Cap: sl.Cap, NH: a.NH, NKV: a.NKV, HD: a.HD, Scale: a.Scale, Window: a.Window,
	}))
}
