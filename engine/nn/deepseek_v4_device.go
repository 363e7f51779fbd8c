package nn

import (
	"errors"
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// DSV4Device runs DeepSeek-V4's decoder through a backend's ops (the DeepSeek-V4 ones of
// backend.Optional.DSV4 beside the common Linear, RMSNorm, RoPE, Embedding and CrossEntropy),
// with the parameters where the model keeps them. It computes what DSV4 computes on the host
// tape, in the activation dtype with fp32 arithmetic, and differentiates it the same way: each
// op records its backward on a DevTape, which Backward runs in reverse.
//
// What stays on the host: the choices, which are discrete and small: the routers' top-k
// (scores [T,E] read back, torch's tie order), the hash layers' table lookups, the indexer's
// top-k over its device scores, and the routing weights (T·K values) and their gradient; so a
// routed layer reads back its scores once forward and its weight gradients once backward.
type DSV4Device struct {
	Cfg DSV4Config
	B   backend.Backend
	// Param returns a parameter by transformers' name and its gradient (the zero tensor when
	// gradients are off).
	Param   func(name string) (w, g T, err error)
	Tid2Eid [][]int
	// DType is the activation dtype (the parameters').
	DType tensor.DType

	ops  *backend.DSV4Ops
	ones map[int]T
	inv  map[bool]T // rotary tables: true for the sliding layers'
}

// DVar is one value of a DevTape: a device tensor [R, C] and, once a backward reaches it, its
// gradient (same shape and dtype).
type DVar struct {
	V, G T
	// leaf: V and G are the caller's (a parameter and its gradient), never freed here.
	leaf bool
}

// DevTape records the backward of each op of a DSV4Device pass. With train false nothing is
// recorded (a forward for log-probabilities).
type DevTape struct {
	b     backend.Backend
	train bool
	back  []func() error
	owned []T
	// freed marks the owned tensors released before Close: the values (and gradients) of an
	// op whose backward has run, which nothing reads again.
	freed map[tensor.Buffer]bool
	own   map[tensor.Buffer]bool
}

// NewDevTape returns an empty tape over b.
func NewDevTape(b backend.Backend, train bool) *DevTape { return &DevTape{b: b, train: train} }

func (t *DevTape) rec(f func() error) {
	if t.train {
		t.back = append(t.back, f)
	}
}

// recFree records f, after which the values outs (and their gradients) and the caches extra
// are released: the op that made them is the first in forward order to use them, so once its
// backward has run every reader's has.
func (t *DevTape) recFree(f func() error, outs []*DVar, extra ...T) {
	t.rec(func() error {
		if err := f(); err != nil {
			return err
		}
		var errs []error
		for _, o := range outs {
			if o == nil || o.leaf {
				continue
			}
			errs = append(errs, t.release(o.V), t.release(o.G))
			o.V, o.G = T{}, T{}
		}
		for _, x := range extra {
			errs = append(errs, t.release(x))
		}
		return errors.Join(errs...)
	})
}

// release frees x now if the tape owns it and has not freed it.
func (t *DevTape) release(x T) error {
	if x.IsNil() || x.Offset() != 0 {
		return nil
	}
	b := x.Buffer()
	if t.freed[b] {
		return nil
	}
	if !t.own[b] {
		return nil
	}
	if t.freed == nil {
		t.freed = map[tensor.Buffer]bool{}
	}
	t.freed[b] = true
	return t.b.Free(x)
}

// tmp returns a zero-filled scratch tensor the caller frees (not kept by the tape).
func (t *DevTape) tmp(dt tensor.DType, shape ...int) (T, error) { return t.b.Alloc(dt, shape...) }

// Backward runs the recorded backwards in reverse order (seed the outputs' gradients first).
func (t *DevTape) Backward() error {
	for i := len(t.back) - 1; i >= 0; i-- {
		if err := t.back[i](); err != nil {
			return err
		}
	}
	t.back = nil
	return nil
}

// Close frees every tensor the tape allocated.
func (t *DevTape) Close() error {
	var errs []error
	for _, x := range t.owned {
		if !t.freed[x.Buffer()] {
			errs = append(errs, t.b.Free(x))
		}
	}
	t.owned, t.back, t.freed, t.own = nil, nil, nil, nil
	return errors.Join(errs...)
}

// alloc returns a zero-filled tensor the tape owns.
func (t *DevTape) alloc(dt tensor.DType, shape ...int) (T, error) {
	x, err := t.b.Alloc(dt, shape...)
	if err != nil {
		return T{}, err
	}
	t.Own(x)
	return x, nil
}

// val returns a new value of the shape with an uninitialised (zeroed) tensor.
func (t *DevTape) val(dt tensor.DType, shape ...int) (*DVar, error) {
	x, err := t.alloc(dt, shape...)
	if err != nil {
		return nil, err
	}
	return &DVar{V: x}, nil
}

// grad returns v's gradient, allocating it (zeros) on first use.
func (t *DevTape) grad(v *DVar) (T, error) {
	if v.G.IsNil() {
		if v.leaf {
			return T{}, nil // a frozen parameter
		}
		g, err := t.alloc(v.V.DType(), v.V.Shape()...)
		if err != nil {
			return T{}, err
		}
		v.G = g
	}
	return v.G, nil
}

// Leaf wraps a parameter and its gradient (G nil: no gradient).
func (t *DevTape) Leaf(v, g T) *DVar { return &DVar{V: v, G: g, leaf: true} }

// dsv4Err names the op of a failed step.
func dsv4Err(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("nn: DSV4 device %s: %w", what, err)
}

// NewDSV4Device checks that b has DeepSeek-V4's ops and returns the decoder.
func NewDSV4Device(cfg DSV4Config, b backend.Backend, dt tensor.DType, param func(string) (T, T, error), tid [][]int) (*DSV4Device, error) {
	ops := b.Optional().DSV4
	if ops == nil {
		return nil, fmt.Errorf("nn: the %s backend has no DeepSeek-V4 ops (backend.Optional.DSV4)", b.Name())
	}
	if cfg.HC > 8 {
		return nil, fmt.Errorf("nn: DSV4 device: %d hyper-connection streams; the device ops take at most 8", cfg.HC)
	}
	return &DSV4Device{Cfg: cfg, B: b, Param: param, Tid2Eid: tid, DType: dt, ops: ops, ones: map[int]T{}, inv: map[bool]T{}}, nil
}

// Close frees the decoder's constant tensors.
func (m *DSV4Device) Close() error {
	var errs []error
	for _, x := range m.ones {
		errs = append(errs, m.B.Free(x))
	}
	for _, x := range m.inv {
		errs = append(errs, m.B.Free(x))
	}
	m.ones, m.inv = map[int]T{}, map[bool]T{}
	return errors.Join(errs...)
}

func (m *DSV4Device) p(t *DevTape, name string) (*DVar, error) {
	w, g, err := m.Param(name)
	if err != nil {
		return nil, err
	}
	if w.IsNil() {
		return nil, fmt.Errorf("nn: DSV4 device: no parameter %s", name)
	}
	return t.Leaf(w, g), nil
}

// onesOf returns a weight of n ones (for the weightless RMS norms).
func (m *DSV4Device) onesOf(n int) (T, error) {
	if w, ok := m.ones[n]; ok {
		return w, nil
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	w, err := backend.FromFloat32(m.B, v, m.DType, n)
	if err != nil {
		return T{}, err
	}
	m.ones[n] = w
	return w, nil
}

// invFreq returns the rotary table of the sliding (main) or compressed layers.
func (m *DSV4Device) invFreq(main bool) (T, error) {
	if x, ok := m.inv[main]; ok {
		return x, nil
	}
	src := m.Cfg.CompressInvFreq
	if main {
		src = m.Cfg.MainInvFreq
	}
	v := make([]float32, len(src))
	for i, f := range src {
		v[i] = float32(f)
	}
	x, err := backend.FromFloat32(m.B, v, tensor.F32, len(v))
	if err != nil {
		return T{}, err
	}
	m.inv[main] = x
	return x, nil
}

// Hidden runs one document (positions 0..len(ids)-1) and returns its final hidden states
// [T, C] (after the final norm), ready for the LM head.
func (m *DSV4Device) Hidden(t *DevTape, ids []int) (*DVar, error) {
	c := &m.Cfg
	T_ := len(ids)
	ids32 := make([]int32, T_)
	pos := make([]int32, T_)
	for i, id := range ids {
		if id < 0 || id >= c.Vocab {
			return nil, fmt.Errorf("nn: DSV4: token id %d outside the vocabulary of %d", id, c.Vocab)
		}
		ids32[i], pos[i] = int32(id), int32(i)
	}
	idsT, err := backend.FromInt32(m.B, ids32, T_)
	if err != nil {
		return nil, err
	}
	t.Own(idsT)
	posT, err := backend.FromInt32(m.B, pos, T_)
	if err != nil {
		return nil, err
	}
	t.Own(posT)
	emb, err := m.p(t, "model.embed_tokens.weight")
	if err != nil {
		return nil, err
	}
	e, err := t.embed(emb, idsT)
	if err != nil {
		return nil, dsv4Err("embedding", err)
	}
	x, err := t.repeat(e, c.HC)
	if err != nil {
		return nil, dsv4Err("streams", err)
	}
	for i := range c.LayerTypes {
		if x, err = m.layer(t, i, x, ids, posT); err != nil {
			return nil, err
		}
	}
	flat, err := m.rmsnorm(t, x, c.HC*c.Hidden, nil)
	if err != nil {
		return nil, dsv4Err("head norm", err)
	}
	fn, err := m.p(t, "model.hc_head.hc_fn")
	if err != nil {
		return nil, err
	}
	z, err := t.linear(flat, fn, nil)
	if err != nil {
		return nil, dsv4Err("head mix", err)
	}
	pre, _, _, err := m.hyperWeights(t, z, "model.hc_head.hc_", true)
	if err != nil {
		return nil, dsv4Err("head mix", err)
	}
	y, err := m.collapse(t, pre, x)
	if err != nil {
		return nil, dsv4Err("head collapse", err)
	}
	nw, err := m.p(t, "model.norm.weight")
	if err != nil {
		return nil, err
	}
	return m.rmsnorm(t, y, c.Hidden, nw)
}

// layer is decoder layer i on the streams x [T, HC*C].
func (m *DSV4Device) layer(t *DevTape, i int, x *DVar, ids []int, pos T) (*DVar, error) {
	c := &m.Cfg
	pre := fmt.Sprintf("model.layers.%d.", i)
	coll, post, comb, err := m.hyper(t, pre+"attn_hc", x)
	if err != nil {
		return nil, dsv4Err(fmt.Sprintf("layer %d attention hyper-connection", i), err)
	}
	nw, err := m.p(t, pre+"input_layernorm.weight")
	if err != nil {
		return nil, err
	}
	h, err := m.rmsnorm(t, coll, c.Hidden, nw)
	if err != nil {
		return nil, dsv4Err(fmt.Sprintf("layer %d norm", i), err)
	}
	a, err := m.attention(t, i, h, pos)
	if err != nil {
		return nil, err
	}
	if x, err = m.expand(t, post, a, comb, x); err != nil {
		return nil, dsv4Err(fmt.Sprintf("layer %d expand", i), err)
	}
	if coll, post, comb, err = m.hyper(t, pre+"ffn_hc", x); err != nil {
		return nil, dsv4Err(fmt.Sprintf("layer %d feed-forward hyper-connection", i), err)
	}
	if nw, err = m.p(t, pre+"post_attention_layernorm.weight"); err != nil {
		return nil, err
	}
	if h, err = m.rmsnorm(t, coll, c.Hidden, nw); err != nil {
		return nil, dsv4Err(fmt.Sprintf("layer %d norm", i), err)
	}
	f, err := m.moe(t, i, h, ids)
	if err != nil {
		return nil, err
	}
	x, err = m.expand(t, post, f, comb, x)
	return x, dsv4Err(fmt.Sprintf("layer %d expand", i), err)
}

// hyper computes a hyper-connection's collapsed input, expansion weights and mixing matrices.
func (m *DSV4Device) hyper(t *DevTape, name string, x *DVar) (coll, post, comb *DVar, err error) {
	c := &m.Cfg
	flat, err := m.rmsnorm(t, x, c.HC*c.Hidden, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	fn, err := m.p(t, name+".fn")
	if err != nil {
		return nil, nil, nil, err
	}
	z, err := t.linear(flat, fn, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	pre, post, comb, err := m.hyperWeights(t, z, name+".", false)
	if err != nil {
		return nil, nil, nil, err
	}
	coll, err = m.collapse(t, pre, x)
	return coll, post, comb, err
}

// hyperWeights runs HyperWeights on the mix logits z with the parameters prefix+scale and
// prefix+base.
func (m *DSV4Device) hyperWeights(t *DevTape, z *DVar, prefix string, head bool) (pre, post, comb *DVar, err error) {
	c := &m.Cfg
	n, N := c.HC, z.V.Dim(0)
	sc, err := m.p(t, prefix+"scale")
	if err != nil {
		return nil, nil, nil, err
	}
	bs, err := m.p(t, prefix+"base")
	if err != nil {
		return nil, nil, nil, err
	}
	if pre, err = t.val(tensor.F32, N, n); err != nil {
		return
	}
	a := backend.HyperWeightsArgs{Z: z.V, Scale: sc.V, Base: bs.V, Streams: n, Iters: c.HCIters, Eps: float32(c.HCEps), Head: head, Pre: pre.V}
	if !head {
		if post, err = t.val(tensor.F32, N, n); err != nil {
			return
		}
		if comb, err = t.val(tensor.F32, N, n*n); err != nil {
			return
		}
		a.Post, a.Comb = post.V, comb.V
	}
	if err = m.ops.HyperWeights(a); err != nil {
		return
	}
	t.recFree(func() error {
		ba := backend.HyperWeightsBackwardArgs{HyperWeightsArgs: a}
		var err error
		outs := []*DVar{pre}
		if !head {
			outs = append(outs, post, comb)
		}
		gs := make([]T, len(outs))
		for i, o := range outs {
			if gs[i], err = t.grad(o); err != nil {
				return err
			}
		}
		ba.DPre = gs[0]
		if !head {
			ba.DPost, ba.DComb = gs[1], gs[2]
		}
		if ba.DZ, err = t.grad(z); err != nil {
			return err
		}
		if ba.GScale, err = t.grad(sc); err != nil {
			return err
		}
		if ba.GBase, err = t.grad(bs); err != nil {
			return err
		}
		if ba.GScale.IsNil() || ba.GBase.IsNil() {
			// Frozen mix parameters: their gradients land in scratch.
			if ba.GScale, err = t.alloc(sc.V.DType(), sc.V.Shape()...); err != nil {
				return err
			}
			if ba.GBase, err = t.alloc(bs.V.DType(), bs.V.Shape()...); err != nil {
				return err
			}
		}
		return dsv4Err("hyper-connection backward", m.ops.HyperWeightsBackward(ba))
	}, []*DVar{pre, post, comb})
	return pre, post, comb, nil
}

// collapse is StreamCollapse of the streams x [T, n*C] by w [T, n].
func (m *DSV4Device) collapse(t *DevTape, w, x *DVar) (*DVar, error) {
	C := x.V.Dim(1) / w.V.Dim(1)
	y, err := t.val(x.V.DType(), x.V.Dim(0), C)
	if err != nil {
		return nil, err
	}
	if err := m.ops.StreamCollapse(y.V, w.V, x.V); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gs, err := t.grads(w, x, y)
		if err != nil {
			return err
		}
		gw, gx, gy := gs[0], gs[1], gs[2]
		return dsv4Err("stream collapse backward", m.ops.StreamCollapseBackward(gw, gx, gy, w.V, x.V))
	}, []*DVar{y})
	return y, nil
}

// expand is StreamExpand: the block output f written back into the streams x.
func (m *DSV4Device) expand(t *DevTape, post, f, comb, x *DVar) (*DVar, error) {
	y, err := t.val(x.V.DType(), x.V.Shape()...)
	if err != nil {
		return nil, err
	}
	a := backend.StreamExpandArgs{Out: y.V, Post: post.V, F: f.V, Comb: comb.V, X: x.V}
	if err := m.ops.StreamExpand(a); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		ba := backend.StreamExpandBackwardArgs{StreamExpandArgs: a}
		gs, err := t.grads(y, post, comb, f, x)
		if err != nil {
			return err
		}
		ba.DOut, ba.DPost, ba.DComb, ba.DF, ba.DX = gs[0], gs[1], gs[2], gs[3], gs[4]
		return dsv4Err("stream expand backward", m.ops.StreamExpandBackward(ba))
	}, []*DVar{y})
	return y, nil
}

