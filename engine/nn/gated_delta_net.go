package nn

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// GatedDeltaNet is the linear-attention token mixer of Qwen3-Next and Qwen3.5 (transformers'
// Qwen3NextGatedDeltaNet and Qwen3_5MoeGatedDeltaNet on their torch path). Dimension letters:
// N tokens, C model width, KH query/key heads of KD, VH value heads of VD (each key head g
// serves the R = VH/KH value heads g·R .. g·R+R-1), D = 2·KH·KD + VH·VD conv channels, K taps.
//
//	mixed [N,D] = q | k | v           the projections (Grouped: in_proj_qkvz and in_proj_ba,
//	z [N,VH·VD], b, a [N,VH]          rows per key head (q, k, R·v, R·z) and (R·b, R·a); else
//	                                  in_proj_qkv, in_proj_z, in_proj_b, in_proj_a)
//	u = silu(conv(mixed))             depthwise causal conv over each document: u[t,c] =
//	                                  Σ_j Conv[c,j]·mixed[t+j-K+1, c] (rows before the
//	                                  document's start count as 0)
//	q̂ = l2(q)/√KD, k̂ = l2(k)          l2(x) = x·(Σx²+1e-6)^-½ per head
//	β = σ(b), g = -exp(A_log)·softplus(a + dt_bias)
//	S_t = e^{g_t}·S_{t-1} + k̂_t·δ_tᵀ,  δ_t = β_t·(v_t - (e^{g_t}·S_{t-1})ᵀ·k̂_t)   per value head,
//	o_t = S_tᵀ·q̂_t                    S [KD,VD], zero at each document's start
//	y = Out(rms(o)·NormW·silu(z))     rms over each head's VD values (eps Eps), no 1 + w offset
//
// The recurrence is the plain one of transformers' torch_recurrent_gated_delta_rule; the
// chunked form transformers runs on a whole sequence computes the same values.
//
// Paths, by what the backend has. The device path (gated_delta_net_device.go) runs every stage
// as a backend op on device tensors — the projections, GatedDeltaPrep (conv, SiLU, l2 norms,
// gates), GatedDelta (the recurrence), GatedRMSNorm, and their backwards — for every pass but a
// decoding one, when the backend has those ops (the CPU and CUDA backends); its cache stays on
// the device and no [N, D] rows cross to the host. Otherwise the stages around the recurrence
// run here on the host in float64 over downloaded rows (the projections still on the backend),
// with the recurrence in the backend's GatedDelta op where it has one (engine/backend/
// gated_delta.go; q̂, k̂, v, β and g uploaded as F32 and o downloaded) outside decoding, else
// here in float64 too, the key heads' groups of value heads on up to GOMAXPROCS goroutines. A
// decoding pass always takes the host path: the row's recurrent state lives on the host. The
// host float64 path is the reference the device path is tested against.
//
// Gradients: Conv, DtBias, ALog and NormW accumulate (+=) into GConv, GDtBias, GALog and
// GNormW; the projections' gradients accumulate through Linear.Backward. Cached for backward
// on the host paths (host float64): the conv input and pre-activation, z, β, g, the normalised
// q̂ and k̂ with their inverse norms, v, the state S at the start of every stateChunk tokens of
// each document (with the backend op: on the device, in F32), the recurrence output o and its
// rms; the device path's cache is described in gated_delta_net_device.go. The layer input x is
// not owned. The states inside a chunk are recomputed in backward from the chunk's first one,
// so the cache holds N/stateChunk states per head, never N.
type GatedDeltaNet struct {
	Name string
	// Grouped selects the projection layout: QKVZ [2·KH·KD+2·VH·VD, C] and BA [2·VH, C] grouped
	// per key head (qwen3_next); otherwise QKV [D, C], Z [VH·VD, C], B and A [VH, C] (qwen3_5).
	Grouped      bool
	QKVZ, BA     Linear
	QKV, Z, B, A Linear
	Out          Linear
	// Conv [D,1,K], DtBias and ALog [VH], NormW [VD] with their gradients.
	Conv, DtBias, ALog, NormW     T
	GConv, GDtBias, GALog, GNormW T
	KH, VH, KD, VD, K             int
	Eps                           float32
	// Layer indexes Pass.Cache when decoding: the layer's LinearState lives in
	// Pass.Cache[Layer].Linear.
	Layer int

	c gdnCache
}

// LinearState is a gated delta-net layer's decoding state (KVCache.Linear): for each running
// row, its recurrent states S [VH,KD,VD] after its last token and its last K-1 conv inputs
// [(K-1), D], oldest first (zeros before the row's first token).
type LinearState struct {
	S, Conv [][]float64
}

// stateChunk is the number of tokens between the recurrent states kept for backward.
const stateChunk = 64

