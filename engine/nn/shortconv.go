package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ShortConv is LFM2's gated short convolution, the operator of its conv layers, as
// transformers' Lfm2MoeShortConv computes it. Letters: N tokens, C hidden size, L taps
// (conv_L_cache).
//
//	bcx  = InProj(x)                         [N, 3C]   columns: B | C | x
//	bx   = B * x                             [N, C]
//	conv[n,c] = sum_j W[c,j] * bx[n-(L-1)+j, c] + Bias[c]   (rows of n's document only;
//	                                                          earlier rows count as zero)
//	y    = OutProj(C * conv)                 [N, C]
//
// The convolution is causal and depthwise (one filter of L taps per channel, W [C, 1, L] as
// nn.Conv1d holds it) and runs over each packed document on its own: a token sees the L-1
// tokens before it in its document, found from Pass.Positions (the position of a token in its
// document).
//
// The projections run on the backend. The gating and the convolution between them run on the
// backend too where it has Optional.ShortConv and ShortConvBackward (the CPU and CUDA
// backends; engine/backend/shortconv.go), for every pass but a decoding one. Otherwise, and when
// decoding, they run on the host over downloaded rows, at the cost of one download and one
// upload of [N, 3C] and [N, C] per pass in each direction. Values are computed in float32 and
// rounded to the pass dtype where transformers rounds them (bx, conv and C * conv).
//
// Gradients: the projections' and the adapter's as Linear's (+=); GW [C, 1, L] and GBias [C]
// +=. Cached for backward (keep): x (not owned) and the gated input C * conv on the device;
// with the backend op also in_proj's output [N, 3C] and conv [N, C] on the device, on the host
// path B, C, x, bx and conv on the host.
//
// Decoding: with Pass.Cache the layer's KVCache K [MaxLen, C] holds bx of every cached token,
// laid out as attention lays out keys (appended at CacheLen, regathered by CacheGather into
// the documents of CuSeqlensK, K2 the spare buffer); a token's history is read from the rows
// before its own. Such passes do not train (keep is refused).
type ShortConv struct {
	Name            string
	InProj, OutProj Linear
	// W [C, 1, L] and Bias [C] (optional) are the depthwise filter; GW and GBias their
	// gradients (optional).
	W, Bias, GW, GBias T
	C, L               int
	// Layer is the index into Pass.Cache.
	Layer int

	c convCache
}

type convCache struct {
	x, gated           T
	bcx, conv          T // the backend op's path: in_proj's output and conv, on the device
	b, cg, xv, bx, cnv []float32
	pos                []int32
	live               bool
}