// rmsnorm normalises each run of width values of x (w nil: no weight).
func (m *DSV4Device) rmsnorm(t *DevTape, x *DVar, width int, w *DVar) (*DVar, error) {
	rows := x.V.Numel() / width
	xv, err := x.V.Reshape(rows, width)
	if err != nil {
		return nil, err
	}
	var wt T
	if w != nil {
		wt = w.V
	} else if wt, err = m.onesOf(width); err != nil {
		return nil, err
	}
	y, err := t.val(x.V.DType(), x.V.Shape()...)
	if err != nil {
		return nil, err
	}
	rstd, err := t.alloc(tensor.F32, rows)
	if err != nil {
		return nil, err
	}
	yv, _ := y.V.Reshape(rows, width)
	if err := m.B.RMSNorm(yv, rstd, xv, wt, float32(m.Cfg.Eps)); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gs, err := t.grads(x, y)
		if err != nil {
			return err
		}
		gx, gy := gs[0], gs[1]
		a := backend.RMSNormBackwardArgs{DY: mustReshape(gy, rows, width), X: xv, W: wt, RStd: rstd, AccumulateDX: true,
			DX: mustReshape(gx, rows, width)}
		if w != nil {
			if a.DW, err = t.grad(w); err != nil {
				return err
			}
		}
		return dsv4Err("rms norm backward", m.B.RMSNormBackward(a))
	}, []*DVar{y}, rstd)
	return y, nil
}