type gdnCache struct {
	live           bool
	x              T
	docs           []int32             // document boundaries (CuSeqlens)
	mixed, pre     []float64           // conv input and pre-activation [N,D]
	z, beta, g, ga []float64           // z [N,VH·VD]; β, g and a + dt_bias [N,VH]
	q, k, v        []float64           // q̂ and k̂ [N,KH,KD], v [N,VH,VD]
	qInv, kInv     []float64           // [N,KH] inverse l2 norms
	o, rs          []float64           // o [N,VH,VD], rs [N,VH] inverse rms
	states         []map[int][]float64 // per value head: S before token t, every stateChunk tokens
	// dev: the recurrence ran in the backend op, whose kept states are devStates (device F32).
	dev       bool
	devStates T
	// stages: the pass took the device path (gated_delta_net_device.go), whose cache is the
	// projections' outputs (activation dtype), the recurrence's output o and the norm's inverse
	// rms (F32), all on the device, with devStates.
	stages                     bool
	devMixed, devZ, devB, devA T
	devO, devRS                T
	conv, dt, aLog, nrm        []float64
	// Decoding only: per document of the pass, the state it continues (nil: a new row) and
	// the recurrent states after its last token.
	hist, s0, final [][]float64
}

func (l *GatedDeltaNet) convDim() int { return 2*l.KH*l.KD + l.VH*l.VD }

// check validates the sizes against the parameters.
func (l *GatedDeltaNet) check() error {
	if l.KH <= 0 || l.VH <= 0 || l.KD <= 0 || l.VD <= 0 || l.K <= 0 || l.VH%l.KH != 0 {
		return fmt.Errorf("nn: %s: heads %d/%d of %d/%d and kernel %d: sizes must be positive and value heads a multiple of key heads", l.Name, l.KH, l.VH, l.KD, l.VD, l.K)
	}
	if l.Conv.Numel() != l.convDim()*l.K || l.DtBias.Numel() != l.VH || l.ALog.Numel() != l.VH || l.NormW.Numel() != l.VD {
		return fmt.Errorf("nn: %s: parameters conv %v, dt_bias %v, A_log %v, norm %v do not match %d channels of %d taps, %d value heads of %d",
			l.Name, l.Conv.Shape(), l.DtBias.Shape(), l.ALog.Shape(), l.NormW.Shape(), l.convDim(), l.K, l.VH, l.VD)
	}
	return nil
}

// Forward returns a new y [N,C] for x [N,C] (the normed hidden states). With keep the
// activations are cached for Backward. When decoding (p.Cache set), document j of the pass
// continues row p.StateRows[j] of the layer's LinearState (every document starts a new row
// when StateRows is nil: the prefill), and the state afterwards holds one row per document in
// pass order; such a pass cannot be kept for backward. The slotted cache of device decoding
// (p.Slots) is refused: the state lives on the host.
func (l *GatedDeltaNet) Forward(p *Pass, x T, keep bool) (y T, err error) {
	if l.c.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", l.Name)
	}
	if p.Slots != nil {
		return T{}, fmt.Errorf("nn: %s: decoding with a slotted (device) cache is not supported by gated delta-net layers, whose recurrent state lives on the host; decode on the host (HALO_GENERATE=host)", l.Name)
	}
	if p.Cache != nil && keep {
		return T{}, fmt.Errorf("nn: %s: a decoding pass (with a cache) has no backward", l.Name)
	}
	if err := l.check(); err != nil {
		return T{}, err
	}
	c := &l.c
	*c = gdnCache{live: true, x: x}
	defer func() {
		if err != nil || !keep {
			l.Release(p)
		}
	}()
	if l.stagesOnDevice(p) {
		core, err := l.forwardDevice(p, x, keep)
		if err != nil {
			return T{}, err
		}
		defer func() { _ = free(p.B, &core) }()
		return l.Out.Forward(p, core)
	}
	if c.docs, err = backend.ToInt32(p.B, p.CuSeqlens); err != nil {
		return T{}, wrap(l.Name+" documents", err)
	}
	if err = l.params(p); err != nil {
		return T{}, err
	}
	if err = l.project(p, x); err != nil {
		return T{}, err
	}
	var st *LinearState
	if p.Cache != nil {
		if st, err = l.resume(p); err != nil {
			return T{}, err
		}
	}
	core, err := l.mix(p, keep)
	if err != nil {
		return T{}, err
	}
	if st != nil {
		l.suspend(st)
	}
	out, err := backend.FromFloat32(p.B, core, x.DType(), p.N, l.VH*l.VD)
	if err != nil {
		return T{}, wrap(l.Name, err)
	}
	defer func() { _ = free(p.B, &out) }()
	return l.Out.Forward(p, out)
}

// params downloads the layer's own parameters.
func (l *GatedDeltaNet) params(p *Pass) error {
	c := &l.c
	for _, pr := range []struct {
		t   T
		dst *[]float64
	}{{l.Conv, &c.conv}, {l.DtBias, &c.dt}, {l.ALog, &c.aLog}, {l.NormW, &c.nrm}} {
		v, err := backend.ToFloat32(p.B, pr.t)
		if err != nil {
			return wrap(l.Name, err)
		}
		*pr.dst = widen(v)
	}
	return nil
}