// Forward returns a new y [N,C] for x [N,C] (the normed hidden states); keep caches what
// Backward needs.
func (s *ShortConv) Forward(p *Pass, x T, keep bool) (y T, err error) {
	if s.c.live {
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", s.Name)
	}
	if p.Cache != nil && keep {
		return T{}, fmt.Errorf("nn: %s: a decoding pass (with a KV cache) does not train", s.Name)
	}
	if p.Slots != nil {
		return T{}, fmt.Errorf("nn: %s: the short-convolution layers decode with the host cache (Pass.Cache), not a slotted one", s.Name)
	}
	c := &s.c
	c.x, c.live = x, true
	defer func() {
		if err != nil || !keep {
			s.Release(p)
		}
	}()
	bcx, err := s.InProj.Forward(p, x)
	if err != nil {
		return T{}, err
	}
	if s.onDevice(p) {
		return s.forwardDevice(p, bcx)
	}
	host, err := backend.ToFloat32(p.B, bcx)
	_ = free(p.B, &bcx)
	if err != nil {
		return T{}, wrap(s.Name, err)
	}
	if c.pos, err = backend.ToInt32(p.B, p.Positions); err != nil {
		return T{}, wrap(s.Name+" positions", err)
	}
	w, bias, err := s.filter(p)
	if err != nil {
		return T{}, err
	}
	n, ch, l := p.N, s.C, s.L
	if len(host) != n*3*ch || len(c.pos) != n || len(w) != ch*l {
		return T{}, fmt.Errorf("nn: %s: in_proj gave %d values, positions %d, filter %d; want %d, %d, %d", s.Name,
			len(host), len(c.pos), len(w), n*3*ch, n, ch*l)
	}
	round := rounder(p.DType)
	c.b, c.cg, c.xv = make([]float32, n*ch), make([]float32, n*ch), make([]float32, n*ch)
	c.bx, c.cnv = make([]float32, n*ch), make([]float32, n*ch)
	for r := 0; r < n; r++ {
		row := host[r*3*ch : (r+1)*3*ch]
		copy(c.b[r*ch:], row[:ch])
		copy(c.cg[r*ch:], row[ch:2*ch])
		copy(c.xv[r*ch:], row[2*ch:])
		for j := 0; j < ch; j++ {
			c.bx[r*ch+j] = round(row[j] * row[2*ch+j])
		}
	}
	// hist(r, back) is bx of the token back rows before token r in its document.
	hist := func(r, back int) []float32 { return c.bx[(r-back)*ch : (r-back+1)*ch] }
	if p.Cache != nil {
		if hist, err = s.cached(p, c.bx, c.pos); err != nil {
			return T{}, err
		}
	}
	gated := make([]float32, n*ch)
	for r := 0; r < n; r++ {
		for j := 0; j < ch; j++ {
			var acc float32
			if bias != nil {
				acc = bias[j]
			}
			for k := 0; k < l; k++ {
				back := l - 1 - k // tap k reads the token `back` rows earlier
				if int(c.pos[r]) < back {
					continue
				}
				acc += w[j*l+k] * hist(r, back)[j]
			}
			c.cnv[r*ch+j] = round(acc)
			gated[r*ch+j] = round(c.cg[r*ch+j] * c.cnv[r*ch+j])
		}
	}
	if c.gated, err = backend.FromFloat32(p.B, gated, p.DType, n, ch); err != nil {
		return T{}, wrap(s.Name, err)
	}
	return s.OutProj.Forward(p, c.gated)
}

// cached appends this pass's bx [N, C] to the layer's cache (regathering it as CacheGather
// says) and returns the history lookup of a decoding pass: the cached rows before each
// token's own, downloaded once each.
func (s *ShortConv) cached(p *Pass, bx []float32, pos []int32) (func(r, back int) []float32, error) {
	if s.Layer >= len(p.Cache) || p.Cache[s.Layer] == nil {
		return nil, fmt.Errorf("nn: %s: no cache for layer %d", s.Name, s.Layer)
	}
	kv := p.Cache[s.Layer]
	n, ch := p.N, s.C
	lo, hi := p.CacheLen, p.CacheLen+n
	if kv.K.Rank() != 2 || kv.K.Dim(1) != ch || hi > kv.K.Dim(0) {
		return nil, fmt.Errorf("nn: %s: the cache %v must be [>= %d, %d]", s.Name, kv.K, hi, ch)
	}
	rows, err := kv.K.Rows(lo, hi)
	if err != nil {
		return nil, wrap(s.Name, err)
	}
	raw, err := tensor.EncodeFloat32(rows.DType(), bx)
	if err == nil {
		err = p.B.Upload(rows, raw)
	}
	if err != nil {
		return nil, wrap(s.Name+" cache", err)
	}
	if !p.CacheGather.IsNil() {
		nk := p.CacheGather.Numel()
		if kv.K2.IsNil() || nk > kv.K2.Dim(0) {
			return nil, fmt.Errorf("nn: %s: a gathered cache needs a spare buffer K2 of %d rows", s.Name, nk)
		}
		src, err := kv.K.Rows(0, hi)
		if err != nil {
			return nil, wrap(s.Name, err)
		}
		dst, err := kv.K2.Rows(0, nk)
		if err != nil {
			return nil, wrap(s.Name, err)
		}
		if err := p.B.Embedding(dst, src, p.CacheGather); err != nil {
			return nil, wrap(s.Name+" cache gather", err)
		}
		kv.K, kv.K2 = kv.K2, kv.K
	}
	// keyRow[r] is token r's own row in the cache: with CuSeqlensK each document's tokens are
	// the last rows of its keys; otherwise they were appended at CacheLen.
	keyRow := make([]int, n)
	for r := range keyRow {
		keyRow[r] = lo + r
	}
	if !p.CuSeqlensK.IsNil() {
		cu, err := backend.ToInt32(p.B, p.CuSeqlens)
		if err != nil {
			return nil, wrap(s.Name, err)
		}
		cuK, err := backend.ToInt32(p.B, p.CuSeqlensK)
		if err != nil {
			return nil, wrap(s.Name, err)
		}
		if len(cu) != len(cuK) {
			return nil, fmt.Errorf("nn: %s: %d query documents but %d key documents", s.Name, len(cu)-1, len(cuK)-1)
		}
		for d := 0; d+1 < len(cu); d++ {
			for r := int(cu[d]); r < int(cu[d+1]); r++ {
				keyRow[r] = int(cuK[d+1]) - (int(cu[d+1]) - r)
			}
		}
	}
	got := map[int][]float32{}
	for r := 0; r < n; r++ {
		for back := 1; back < s.L && back <= int(pos[r]); back++ {
			k := keyRow[r] - back
			if _, ok := got[k]; ok {
				continue
			}
			row, err := kv.K.Rows(k, k+1)
			if err != nil {
				return nil, wrap(s.Name+" cache", err)
			}
			if got[k], err = backend.ToFloat32(p.B, row); err != nil {
				return nil, wrap(s.Name+" cache", err)
			}
		}
	}
	return func(r, back int) []float32 {
		if back == 0 {
			return bx[r*ch : (r+1)*ch]
		}
		return got[keyRow[r]-back]
	}, nil
}