func mustReshape(x T, shape ...int) T {
	y, err := x.Reshape(shape...)
	if err != nil {
		panic(err)
	}
	return y
}

// embed gathers the rows ids of the embedding.
func (t *DevTape) embed(w *DVar, ids T) (*DVar, error) {
	y, err := t.val(w.V.DType(), ids.Numel(), w.V.Dim(1))
	if err != nil {
		return nil, err
	}
	if err := t.b.Embedding(y.V, w.V, ids); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gw, err := t.grad(w)
		if err != nil || gw.IsNil() {
			return err
		}
		gy, err := t.grad(y)
		if err != nil {
			return err
		}
		return t.b.EmbeddingBackward(gw, gy, ids)
	}, []*DVar{y})
	return y, nil
}

// repeat returns x [R, C] repeated n times along the columns.
func (t *DevTape) repeat(x *DVar, n int) (*DVar, error) {
	R, C := x.V.Dim(0), x.V.Dim(1)
	y, err := t.val(x.V.DType(), R, n*C)
	if err != nil {
		return nil, err
	}
	for k := 0; k < n; k++ {
		if err := t.b.CopyColumns(backend.ColumnCopyArgs{Dst: y.V, Src: x.V, Groups: 1, Width: C, DstOffset: k * C}); err != nil {
			return nil, err
		}
	}
	t.recFree(func() error {
		gs, err := t.grads(x, y)
		if err != nil {
			return err
		}
		gx, gy := gs[0], gs[1]
		for k := 0; k < n; k++ {
			if err := t.b.CopyColumns(backend.ColumnCopyArgs{Dst: gx, Src: gy, Groups: 1, Width: C, SrcOffset: k * C, Accumulate: true}); err != nil {
				return err
			}
		}
		return nil
	}, []*DVar{y})
	return y, nil
}