func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func narrow(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// download runs l on x and returns its output on the host.
func download(p *Pass, lin *Linear, x T) ([]float64, error) {
	y, err := lin.Forward(p, x)
	if err != nil {
		return nil, err
	}
	v, err := backend.ToFloat32(p.B, y)
	_ = free(p.B, &y)
	if err != nil {
		return nil, wrap(lin.Name, err)
	}
	return widen(v), nil
}

// project runs the input projections and lays them out as mixed [N,D], z [N,VH·VD], b and a
// [N,VH] (b and a kept in beta and g until mix turns them into β and g).
func (l *GatedDeltaNet) project(p *Pass, x T) error {
	c, n, vd := &l.c, p.N, l.VH*l.VD
	d := l.convDim()
	c.mixed, c.z = make([]float64, n*d), make([]float64, n*vd)
	b, a := make([]float64, n*l.VH), make([]float64, n*l.VH)
	if l.Grouped {
		qkvz, err := download(p, &l.QKVZ, x)
		if err != nil {
			return err
		}
		ba, err := download(p, &l.BA, x)
		if err != nil {
			return err
		}
		if len(qkvz) != n*(d+vd) || len(ba) != n*2*l.VH {
			return fmt.Errorf("nn: %s: in_proj_qkvz gives %d and in_proj_ba %d values for %d tokens", l.Name, len(qkvz), len(ba), n)
		}
		l.groupedLayout(func(t, src, dst, w int, which int) {
			row := qkvz[t*(d+vd):]
			switch which {
			case 0:
				copy(c.mixed[t*d+dst:t*d+dst+w], row[src:src+w])
			case 1:
				copy(c.z[t*vd+dst:t*vd+dst+w], row[src:src+w])
			}
		}, n)
		r := l.VH / l.KH
		for t := range n {
			for g := range l.KH {
				src := ba[t*2*l.VH+g*2*r:]
				copy(b[t*l.VH+g*r:t*l.VH+(g+1)*r], src[:r])
				copy(a[t*l.VH+g*r:t*l.VH+(g+1)*r], src[r:2*r])
			}
		}
	} else {
		var err error
		if c.mixed, err = download(p, &l.QKV, x); err != nil {
			return err
		}
		if c.z, err = download(p, &l.Z, x); err != nil {
			return err
		}
		if b, err = download(p, &l.B, x); err != nil {
			return err
		}
		if a, err = download(p, &l.A, x); err != nil {
			return err
		}
		if len(c.mixed) != n*d || len(c.z) != n*vd || len(b) != n*l.VH || len(a) != n*l.VH {
			return fmt.Errorf("nn: %s: projections give %d, %d, %d, %d values; want %d, %d, %d, %d for %d tokens",
				l.Name, len(c.mixed), len(c.z), len(b), len(a), n*d, n*vd, n*l.VH, n*l.VH, n)
		}
	}
	c.beta, c.g = b, a
	return nil
}

// groupedLayout calls f for every contiguous block of in_proj_qkvz's row layout: for token t,
// the block [src, src+w) of the projection row goes to [dst, dst+w) of mixed (which 0) or of
// z (which 1). Key head g's block of the row is q (KD), k (KD), v (R·VD), z (R·VD).
func (l *GatedDeltaNet) groupedLayout(f func(t, src, dst, w, which int), n int) {
	r := l.VH / l.KH
	kd, rv := l.KH*l.KD, r*l.VD
	group := 2*l.KD + 2*rv
	for t := range n {
		for g := range l.KH {
			s := g * group
			f(t, s, g*l.KD, l.KD, 0)
			f(t, s+l.KD, kd+g*l.KD, l.KD, 0)
			f(t, s+2*l.KD, 2*kd+g*rv, rv, 0)
			f(t, s+2*l.KD+rv, g*rv, rv, 1)
		}
	}
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func softplus(x float64) float64 {
	// torch's softplus (beta 1, threshold 20): x itself above the threshold.
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// mix runs the conv, the gates, the recurrence and the gated norm from the cached projections
// and returns the normed, gated output [N, VH·VD].
func (l *GatedDeltaNet) mix(p *Pass, keep bool) ([]float32, error) {
	c := &l.c
	n, d := len(c.mixed)/l.convDim(), l.convDim()
	// Causal depthwise conv per document, then silu. A decoded document's inputs before its
	// first token are the row's kept conv inputs.
	c.pre = make([]float64, n*d)
	u := make([]float64, n*d)
	for di := 0; di+1 < len(c.docs); di++ {
		lo, hi := int(c.docs[di]), int(c.docs[di+1])
		var hist []float64
		if c.hist != nil {
			hist = c.hist[di]
		}
		for t := lo; t < hi; t++ {
			for ch := range d {
				s := 0.0
				for j := range l.K {
					if src := t + j - l.K + 1; src >= lo {
						s += c.conv[ch*l.K+j] * c.mixed[src*d+ch]
					} else if hist != nil {
						s += c.conv[ch*l.K+j] * hist[(l.K-1-(lo-src))*d+ch]
					}
				}
				c.pre[t*d+ch] = s
				u[t*d+ch] = s * sigmoid(s)
			}
		}
	}
	// Gates: b and a were left in beta and g by project.
	c.ga = make([]float64, len(c.g))
	for i := range c.beta {
		h := i % l.VH
		c.beta[i] = sigmoid(c.beta[i])
		c.ga[i] = c.g[i] + c.dt[h]
		c.g[i] = -math.Exp(c.aLog[h]) * softplus(c.ga[i])
	}
	// Normalised queries and keys, values.
	kd := l.KH * l.KD
	scale := 1 / math.Sqrt(float64(l.KD))
	c.q, c.k, c.v = make([]float64, n*kd), make([]float64, n*kd), make([]float64, n*l.VH*l.VD)
	c.qInv, c.kInv = make([]float64, n*l.KH), make([]float64, n*l.KH)
	for t := range n {
		row := u[t*d:]
		for h := range l.KH {
			for w, dst := range []struct {
				out, inv []float64
				off      int
			}{{c.q, c.qInv, 0}, {c.k, c.kInv, kd}} {
				src := row[dst.off+h*l.KD : dst.off+(h+1)*l.KD]
				ss := 0.0
				for _, x := range src {
					ss += x * x
				}
				inv := 1 / math.Sqrt(ss+1e-6)
				dst.inv[t*l.KH+h] = inv
				o := dst.out[t*kd+h*l.KD:]
				for i, x := range src {
					o[i] = x * inv
					if w == 0 {
						o[i] *= scale
					}
				}
			}
		}
		copy(c.v[t*l.VH*l.VD:(t+1)*l.VH*l.VD], row[2*kd:])
	}
	// The recurrence, per document and value head: the backend's op where it has one (not
	// when decoding), else here, where the groups of value heads that share a key head run in
	// parallel (they write disjoint outputs).
	vdAll := l.VH * l.VD
	if l.onDevice(p) {
		if err := l.recurDevice(p, keep); err != nil {
			return nil, err
		}
	} else {
		l.recurHost()
	}
	// Gated RMSNorm per head.
	out := make([]float32, n*vdAll)
	c.rs = make([]float64, n*l.VH)
	for t := range n {
		for h := range l.VH {
			o := c.o[t*vdAll+h*l.VD : t*vdAll+(h+1)*l.VD]
			ss := 0.0
			for _, x := range o {
				ss += x * x
			}
			rs := 1 / math.Sqrt(ss/float64(l.VD)+float64(l.Eps))
			c.rs[t*l.VH+h] = rs
			z := c.z[t*vdAll+h*l.VD:]
			for j, x := range o {
				out[t*vdAll+h*l.VD+j] = float32(x * rs * c.nrm[j] * z[j] * sigmoid(z[j]))
			}
		}
	}
	return out, nil
}

// recurHost runs the recurrence on the host: the outputs o and the states kept for backward.
func (l *GatedDeltaNet) recurHost() {
	c := &l.c
	n := len(c.mixed) / l.convDim()
	c.o = make([]float64, n*l.VH*l.VD)
	c.states = make([]map[int][]float64, l.VH)
	r := l.VH / l.KH
	parallelFor(l.KH, func(kh int) {
		for h := kh * r; h < (kh+1)*r; h++ {
			c.states[h] = map[int][]float64{}
		}
		for di := 0; di+1 < len(c.docs); di++ {
			lo, hi := int(c.docs[di]), int(c.docs[di+1])
			for h := kh * r; h < (kh+1)*r; h++ {
				l.forwardHead(di, lo, hi, h)
			}
		}
	})
}

// onDevice reports whether the recurrence runs in the backend's GatedDelta op: it has one and
// the pass does not decode (a decoded row's state lives on the host).
func (l *GatedDeltaNet) onDevice(p *Pass) bool {
	o := p.B.Optional()
	return o.GatedDelta != nil && o.GatedDeltaBackward != nil && p.Cache == nil
}

// gdInputs uploads q̂, k̂, v, β and g as F32 for the backend op; free releases them.
func (l *GatedDeltaNet) gdInputs(p *Pass) (ts [5]T, release func(), err error) {
	c, n := &l.c, p.N
	release = func() {
		for i := range ts {
			_ = free(p.B, &ts[i])
		}
	}
	for i, x := range []struct {
		v    []float64
		cols int
	}{{c.q, l.KH * l.KD}, {c.k, l.KH * l.KD}, {c.v, l.VH * l.VD}, {c.beta, l.VH}, {c.g, l.VH}} {
		if ts[i], err = backend.FromFloat32(p.B, narrow(x.v), tensor.F32, n, x.cols); err != nil {
			release()
			return ts, nil, wrap(l.Name, err)
		}
	}
	return ts, release, nil
}

// recurDevice runs the recurrence through Optional.GatedDelta: the outputs o come back to the
// host; with keep the states before every stateChunk-th token stay on the device for Backward.
func (l *GatedDeltaNet) recurDevice(p *Pass, keep bool) error {
	c, n := &l.c, p.N
	in, freeIn, err := l.gdInputs(p)
	if err != nil {
		return err
	}
	defer freeIn()
	out, err := p.B.Empty(tensor.F32, n, l.VH*l.VD)
	if err != nil {
		return wrap(l.Name, err)
	}
	defer func() { _ = free(p.B, &out) }()
	if keep {
		if c.devStates, err = p.B.Empty(tensor.F32, (n+stateChunk-1)/stateChunk, l.VH, l.KD, l.VD); err != nil {
			return wrap(l.Name, err)
		}
	}
	if err := p.B.Optional().GatedDelta(backend.GatedDeltaArgs{Q: in[0], K: in[1], V: in[2], Beta: in[3], G: in[4],
		CuSeqlens: p.CuSeqlens, Out: out, States: c.devStates, Chunk: stateChunk,
		KH: l.KH, VH: l.VH, KD: l.KD, VD: l.VD}); err != nil {
		return wrap(l.Name, err)
	}
	o, err := backend.ToFloat32(p.B, out)
	if err != nil {
		return wrap(l.Name, err)
	}
	c.o, c.dev = widen(o), true
	return nil
}

// recurDeviceBackward is the recurrence's backward through Optional.GatedDeltaBackward, from
// do, into the host gradients dq, dk, dv, dbeta and dg (=).
func (l *GatedDeltaNet) recurDeviceBackward(p *Pass, do, dq, dk, dv, dbeta, dg []float64) error {
	c, n := &l.c, p.N
	in, freeIn, err := l.gdInputs(p)
	if err != nil {
		return err
	}
	defer freeIn()
	var g [6]T // dout, dq, dk, dv, dbeta, dg
	defer func() {
		for i := range g {
			_ = free(p.B, &g[i])
		}
	}()
	if g[0], err = backend.FromFloat32(p.B, narrow(do), tensor.F32, n, l.VH*l.VD); err != nil {
		return wrap(l.Name, err)
	}
	for i, cols := range []int{l.KH * l.KD, l.KH * l.KD, l.VH * l.VD, l.VH, l.VH} {
		if g[i+1], err = p.B.Alloc(tensor.F32, n, cols); err != nil {
			return wrap(l.Name, err)
		}
	}
	if err := p.B.Optional().GatedDeltaBackward(backend.GatedDeltaBackwardArgs{Q: in[0], K: in[1], V: in[2],
		Beta: in[3], G: in[4], CuSeqlens: p.CuSeqlens, States: c.devStates, DOut: g[0],
		DQ: g[1], DK: g[2], DV: g[3], DBeta: g[4], DG: g[5], Chunk: stateChunk,
		KH: l.KH, VH: l.VH, KD: l.KD, VD: l.VD}); err != nil {
		return wrap(l.Name, err)
	}
	for i, dst := range [][]float64{dq, dk, dv, dbeta, dg} {
		v, err := backend.ToFloat32(p.B, g[i+1])
		if err != nil {
			return wrap(l.Name, err)
		}
		for j, x := range v {
			dst[j] = float64(x)
		}
	}
	return nil
}

// forwardHead runs value head h's recurrence over document di, tokens [lo, hi), keeping its
// state at every stateChunk-th token and writing its outputs o (when decoding: from the row's
// kept state, and keeping the state after the last token).
func (l *GatedDeltaNet) forwardHead(di, lo, hi, h int) {
	c := &l.c
	kd, vdAll, r := l.KH*l.KD, l.VH*l.VD, l.VH/l.KH
	size := l.KD * l.VD
	S := make([]float64, size)
	if c.s0 != nil && c.s0[di] != nil {
		copy(S, c.s0[di][h*size:(h+1)*size])
	}
	defer func() {
		if c.final != nil {
			copy(c.final[di][h*size:(h+1)*size], S)
		}
	}()
	for t := lo; t < hi; t++ {
		if (t-lo)%stateChunk == 0 {
			c.states[h][t] = append([]float64(nil), S...)
		}
		l.step(S, t, h, r)
		q := c.q[t*kd+(h/r)*l.KD:]
		o := c.o[t*vdAll+h*l.VD:]
		for j := range l.VD {
			s := 0.0
			for i := range l.KD {
				s += S[i*l.VD+j] * q[i]
			}
			o[j] = s
		}
	}
}

// parallelFor runs f(0), ..., f(n-1) on up to GOMAXPROCS goroutines and waits for them.
func parallelFor(n int, f func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// step advances value head h's state S [KD,VD] over token t: S = e^g·S, then the delta-rule
// update with k̂_t, v_t and β_t.
func (l *GatedDeltaNet) step(S []float64, t, h, r int) {
	c := &l.c
	kd := l.KH * l.KD
	decay := math.Exp(c.g[t*l.VH+h])
	k := c.k[t*kd+(h/r)*l.KD:]
	v := c.v[t*l.VH*l.VD+h*l.VD:]
	beta := c.beta[t*l.VH+h]
	for i := range S {
		S[i] *= decay
	}
	for j := range l.VD {
		mem := 0.0
		for i := range l.KD {
			mem += S[i*l.VD+j] * k[i]
		}
		delta := (v[j] - mem) * beta
		for i := range l.KD {
			S[i*l.VD+j] += k[i] * delta
		}
	}
}

// Backward returns a new dx [N,C] (=) for dy [N,C], accumulates every parameter gradient (+=)
// and releases the cache.
func (l *GatedDeltaNet) Backward(p *Pass, dy T) (dx T, err error) {
	if !l.c.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", l.Name)
	}
	c := &l.c
	defer l.Release(p)
	if c.stages {
		return l.backwardDevice(p, dy)
	}
	n, d, vdAll, kd := p.N, l.convDim(), l.VH*l.VD, l.KH*l.KD
	// The gated norm's input, rebuilt for out_proj's gradient.
	core := make([]float64, n*vdAll)
	for t := range n {
		for h := range l.VH {
			rs := c.rs[t*l.VH+h]
			for j := range l.VD {
				i := t*vdAll + h*l.VD + j
				core[i] = c.o[i] * rs * c.nrm[j] * c.z[i] * sigmoid(c.z[i])
			}
		}
	}
	coreT, err := backend.FromFloat32(p.B, narrow(core), c.x.DType(), n, vdAll)
	if err != nil {
		return T{}, wrap(l.Name, err)
	}
	var dcoreT T
	defer func() { _ = free(p.B, &coreT, &dcoreT) }()
	if dcoreT, err = p.out(n, vdAll); err != nil {
		return T{}, wrap(l.Name, err)
	}
	if err = l.Out.Backward(p, dcoreT, dy, coreT, false); err != nil {
		return T{}, err
	}
	dcore32, err := backend.ToFloat32(p.B, dcoreT)
	if err != nil {
		return T{}, wrap(l.Name, err)
	}
	dcore := widen(dcore32)

	// Gated norm: y = o·rs·w·silu(z).
	do, dz := make([]float64, n*vdAll), make([]float64, n*vdAll)
	dnrm := make([]float64, l.VD)
	for t := range n {
		for h := range l.VH {
			base := t*vdAll + h*l.VD
			rs := c.rs[t*l.VH+h]
			dot := 0.0
			dn := make([]float64, l.VD)
			for j := range l.VD {
				z := c.z[base+j]
				sg := sigmoid(z)
				silu := z * sg
				nv := c.o[base+j] * rs
				g := dcore[base+j]
				dnrm[j] += g * nv * silu
				dz[base+j] = g * nv * c.nrm[j] * sg * (1 + z*(1-sg))
				dn[j] = g * c.nrm[j] * silu
				dot += dn[j] * nv
			}
			dot /= float64(l.VD)
			for j := range l.VD {
				do[base+j] = rs * (dn[j] - c.o[base+j]*rs*dot)
			}
		}
	}

	// The recurrence, backwards per document and value head, chunk by chunk from the kept
	// states.
	dq, dk, dv := make([]float64, n*kd), make([]float64, n*kd), make([]float64, n*vdAll)
	dbeta, dg := make([]float64, n*l.VH), make([]float64, n*l.VH)
	// Key-head groups in parallel: the value heads of one group add into the same dq and dk
	// rows, so a group runs on one goroutine.
	r := l.VH / l.KH
	if c.dev {
		if err := l.recurDeviceBackward(p, do, dq, dk, dv, dbeta, dg); err != nil {
			return T{}, err
		}
	}
	parallelFor(l.KH, func(kh int) {
		if c.dev {
			return
		}
		for di := 0; di+1 < len(c.docs); di++ {
			lo, hi := int(c.docs[di]), int(c.docs[di+1])
			for h := kh * r; h < (kh+1)*r; h++ {
				dS := make([]float64, l.KD*l.VD)
				last := lo + (hi-1-lo)/stateChunk*stateChunk
				for start := last; start >= lo; start -= stateChunk {
					end := min(start+stateChunk, hi)
					// States before each token of the chunk: hist[i] = S_{start+i-1}.
					hist := make([][]float64, end-start+1)
					hist[0] = append([]float64(nil), c.states[h][start]...)
					for t := start; t < end; t++ {
						S := append([]float64(nil), hist[t-start]...)
						l.step(S, t, h, r)
						hist[t-start+1] = S
					}
					for t := end - 1; t >= start; t-- {
						l.stepBackward(dS, hist[t-start], hist[t-start+1], t, h, r, do, dq, dk, dv, dbeta, dg)
					}
				}
			}
		}
	})

	// Queries and keys: the l2 norm (and the query scale), summed over each key head's value
	// heads already; values pass through.
	scale := 1 / math.Sqrt(float64(l.KD))
	du := make([]float64, n*d)
	for t := range n {
		for h := range l.KH {
			for w, src := range []struct {
				g, y, inv []float64
				off       int
			}{{dq, c.q, c.qInv, 0}, {dk, c.k, c.kInv, kd}} {
				inv := src.inv[t*l.KH+h]
				gy := src.g[t*kd+h*l.KD : t*kd+(h+1)*l.KD]
				y := src.y[t*kd+h*l.KD : t*kd+(h+1)*l.KD]
				s := 1.0
				if w == 0 {
					s = scale
				}
				// y = s·x·inv, x = y/(s·inv): dx = s·inv·(gy - x̂·(x̂·gy)) with x̂ = x·inv.
				dot := 0.0
				for i := range gy {
					dot += (y[i] / s) * gy[i]
				}
				for i := range gy {
					du[t*d+src.off+h*l.KD+i] = s * inv * (gy[i] - (y[i]/s)*dot)
				}
			}
		}
		copy(du[t*d+2*kd:(t+1)*d], dv[t*vdAll:(t+1)*vdAll])
	}
	// silu and the conv.
	dmixed := make([]float64, n*d)
	dconv := make([]float64, len(c.conv))
	for di := 0; di+1 < len(c.docs); di++ {
		lo, hi := int(c.docs[di]), int(c.docs[di+1])
		for t := lo; t < hi; t++ {
			for ch := range d {
				s := c.pre[t*d+ch]
				sg := sigmoid(s)
				g := du[t*d+ch] * sg * (1 + s*(1-sg))
				for j := range l.K {
					if src := t + j - l.K + 1; src >= lo {
						dconv[ch*l.K+j] += g * c.mixed[src*d+ch]
						dmixed[src*d+ch] += g * c.conv[ch*l.K+j]
					}
				}
			}
		}
	}
	// Gates: β = σ(b), g = -e^{A_log}·softplus(a + dt_bias).
	db, da := make([]float64, n*l.VH), make([]float64, n*l.VH)
	ddt, dalog := make([]float64, l.VH), make([]float64, l.VH)
	for i := range dbeta {
		h := i % l.VH
		db[i] = dbeta[i] * c.beta[i] * (1 - c.beta[i])
		// g = -e^{A}·softplus(x), x = a + dt_bias: dg/dA = g, dg/dx = -e^{A}·σ(x) (1 past
		// softplus's threshold, where it is x itself).
		e, x := math.Exp(c.aLog[h]), c.ga[i]
		ds := sigmoid(x)
		if x > 20 {
			ds = 1
		}
		dx := dg[i] * -e * ds
		da[i], ddt[h] = dx, ddt[h]+dx
		dalog[h] += dg[i] * c.g[i]
	}
	for _, pg := range []struct {
		g     T
		delta []float64
	}{{l.GConv, dconv}, {l.GDtBias, ddt}, {l.GALog, dalog}, {l.GNormW, dnrm}} {
		if err = accumulate(p, pg.g, pg.delta); err != nil {
			return T{}, wrap(l.Name, err)
		}
	}
	if dx, err = p.alloc(c.x.Shape()...); err != nil {
		return T{}, wrap(l.Name, err)
	}
	if err = l.projectBackward(p, dx, dmixed, dz, db, da); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// stepBackward differentiates one step of the recurrence (value head h, token t) given the
// states before (prev = S_{t-1}) and after (cur = S_t) it. dS holds dL/dS_t on entry and
// dL/dS_{t-1} on return; the gradients of q̂, k̂ (summed into their key head), v, β and g are
// written or added.
func (l *GatedDeltaNet) stepBackward(dS, prev, cur []float64, t, h, r int, do, dq, dk, dv, dbeta, dg []float64) {
	c := &l.c
	kd, vdAll, kh := l.KH*l.KD, l.VH*l.VD, h/r
	q := c.q[t*kd+kh*l.KD : t*kd+(kh+1)*l.KD]
	k := c.k[t*kd+kh*l.KD : t*kd+(kh+1)*l.KD]
	v := c.v[t*vdAll+h*l.VD : t*vdAll+(h+1)*l.VD]
	dO := do[t*vdAll+h*l.VD : t*vdAll+(h+1)*l.VD]
	beta, decay := c.beta[t*l.VH+h], math.Exp(c.g[t*l.VH+h])
	// o = Sᵀq: dq = S·do, dS += q·doᵀ.
	for i := range l.KD {
		s := 0.0
		for j := range l.VD {
			s += cur[i*l.VD+j] * dO[j]
			dS[i*l.VD+j] += q[i] * dO[j]
		}
		dq[t*kd+kh*l.KD+i] += s
	}
	// S = Ŝ + k·δᵀ with Ŝ = e^g·prev and δ = β(v - Ŝᵀk).
	ddelta := make([]float64, l.VD)
	for j := range l.VD {
		s := 0.0
		for i := range l.KD {
			s += dS[i*l.VD+j] * k[i]
		}
		ddelta[j] = s
	}
	dbt := 0.0
	dkv := make([]float64, l.VD)
	for j := range l.VD {
		mem := 0.0
		for i := range l.KD {
			mem += decay * prev[i*l.VD+j] * k[i]
		}
		delta := beta * (v[j] - mem)
		for i := range l.KD {
			dk[t*kd+kh*l.KD+i] += dS[i*l.VD+j] * delta
		}
		dv[t*vdAll+h*l.VD+j] = beta * ddelta[j]
		dbt += ddelta[j] * (v[j] - mem)
		dkv[j] = -beta * ddelta[j]
	}
	dbeta[t*l.VH+h] = dbt
	// kv = Ŝᵀk: dŜ = dS + k·dkvᵀ, dk += Ŝ·dkv.
	dgt := 0.0
	for i := range l.KD {
		s := 0.0
		for j := range l.VD {
			sh := decay * prev[i*l.VD+j]
			s += sh * dkv[j]
			dsh := dS[i*l.VD+j] + k[i]*dkv[j]
			dgt += sh * dsh
			dS[i*l.VD+j] = decay * dsh
		}
		dk[t*kd+kh*l.KD+i] += s
	}
	dg[t*l.VH+h] = dgt
}

// accumulate adds delta to the gradient g (+=), in g's dtype. A nil g (no gradients) is
// skipped.
func accumulate(p *Pass, g T, delta []float64) error {
	if g.IsNil() {
		return nil
	}
	d, err := backend.FromFloat32(p.B, narrow(delta), g.DType(), g.Shape()...)
	if err != nil {
		return err
	}
	defer func() { _ = free(p.B, &d) }()
	return p.B.Axpy(g, 1, d)
}

// projectBackward lays the host gradients of mixed, z, b and a out as the projections' outputs
// and runs their backward into dx (+=).
func (l *GatedDeltaNet) projectBackward(p *Pass, dx T, dmixed, dz, db, da []float64) error {
	c, n, d, vd := &l.c, p.N, l.convDim(), l.VH*l.VD
	type part struct {
		lin  *Linear
		grad []float64
		cols int
	}
	var parts []part
	if l.Grouped {
		dqkvz := make([]float64, n*(d+vd))
		l.groupedLayout(func(t, src, dst, w, which int) {
			row := dqkvz[t*(d+vd):]
			if which == 0 {
				copy(row[src:src+w], dmixed[t*d+dst:t*d+dst+w])
			} else {
				copy(row[src:src+w], dz[t*vd+dst:t*vd+dst+w])
			}
		}, n)
		r := l.VH / l.KH
		dba := make([]float64, n*2*l.VH)
		for t := range n {
			for g := range l.KH {
				dst := dba[t*2*l.VH+g*2*r:]
				copy(dst[:r], db[t*l.VH+g*r:t*l.VH+(g+1)*r])
				copy(dst[r:2*r], da[t*l.VH+g*r:t*l.VH+(g+1)*r])
			}
		}
		parts = []part{{&l.QKVZ, dqkvz, d + vd}, {&l.BA, dba, 2 * l.VH}}
	} else {
		parts = []part{{&l.QKV, dmixed, d}, {&l.Z, dz, vd}, {&l.B, db, l.VH}, {&l.A, da, l.VH}}
	}
	for _, pt := range parts {
		g, err := backend.FromFloat32(p.B, narrow(pt.grad), c.x.DType(), n, pt.cols)
		if err != nil {
			return wrap(pt.lin.Name, err)
		}
		err = pt.lin.Backward(p, dx, g, c.x, true)
		_ = free(p.B, &g)
		if err != nil {
			return err
		}
	}
	return nil
}

// resume reads the decoding state that each document of the pass continues (p.StateRows)
// into the cache, and returns the state to update.
func (l *GatedDeltaNet) resume(p *Pass) (*LinearState, error) {
	c := &l.c
	if l.Layer >= len(p.Cache) || p.Cache[l.Layer] == nil {
		return nil, fmt.Errorf("nn: %s: no decoding cache for layer %d", l.Name, l.Layer)
	}
	kv := p.Cache[l.Layer]
	if kv.Linear == nil {
		kv.Linear = &LinearState{}
	}
	st, docs := kv.Linear, len(c.docs)-1
	c.final = make([][]float64, docs)
	for j := range c.final {
		c.final[j] = make([]float64, l.VH*l.KD*l.VD)
	}
	if p.StateRows == nil {
		return st, nil
	}
	if len(p.StateRows) != docs {
		return nil, fmt.Errorf("nn: %s: %d state rows for %d documents", l.Name, len(p.StateRows), docs)
	}
	c.hist, c.s0 = make([][]float64, docs), make([][]float64, docs)
	for j, r := range p.StateRows {
		if r < 0 || r >= len(st.S) {
			return nil, fmt.Errorf("nn: %s: document %d continues state row %d of %d", l.Name, j, r, len(st.S))
		}
		c.hist[j], c.s0[j] = st.Conv[r], st.S[r]
	}
	return st, nil
}

// suspend replaces st with one row per document of the pass: its recurrent states after its
// last token and its last K-1 conv inputs.
func (l *GatedDeltaNet) suspend(st *LinearState) {
	c := &l.c
	d, keep := l.convDim(), l.K-1
	conv := make([][]float64, len(c.final))
	for di := range conv {
		lo, hi := int(c.docs[di]), int(c.docs[di+1])
		row := make([]float64, keep*d)
		for k := range keep {
			src := hi - keep + k // the input position this kept row holds
			switch {
			case src >= lo:
				copy(row[k*d:(k+1)*d], c.mixed[src*d:(src+1)*d])
			case c.hist != nil:
				old := keep - (lo - src) // its row among the inputs kept before this pass
				copy(row[k*d:(k+1)*d], c.hist[di][old*d:(old+1)*d])
			}
		}
		conv[di] = row
	}
	st.S, st.Conv = c.final, conv
}

// Linears lists the layer's linear layers (the input projections of its layout, then
// out_proj), for adapters.
func (l *GatedDeltaNet) Linears() []*Linear {
	if l.Grouped {
		return []*Linear{&l.QKVZ, &l.BA, &l.Out}
	}
	return []*Linear{&l.QKV, &l.Z, &l.B, &l.A, &l.Out}
}

// Release drops the cached activations without a backward.
func (l *GatedDeltaNet) Release(p *Pass) {
	c := &l.c
	_ = free(p.B, &c.devStates, &c.devMixed, &c.devZ, &c.devB, &c.devA, &c.devO, &c.devRS)
	l.c = gdnCache{}
}