// filter downloads the filter and bias (nil when absent).
func (s *ShortConv) filter(p *Pass) (w, bias []float32, err error) {
	if w, err = backend.ToFloat32(p.B, s.W); err != nil {
		return nil, nil, wrap(s.Name+" conv", err)
	}
	if !s.Bias.IsNil() {
		if bias, err = backend.ToFloat32(p.B, s.Bias); err != nil {
			return nil, nil, wrap(s.Name+" conv bias", err)
		}
	}
	return w, bias, nil
}

// rounder rounds a float32 to dt (the identity for F32).
func rounder(dt tensor.DType) func(float32) float32 {
	switch dt {
	case tensor.BF16:
		return func(v float32) float32 { return tensor.BF16ToF32(tensor.F32ToBF16(v)) }
	case tensor.F16:
		return func(v float32) float32 { return tensor.F16ToF32(tensor.F32ToF16(v)) }
	}
	return func(v float32) float32 { return v }
}

// Backward returns a new dx [N,C] (=) for dy [N,C], accumulates every parameter gradient
// (+=) and releases the cache.
func (s *ShortConv) Backward(p *Pass, dy T) (dx T, err error) {
	if !s.c.live {
		return T{}, fmt.Errorf("nn: %s: Backward without a cached Forward", s.Name)
	}
	c := &s.c
	defer s.Release(p)
	n, ch, l := p.N, s.C, s.L
	dg, err := p.out(n, ch)
	if err != nil {
		return T{}, wrap(s.Name, err)
	}
	err = s.OutProj.Backward(p, dg, dy, c.gated, false)
	if !c.bcx.IsNil() {
		return s.backwardDevice(p, dg, err)
	}
	var dgh []float32
	if err == nil {
		dgh, err = backend.ToFloat32(p.B, dg)
	}
	_ = free(p.B, &dg)
	if err != nil {
		return T{}, wrap(s.Name, err)
	}
	w, _, err := s.filter(p)
	if err != nil {
		return T{}, err
	}
	dcnv := make([]float32, n*ch)
	dbcx := make([]float32, n*3*ch)
	for i := range dcnv {
		dcnv[i] = dgh[i] * c.cg[i]
	}
	dw := make([]float64, ch*l)
	dbias := make([]float64, ch)
	dbx := make([]float32, n*ch)
	for r := 0; r < n; r++ {
		for j := 0; j < ch; j++ {
			g := dcnv[r*ch+j]
			dbias[j] += float64(g)
			for k := 0; k < l; k++ {
				back := l - 1 - k
				if int(c.pos[r]) < back {
					continue
				}
				src := (r-back)*ch + j
				dw[j*l+k] += float64(g) * float64(c.bx[src])
				dbx[src] += g * w[j*l+k]
			}
		}
	}
	for r := 0; r < n; r++ {
		row := dbcx[r*3*ch : (r+1)*3*ch]
		for j := 0; j < ch; j++ {
			i := r*ch + j
			row[j] = dbx[i] * c.xv[i]     // d B
			row[ch+j] = dgh[i] * c.cnv[i] // d C
			row[2*ch+j] = dbx[i] * c.b[i] // d x
		}
	}
	if err := s.accumulate(p, s.GW, dw); err != nil {
		return T{}, err
	}
	if !s.Bias.IsNil() {
		if err := s.accumulate(p, s.GBias, dbias); err != nil {
			return T{}, err
		}
	}
	d, err := backend.FromFloat32(p.B, dbcx, p.DType, n, 3*ch)
	if err != nil {
		return T{}, wrap(s.Name, err)
	}
	defer func() { _ = free(p.B, &d) }()
	if dx, err = p.out(c.x.Shape()...); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if err = s.InProj.Backward(p, dx, d, c.x, false); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// accumulate adds g to the gradient tensor t (skipped when t is the zero tensor: frozen).
func (s *ShortConv) accumulate(p *Pass, t T, g []float64) error {
	if t.IsNil() {
		return nil
	}
	cur, err := backend.ToFloat32(p.B, t)
	if err != nil {
		return wrap(s.Name+" conv grad", err)
	}
	if len(cur) != len(g) {
		return fmt.Errorf("nn: %s: gradient %v has %d elements, want %d", s.Name, t, len(cur), len(g))
	}
	for i := range cur {
		cur[i] += float32(g[i])
	}
	raw, err := tensor.EncodeFloat32(t.DType(), cur)
	if err != nil {
		return wrap(s.Name, err)
	}
	return wrap(s.Name+" conv grad", p.B.Upload(t, raw))
}

// onDevice reports whether the pass takes the backend's short-convolution op: it has one and
// the pass does not decode (the decoding history lives in the KV cache, read on the host).
func (s *ShortConv) onDevice(p *Pass) bool {
	o := p.B.Optional()
	return o.ShortConv != nil && o.ShortConvBackward != nil && p.Cache == nil
}

// forwardDevice is Forward's convolution and gating through Optional.ShortConv; it owns bcx.
func (s *ShortConv) forwardDevice(p *Pass, bcx T) (T, error) {
	c := &s.c
	c.bcx = bcx
	var err error
	if c.conv, err = p.out(p.N, s.C); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if c.gated, err = p.out(p.N, s.C); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if err := p.B.Optional().ShortConv(backend.ShortConvArgs{BCX: bcx, W: s.W, Bias: s.Bias,
		Positions: p.Positions, Conv: c.conv, Gated: c.gated}); err != nil {
		return T{}, wrap(s.Name, err)
	}
	return s.OutProj.Forward(p, c.gated)
}

// backwardDevice is Backward after out_proj (whose error is err) through
// Optional.ShortConvBackward; it frees dg.
func (s *ShortConv) backwardDevice(p *Pass, dg T, err error) (dx T, _ error) {
	c := &s.c
	defer func() { _ = free(p.B, &dg) }()
	if err != nil {
		return T{}, err
	}
	d, err := p.out(p.N, 3*s.C)
	if err != nil {
		return T{}, wrap(s.Name, err)
	}
	defer func() { _ = free(p.B, &d) }()
	var gbias T
	if !s.Bias.IsNil() {
		gbias = s.GBias
	}
	if err := p.B.Optional().ShortConvBackward(backend.ShortConvBackwardArgs{DGated: dg, BCX: c.bcx, W: s.W,
		Positions: p.Positions, Conv: c.conv, DBCX: d, GW: s.GW, GBias: gbias}); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if dx, err = p.out(c.x.Shape()...); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if err = s.InProj.Backward(p, dx, d, c.x, false); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// Release frees the cached activations without a backward.
func (s *ShortConv) Release(p *Pass) {
	_ = free(p.B, &s.c.gated, &s.c.bcx, &s.c.conv)
	s.c = convCache{}
}