// linear returns x w^T (+ b).
func (t *DevTape) linear(x, w, b *DVar) (*DVar, error) {
	y, err := t.val(x.V.DType(), x.V.Dim(0), w.V.Dim(0))
	if err != nil {
		return nil, err
	}
	var bias T
	if b != nil {
		bias = b.V
	}
	if err := t.b.Linear(y.V, x.V, w.V, bias); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gy, err := t.grad(y)
		if err != nil {
			return err
		}
		a := backend.LinearBackwardArgs{DY: gy, X: x.V, W: w.V, AccumulateDX: true}
		if a.DX, err = t.grad(x); err != nil {
			return err
		}
		if a.DW, err = t.grad(w); err != nil {
			return err
		}
		if b != nil {
			if a.DB, err = t.grad(b); err != nil {
				return err
			}
		}
		return t.b.LinearBackward(a)
	}, []*DVar{y})
	return y, nil
}

// add returns a + b.
func (t *DevTape) add(a, b *DVar) (*DVar, error) {
	y, err := t.val(a.V.DType(), a.V.Shape()...)
	if err != nil {
		return nil, err
	}
	if err := t.b.Add(y.V, a.V, b.V); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gy, err := t.grad(y)
		if err != nil {
			return err
		}
		for _, v := range []*DVar{a, b} {
			g, err := t.grad(v)
			if err != nil {
				return err
			}
			if err := t.b.Axpy(g, 1, gy); err != nil {
				return err
			}
		}
		return nil
	}, []*DVar{y})
	return y, nil
}

// cols returns the columns [lo, hi) of x.
func (t *DevTape) cols(x *DVar, lo, hi int) (*DVar, error) {
	y, err := t.val(x.V.DType(), x.V.Dim(0), hi-lo)
	if err != nil {
		return nil, err
	}
	if err := t.b.CopyColumns(backend.ColumnCopyArgs{Dst: y.V, Src: x.V, Groups: 1, Width: hi - lo, SrcOffset: lo}); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gs, err := t.grads(x, y)
		if err != nil {
			return err
		}
		gx, gy := gs[0], gs[1]
		return t.b.CopyColumns(backend.ColumnCopyArgs{Dst: gx, Src: gy, Groups: 1, Width: hi - lo, DstOffset: lo, Accumulate: true})
	}, []*DVar{y})
	return y, nil
}

// concatRows stacks a [Ra, C] over b [Rb, C].
func (t *DevTape) concatRows(a, b *DVar) (*DVar, error) {
	ra, rb, C := a.V.Dim(0), b.V.Dim(0), a.V.Dim(1)
	y, err := t.val(a.V.DType(), ra+rb, C)
	if err != nil {
		return nil, err
	}
	top, _ := y.V.Rows(0, ra)
	bot, _ := y.V.Rows(ra, ra+rb)
	if err := t.b.Copy(top, a.V); err != nil {
		return nil, err
	}
	if err := t.b.Copy(bot, b.V); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gy, err := t.grad(y)
		if err != nil {
			return err
		}
		gtop, _ := gy.Rows(0, ra)
		gbot, _ := gy.Rows(ra, ra+rb)
		gs, err := t.grads(a, b)
		if err != nil {
			return err
		}
		ga, gb := gs[0], gs[1]
		if err := t.b.Axpy(ga, 1, gtop); err != nil {
			return err
		}
		return t.b.Axpy(gb, 1, gbot)
	}, []*DVar{y})
	return y, nil
}

// rope rotates the last 2·len(inv) dims of each head of hd in x by the positions (sign +1),
// or back (sign -1), interleaved pairs, cos and sin multiplied by scale (HostTape.RopeScaled).
func (m *DSV4Device) rope(t *DevTape, x *DVar, hd int, pos T, main bool, sign int, scale float64) (*DVar, error) {
	inv := m.Cfg.CompressInvFreq
	if main {
		inv = m.Cfg.MainInvFreq
	}
	rd := 2 * len(inv)
	R := x.V.Dim(0)
	heads := x.V.Dim(1) / hd
	if heads*hd != x.V.Dim(1) || rd > hd {
		return nil, fmt.Errorf("rope: [%d %d] in heads of %d, %d rotated", R, x.V.Dim(1), hd, rd)
	}
	invT, err := m.invFreq(main)
	if err != nil {
		return nil, err
	}
	args := backend.RoPEArgs{Positions: pos, InvFreq: invT, Heads: heads, HeadDim: rd, RotaryDim: rd, AttentionScaling: float32(scale), Interleaved: true}
	part := backend.ColumnCopyArgs{Groups: heads, Width: rd, SrcOffset: hd - rd, SrcStride: hd, DstStride: rd}
	back := backend.ColumnCopyArgs{Groups: heads, Width: rd, DstOffset: hd - rd, DstStride: hd, SrcStride: rd}
	rotate := func(dst, src T, fwd bool) error {
		// dst = src with the rotated dims turned (fwd: by +angle·sign).
		tmp, err := t.tmp(src.DType(), R, heads*rd)
		if err != nil {
			return err
		}
		defer t.b.Free(tmp)
		p := part
		p.Dst, p.Src = tmp, src
		if err := t.b.CopyColumns(p); err != nil {
			return err
		}
		if fwd == (sign > 0) {
			err = t.b.RoPE(tmp, tmp, args)
		} else {
			err = t.b.RoPEBackward(tmp, tmp, args)
		}
		if err != nil {
			return err
		}
		if err := t.b.Copy(dst, src); err != nil {
			return err
		}
		q := back
		q.Dst, q.Src = dst, tmp
		return t.b.CopyColumns(q)
	}
	y, err := t.val(x.V.DType(), x.V.Shape()...)
	if err != nil {
		return nil, err
	}
	if err := rotate(y.V, x.V, true); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gs, err := t.grads(y, x)
		if err != nil {
			return err
		}
		gy, gx := gs[0], gs[1]
		d, err := t.tmp(gy.DType(), gy.Shape()...)
		if err != nil {
			return err
		}
		defer t.b.Free(d)
		if err := rotate(d, gy, false); err != nil {
			return err
		}
		return t.b.Axpy(gx, 1, d)
	}, []*DVar{y})
	return y, nil
}

// attention is layer i's attention on the normalised input h [T, C].
func (m *DSV4Device) attention(t *DevTape, i int, h *DVar, pos T) (*DVar, error) {
	c := &m.Cfg
	sa := fmt.Sprintf("model.layers.%d.self_attn.", i)
	where := fmt.Sprintf("layer %d attention", i)
	D, T_ := c.HeadDim, h.V.Dim(0)
	kind := c.LayerTypes[i]
	main := kind == DSV4Sliding
	scale := c.compressScale()
	if main {
		scale = c.MainScale
		if scale == 0 {
			scale = 1
		}
	}
	ps := map[string]*DVar{}
	for _, n := range []string{"q_a_proj.weight", "q_a_norm.weight", "q_b_proj.weight", "kv_proj.weight", "kv_norm.weight", "sinks", "o_a_proj.weight", "o_b_proj.weight"} {
		v, err := m.p(t, sa+n)
		if err != nil {
			return nil, err
		}
		ps[n] = v
	}
	qa, err := t.linear(h, ps["q_a_proj.weight"], nil)
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	qres, err := m.rmsnorm(t, qa, c.QRank, ps["q_a_norm.weight"])
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	qb, err := t.linear(qres, ps["q_b_proj.weight"], nil)
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	q, err := m.rmsnorm(t, qb, D, nil)
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	if q, err = m.rope(t, q, D, pos, main, 1, scale); err != nil {
		return nil, dsv4Err(where, err)
	}
	kvp, err := t.linear(h, ps["kv_proj.weight"], nil)
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	kv, err := m.rmsnorm(t, kvp, D, ps["kv_norm.weight"])
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	if kv, err = m.rope(t, kv, D, pos, main, 1, scale); err != nil {
		return nil, dsv4Err(where, err)
	}
	a := backend.SinkAttentionArgs{Heads: c.Heads, Window: c.Window, Scale: float32(1 / math.Sqrt(float64(D)))}
	if !main {
		rate := c.Rates[i]
		a.Rate = rate
		ck, err := m.compress(t, h, sa+"compressor.", rate, kind == DSV4CSA)
		if err != nil {
			return nil, dsv4Err(where+" compressor", err)
		}
		if ck != nil {
			if kv, err = t.concatRows(kv, ck); err != nil {
				return nil, dsv4Err(where, err)
			}
			if kind == DSV4CSA {
				if a.Mask, err = m.index(t, h, qres, sa+"compressor.indexer.", rate, ck.V.Dim(0)); err != nil {
					return nil, dsv4Err(where+" indexer", err)
				}
			}
		}
	}
	o, err := t.val(q.V.DType(), T_, c.Heads*D)
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	lse, err := t.alloc(tensor.F32, T_, c.Heads)
	if err != nil {
		return nil, dsv4Err(where, err)
	}
	sinks := ps["sinks"]
	a.Q, a.KV, a.Sinks, a.Out, a.LSE = q.V, kv.V, sinks.V, o.V, lse
	if err := m.sinkAttention(t, a, q, kv, sinks, o); err != nil {
		return nil, dsv4Err(where, err)
	}
	if o, err = m.rope(t, o, D, pos, main, -1, scale); err != nil {
		return nil, dsv4Err(where, err)
	}
	if o, err = t.groupedLinear(o, ps["o_a_proj.weight"], c.OGroups); err != nil {
		return nil, dsv4Err(where+" output", err)
	}
	o, err = t.linear(o, ps["o_b_proj.weight"], nil)
	return o, dsv4Err(where+" output", err)
}

// groupedLinear multiplies each of the groups column blocks of x by its block of w's rows.
func (t *DevTape) groupedLinear(x, w *DVar, groups int) (*DVar, error) {
	K := x.V.Dim(1) / groups
	M := w.V.Dim(0) / groups
	R := x.V.Dim(0)
	if K*groups != x.V.Dim(1) || M*groups != w.V.Dim(0) || w.V.Dim(1) != K {
		return nil, fmt.Errorf("grouped linear: x %v, w %v, %d groups", x.V, w.V, groups)
	}
	y, err := t.val(x.V.DType(), R, groups*M)
	if err != nil {
		return nil, err
	}
	xs := make([]T, groups)
	for g := 0; g < groups; g++ {
		if xs[g], err = t.alloc(x.V.DType(), R, K); err != nil {
			return nil, err
		}
		if err := t.b.CopyColumns(backend.ColumnCopyArgs{Dst: xs[g], Src: x.V, Groups: 1, Width: K, SrcOffset: g * K}); err != nil {
			return nil, err
		}
		wg, _ := w.V.Rows(g*M, (g+1)*M)
		yg, err := t.tmp(x.V.DType(), R, M)
		if err != nil {
			return nil, err
		}
		err = t.b.Linear(yg, xs[g], wg, T{})
		if err == nil {
			err = t.b.CopyColumns(backend.ColumnCopyArgs{Dst: y.V, Src: yg, Groups: 1, Width: M, DstOffset: g * M})
		}
		if err = errors.Join(err, t.b.Free(yg)); err != nil {
			return nil, err
		}
	}
	t.recFree(func() error {
		gs, err := t.grads(y, x, w)
		if err != nil {
			return err
		}
		gy, gx, gw := gs[0], gs[1], gs[2]
		for g := 0; g < groups; g++ {
			dy, err := t.tmp(gy.DType(), R, M)
			if err != nil {
				return err
			}
			dx, err := t.tmp(gx.DType(), R, K)
			if err != nil {
				_ = t.b.Free(dy)
				return err
			}
			err = t.b.CopyColumns(backend.ColumnCopyArgs{Dst: dy, Src: gy, Groups: 1, Width: M, SrcOffset: g * M})
			if err == nil {
				wg, _ := w.V.Rows(g*M, (g+1)*M)
				a := backend.LinearBackwardArgs{DX: dx, DY: dy, X: xs[g], W: wg}
				if !gw.IsNil() {
					a.DW, _ = gw.Rows(g*M, (g+1)*M)
				}
				err = t.b.LinearBackward(a)
			}
			if err == nil {
				err = t.b.CopyColumns(backend.ColumnCopyArgs{Dst: gx, Src: dx, Groups: 1, Width: K, DstOffset: g * K, Accumulate: true})
			}
			if err = errors.Join(err, t.b.Free(dy), t.b.Free(dx)); err != nil {
				return err
			}
		}
		return nil
	}, []*DVar{y}, xs...)
	return y, nil
}

// compress pools h [T, C] into one entry per rate tokens (overlapping windows when overlap),
// normalised and rotated at each window's first position; nil when T < rate.
func (m *DSV4Device) compress(t *DevTape, h *DVar, pre string, rate int, overlap bool) (*DVar, error) {
	n := h.V.Dim(0) / rate
	if n == 0 {
		return nil, nil
	}
	kvw, err := m.p(t, pre+"kv_proj.weight")
	if err != nil {
		return nil, err
	}
	gw, err := m.p(t, pre+"gate_proj.weight")
	if err != nil {
		return nil, err
	}
	ape, err := m.p(t, pre+"position_bias")
	if err != nil {
		return nil, err
	}
	norm, err := m.p(t, pre+"kv_norm.weight")
	if err != nil {
		return nil, err
	}
	kv, err := t.linear(h, kvw, nil)
	if err != nil {
		return nil, err
	}
	gate, err := t.linear(h, gw, nil)
	if err != nil {
		return nil, err
	}
	D := kv.V.Dim(1)
	if overlap {
		D /= 2
	}
	pooled, err := t.val(kv.V.DType(), n, D)
	if err != nil {
		return nil, err
	}
	a := backend.WindowPoolArgs{KV: kv.V, Gate: gate.V, APE: ape.V, Rate: rate, Overlap: overlap, Out: pooled.V}
	if err := m.ops.WindowPool(a); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		ba := backend.WindowPoolBackwardArgs{WindowPoolArgs: a}
		gs, err := t.grads(pooled, kv, gate, ape)
		if err != nil {
			return err
		}
		ba.DOut, ba.DKV, ba.DGate, ba.GAPE = gs[0], gs[1], gs[2], gs[3]
		return dsv4Err("window pool backward", m.ops.WindowPoolBackward(ba))
	}, []*DVar{pooled})
	normed, err := m.rmsnorm(t, pooled, D, norm)
	if err != nil {
		return nil, err
	}
	wpos := make([]int32, n)
	for w := range wpos {
		wpos[w] = int32(w * rate)
	}
	posT, err := backend.FromInt32(m.B, wpos, n)
	if err != nil {
		return nil, err
	}
	t.Own(posT)
	return m.rope(t, normed, D, posT, false, 1, m.Cfg.compressScale())
}

// index is the lightning indexer: it returns the mask [T, n] I32 of the IndexTopK compressed
// entries each query keeps (of those it may see), chosen on the host from the device's scores
// with torch's top-k order. No gradient flows through it.
func (m *DSV4Device) index(t *DevTape, h, qres *DVar, pre string, rate, n int) (T, error) {
	c := &m.Cfg
	T_ := h.V.Dim(0)
	// The indexer's values take no gradient: it runs on a tape that records nothing.
	nt := &DevTape{b: t.b}
	defer nt.Close()
	keys, err := m.compress(nt, h, pre, rate, true)
	if err != nil {
		return T{}, err
	}
	qb, err := m.p(nt, pre+"q_b_proj.weight")
	if err != nil {
		return T{}, err
	}
	wp, err := m.p(nt, pre+"scorer.weights_proj.weight")
	if err != nil {
		return T{}, err
	}
	pos := make([]int32, T_)
	for i := range pos {
		pos[i] = int32(i)
	}
	posT, err := backend.FromInt32(m.B, pos, T_)
	if err != nil {
		return T{}, err
	}
	nt.Own(posT)
	q, err := nt.linear(qres, qb, nil)
	if err != nil {
		return T{}, err
	}
	if q, err = m.rope(nt, q, c.IndexDim, posT, false, 1, c.compressScale()); err != nil {
		return T{}, err
	}
	wts, err := nt.linear(h, wp, nil)
	if err != nil {
		return T{}, err
	}
	scores, err := nt.alloc(tensor.F32, T_, n)
	if err != nil {
		return T{}, err
	}
	if err := m.ops.IndexScores(backend.IndexScoresArgs{Q: q.V, Keys: keys.V, Weights: wts.V, Heads: c.IndexHeads, Rate: rate, Out: scores}); err != nil {
		return T{}, err
	}
	sv, err := backend.ToFloat32(m.B, scores)
	if err != nil {
		return T{}, err
	}
	k := min(c.IndexTopK, n)
	mask := make([]int32, T_*n)
	row := make([]float64, n)
	for ti := 0; ti < T_; ti++ {
		limit := (ti + 1) / rate
		for w := range row {
			row[w] = float64(sv[ti*n+w])
		}
		for _, w := range torchTopK(row, k) {
			if w < limit {
				mask[ti*n+w] = 1
			}
		}
	}
	mt, err := backend.FromInt32(m.B, mask, T_, n)
	if err != nil {
		return T{}, err
	}
	t.Own(mt)
	return mt, nil
}

// moe is layer i's mixture of experts on h [T, C] for the tokens ids.
func (m *DSV4Device) moe(t *DevTape, i int, h *DVar, ids []int) (*DVar, error) {
	c := &m.Cfg
	mlp := fmt.Sprintf("model.layers.%d.mlp.", i)
	where := fmt.Sprintf("layer %d experts", i)
	T_, E, K, C := h.V.Dim(0), c.Experts, c.TopK, c.Hidden
	gw, err := m.p(t, mlp+"gate.weight")
	if err != nil {
		return nil, err
	}
	logits, err := t.linear(h, gw, nil)
	if err != nil {
		return nil, dsv4Err(where+" router", err)
	}
	scores, err := t.val(tensor.F32, T_, E)
	if err != nil {
		return nil, err
	}
	lf := logits.V
	var lfCopy T // the logits in F32 when they are not
	if lf.DType() != tensor.F32 {
		if lf, err = t.alloc(tensor.F32, T_, E); err != nil {
			return nil, err
		}
		lfCopy = lf
		if err := m.B.Copy(lf, logits.V); err != nil {
			return nil, err
		}
	}
	if err := m.ops.SqrtSoftplus(scores.V, lf); err != nil {
		return nil, dsv4Err(where+" router", err)
	}
	t.recFree(func() error {
		gs, err := t.grad(scores)
		if err != nil {
			return err
		}
		gl := logits.G
		if gl.IsNil() {
			if gl, err = t.grad(logits); err != nil {
				return err
			}
		}
		if gl.DType() == tensor.F32 {
			return m.ops.SqrtSoftplusBackward(gl, gs, lf, scores.V)
		}
		d, err := t.tmp(tensor.F32, T_, E)
		if err != nil {
			return err
		}
		defer t.b.Free(d)
		if err := m.ops.SqrtSoftplusBackward(d, gs, lf, scores.V); err != nil {
			return err
		}
		tmp, err := t.tmp(gl.DType(), T_, E)
		if err != nil {
			return err
		}
		defer t.b.Free(tmp)
		if err := m.B.Copy(tmp, d); err != nil {
			return err
		}
		return m.B.Axpy(gl, 1, tmp)
	}, []*DVar{scores}, lfCopy)
	sv, err := backend.ToFloat32(m.B, scores.V)
	if err != nil {
		return nil, dsv4Err(where+" router", err)
	}
	idx := make([]int, T_*K)
	if c.MLPTypes[i] == DSV4HashMoE {
		table := m.Tid2Eid[i]
		for r, id := range ids {
			copy(idx[r*K:(r+1)*K], table[id*K:(id+1)*K])
		}
	} else {
		bp, err := m.p(t, mlp+"gate.e_score_correction_bias")
		if err != nil {
			return nil, err
		}
		bias, err := backend.ToFloat32(m.B, bp.V)
		if err != nil {
			return nil, err
		}
		sel := make([]float64, E)
		for r := 0; r < T_; r++ {
			for e := range sel {
				sel[e] = float64(sv[r*E+e]) + float64(bias[e])
			}
			copy(idx[r*K:(r+1)*K], torchTopK(sel, K))
		}
	}
	// The routing weights on the host: w[r,j] = s[r,idx]/(Σ_j s + 1e-20)·RoutedScale.
	sums := make([]float64, T_)
	wts := make([]float64, T_*K)
	for r := 0; r < T_; r++ {
		s := 1e-20
		for j := 0; j < K; j++ {
			s += float64(sv[r*E+idx[r*K+j]])
		}
		sums[r] = s
		for j := 0; j < K; j++ {
			wts[r*K+j] = float64(sv[r*E+idx[r*K+j]]) / s * c.RoutedScale
		}
	}
	routed, err := t.val(h.V.DType(), T_, C)
	if err != nil {
		return nil, err
	}
	type expertRun struct {
		ids, w         T // views of the layer's sorted assignments
		lo             int
		at             []int
		xe, g, u, a, y *DVar
		gate, up, down *DVar
	}
	// Every assignment sorted by expert (in increasing assignment order within one), uploaded
	// once for the layer: each expert's token ids and weights are views of them.
	var toks []int32
	var we []float32
	var runs []*expertRun
	for e := 0; e < E; e++ {
		r := &expertRun{lo: len(toks)}
		for j, x := range idx {
			if x == e {
				toks, we, r.at = append(toks, int32(j/K)), append(we, float32(wts[j])), append(r.at, j)
			}
		}
		if len(r.at) > 0 {
			ex := fmt.Sprintf("%sexperts.%d.", mlp, e)
			if r.gate, err = m.p(t, ex+"gate_proj.weight"); err != nil {
				return nil, err
			}
			if r.up, err = m.p(t, ex+"up_proj.weight"); err != nil {
				return nil, err
			}
			if r.down, err = m.p(t, ex+"down_proj.weight"); err != nil {
				return nil, err
			}
			runs = append(runs, r)
		}
	}
	idsAll, err := backend.FromInt32(m.B, toks, len(toks))
	if err != nil {
		return nil, err
	}
	t.Own(idsAll)
	wAll, err := backend.FromFloat32(m.B, we, tensor.F32, len(we))
	if err != nil {
		return nil, err
	}
	t.Own(wAll)
	for _, r := range runs {
		hi := r.lo + len(r.at)
		r.ids, _ = idsAll.Rows(r.lo, hi)
		r.w, _ = wAll.Rows(r.lo, hi)
		if r.xe, err = t.embed(h, r.ids); err != nil {
			return nil, dsv4Err(where, err)
		}
		if r.g, err = t.linear(r.xe, r.gate, nil); err != nil {
			return nil, dsv4Err(where, err)
		}
		if r.u, err = t.linear(r.xe, r.up, nil); err != nil {
			return nil, dsv4Err(where, err)
		}
		if r.a, err = m.clampSwiGLU(t, r.g, r.u); err != nil {
			return nil, dsv4Err(where, err)
		}
		if r.y, err = t.linear(r.a, r.down, nil); err != nil {
			return nil, dsv4Err(where, err)
		}
		ys, err := t.tmp(r.y.V.DType(), r.y.V.Shape()...)
		if err != nil {
			return nil, err
		}
		err = m.B.Copy(ys, r.y.V)
		if err == nil {
			err = m.B.ScaleRows(ys, r.w)
		}
		if err == nil {
			err = m.B.EmbeddingBackward(routed.V, ys, r.ids)
		}
		if err = errors.Join(err, m.B.Free(ys)); err != nil {
			return nil, dsv4Err(where+" combine", err)
		}
	}
	// The combine's backward: each expert's rows of the routed gradient, weighted into its
	// output's gradient, and the weights' gradients (read back) into the scores'.
	t.recFree(func() error {
		gr, err := t.grad(routed)
		if err != nil {
			return err
		}
		dw := make([]float64, T_*K)
		// Each expert's weight gradients land in its rows of one tensor, read back once.
		dots, err := t.tmp(tensor.F32, len(toks))
		if err != nil {
			return err
		}
		defer t.b.Free(dots)
		for _, r := range runs {
			rows := r.y.V.Dim(0)
			// r.y's only reader is this combine: its gradient is the gathered rows, weighted.
			gy, err := t.grad(r.y)
			if err != nil {
				return err
			}
			if err := m.B.Embedding(gy, gr, r.ids); err != nil {
				return err
			}
			dr, _ := dots.Rows(r.lo, r.lo+rows)
			if err := m.B.RowDot(dr, gy, r.y.V); err != nil {
				return err
			}
			if err := m.B.ScaleRows(gy, r.w); err != nil {
				return err
			}
		}
		v, err := backend.ToFloat32(m.B, dots)
		if err != nil {
			return err
		}
		for _, r := range runs {
			for j, a := range r.at {
				dw[a] += float64(v[r.lo+j])
			}
		}
		ds := make([]float32, T_*E)
		for r := 0; r < T_; r++ {
			s, dot := sums[r], 0.0
			for j := 0; j < K; j++ {
				dot += dw[r*K+j] * float64(sv[r*E+idx[r*K+j]])
			}
			for j := 0; j < K; j++ {
				ds[r*E+idx[r*K+j]] += float32(c.RoutedScale * (dw[r*K+j]/s - dot/(s*s)))
			}
		}
		dsT, err := backend.FromFloat32(m.B, ds, tensor.F32, T_, E)
		if err != nil {
			return err
		}
		t.Own(dsT)
		gs, err := t.grad(scores)
		if err != nil {
			return err
		}
		return m.B.Axpy(gs, 1, dsT)
	}, []*DVar{routed})
	// The shared expert.
	se := mlp + "shared_experts."
	lin := func(x *DVar, name string) (*DVar, error) {
		w, err := m.p(t, se+name+".weight")
		if err != nil {
			return nil, err
		}
		var b *DVar
		if c.SharedBias {
			if b, err = m.p(t, se+name+".bias"); err != nil {
				return nil, err
			}
		}
		return t.linear(x, w, b)
	}
	sg, err := lin(h, "gate_proj")
	if err != nil {
		return nil, dsv4Err(where+" shared", err)
	}
	su, err := lin(h, "up_proj")
	if err != nil {
		return nil, dsv4Err(where+" shared", err)
	}
	sa, err := m.clampSwiGLU(t, sg, su)
	if err != nil {
		return nil, dsv4Err(where+" shared", err)
	}
	sd, err := lin(sa, "down_proj")
	if err != nil {
		return nil, dsv4Err(where+" shared", err)
	}
	out, err := t.add(routed, sd)
	return out, dsv4Err(where, err)
}

// clampSwiGLU is SwiGLUClampedSplit with the decoder's limit.
func (m *DSV4Device) clampSwiGLU(t *DevTape, g, u *DVar) (*DVar, error) {
	y, err := t.val(g.V.DType(), g.V.Shape()...)
	if err != nil {
		return nil, err
	}
	lim := float32(m.Cfg.SwigluLimit)
	if err := m.ops.SwiGLUClampedSplit(y.V, g.V, u.V, lim); err != nil {
		return nil, err
	}
	t.recFree(func() error {
		gs, err := t.grads(y, g, u)
		if err != nil {
			return err
		}
		gy, gg, gu := gs[0], gs[1], gs[2]
		return m.ops.SwiGLUClampedSplitBackward(gg, gu, gy, g.V, u.V, lim)
	}, []*DVar{y})
	return y, nil
}

// grads returns the gradients of vs (grad of each, in order).
func (t *DevTape) grads(vs ...*DVar) ([]T, error) {
	out := make([]T, len(vs))
	for i, v := range vs {
		g, err := t.grad(v)
		if err != nil {
			return nil, err
		}
		out[i] = g
	}
	return out, nil
}

// Grad returns v's gradient tensor, allocating it (zeros) on first use: seed an output's
// gradient through it before Backward.
func (t *DevTape) Grad(v *DVar) (T, error) { return t.grad(v) }

// Own hands x to the tape, which frees it in Close.
func (t *DevTape) Own(x T) {
	if t.own == nil {
		t.own = map[tensor.Buffer]bool{}
	}
	t.owned = append(t.owned, x)
	t.own[x.Buffer()] = true
}

// sinkAttention runs sink attention a (its Out, o's tensor, written) and records its backward:
// the fused op, or its composition from matrix products around the sink softmax
// (HALO_DSV4_ATTENTION).
func (m *DSV4Device) sinkAttention(t *DevTape, a backend.SinkAttentionArgs, q, kv, sinks, o *DVar) error {
	if !DSV4DenseAttention(m.B.Name()) {
		if err := m.ops.SinkAttention(a); err != nil {
			return err
		}
		t.recFree(func() error {
			ba := backend.SinkAttentionBackwardArgs{SinkAttentionArgs: a}
			var err error
			if ba.DOut, err = t.grad(o); err != nil {
				return err
			}
			if ba.DQ, err = t.grad(q); err != nil {
				return err
			}
			if ba.DKV, err = t.grad(kv); err != nil {
				return err
			}
			if ba.GSinks, err = t.grad(sinks); err != nil {
				return err
			}
			return dsv4Err("sink attention backward", m.ops.SinkAttentionBackward(ba))
		}, []*DVar{o}, a.LSE)
		return nil
	}
	// The key/value head is every query head's, so the heads are rows: Q [N·H, D] against
	// KV [S, D]. The scores and probabilities [N·H, S] live only inside the forward and the
	// backward (which makes them again from LSE).
	N, H, S := q.V.Dim(0), a.Heads, kv.V.Dim(0)
	D := kv.V.Dim(1)
	R := N * H
	qr := mustReshape(q.V, R, D)
	probs := func(useLSE bool) (x, p T, err error) {
		if x, err = m.B.Alloc(tensor.F32, R, S); err != nil {
			return
		}
		if p, err = m.B.Alloc(kv.V.DType(), R, S); err != nil {
			_ = m.B.Free(x)
			return
		}
		err = m.B.GEMM(backend.GEMMArgs{A: qr, B: kv.V, C: x, TransB: true, Alpha: a.Scale})
		if err == nil {
			err = m.ops.SinkSoftmax(backend.SinkSoftmaxArgs{X: x, Sinks: a.Sinks, Mask: a.Mask, Heads: H, Window: a.Window,
				Rate: a.Rate, UseLSE: useLSE, P: p, LSE: a.LSE})
		}
		if err != nil {
			_ = m.B.Free(x)
			_ = m.B.Free(p)
		}
		return
	}
	x, p, err := probs(false)
	if err != nil {
		return err
	}
	err = m.B.GEMM(backend.GEMMArgs{A: p, B: kv.V, C: mustReshape(o.V, R, D), Alpha: 1})
	err = errors.Join(err, m.B.Free(x), m.B.Free(p))
	if err != nil {
		return err
	}
	t.recFree(func() error {
		gs, err := t.grads(o, q, kv, sinks)
		if err != nil {
			return err
		}
		gO, gQ, gKV, gS := gs[0], gs[1], gs[2], gs[3]
		x, p, err := probs(true)
		if err != nil {
			return err
		}
		defer func() { _ = m.B.Free(x); _ = m.B.Free(p) }()
		dO := mustReshape(gO, R, D)
		// dKV += Pᵀ·dO; dP = dO·KVᵀ (into the scores' buffer); dS = P∘(dP - Δ) (over P);
		// dQ += Scale·dS·KV; dKV += Scale·dSᵀ·Q.
		if err := m.B.GEMM(backend.GEMMArgs{A: p, B: dO, C: gKV, TransA: true, Alpha: 1, Beta: 1}); err != nil {
			return err
		}
		if err := m.B.GEMM(backend.GEMMArgs{A: dO, B: kv.V, C: x, TransB: true, Alpha: 1}); err != nil {
			return err
		}
		if err := m.ops.SinkSoftmaxBackward(backend.SinkSoftmaxBackwardArgs{P: p, DP: x, Sinks: a.Sinks, LSE: a.LSE,
			Heads: H, DS: p, GSinks: gS}); err != nil {
			return err
		}
		if err := m.B.GEMM(backend.GEMMArgs{A: p, B: kv.V, C: mustReshape(gQ, R, D), Alpha: a.Scale, Beta: 1}); err != nil {
			return err
		}
		return m.B.GEMM(backend.GEMMArgs{A: p, B: qr, C: gKV, TransA: true, Alpha: a.Scale, Beta: 1})
	}, []*DVar{o}, a.LSE)
	return nil
}
