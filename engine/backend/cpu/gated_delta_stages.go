package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// The stages of a gated delta-net layer around its recurrence (engine/backend's
// gated_delta_stages.go states the contract): the references of the device kernels, in float64
// with float32 operands.

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// softplus64 is torch's softplus (beta 1, threshold 20): x itself above the threshold.
func softplus64(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// gatedDeltaPrepIn are the forward's operands of both directions of the prep, as float32.
type gatedDeltaPrepIn struct {
	mixed, b, a, conv, dt, alog []float32
	cu                          []int32
}

func (b *Backend) gatedDeltaPrepInputs(op string, d backend.GatedDeltaPrepDims, mixed, bt, at, conv, dt, alog, cu T) (gatedDeltaPrepIn, error) {
	var in gatedDeltaPrepIn
	var err error
	for _, x := range []struct {
		name string
		t    T
		dst  *[]float32
	}{{"Mixed", mixed, &in.mixed}, {"B", bt, &in.b}, {"A", at, &in.a}, {"Conv", conv, &in.conv},
		{"DtBias", dt, &in.dt}, {"ALog", alog, &in.alog}} {
		if *x.dst, err = b.in(op, x.name, x.t); err != nil {
			return in, err
		}
	}
	if in.cu, err = docBounds(op, cu, d.Docs, d.N); err != nil {
		return in, err
	}
	return in, nil
}

// docStarts returns, for every token, the first token of its document.
func docStarts(cu []int32, n int) []int {
	lo := make([]int, n)
	for di := 0; di+1 < len(cu); di++ {
		for t := int(cu[di]); t < int(cu[di+1]); t++ {
			lo[t] = int(cu[di])
		}
	}
	return lo
}

// pre returns the conv's pre-activation of token t (document start lo), channel c.
func (in gatedDeltaPrepIn) pre(d backend.GatedDeltaPrepDims, t, lo, c int) float64 {
	s := 0.0
	for j := 0; j < d.L; j++ {
		if src := t + j - d.L + 1; src >= lo {
			s += float64(in.conv[c*d.L+j]) * float64(in.mixed[src*d.D+c])
		}
	}
	return s
}

// GatedDeltaPrep implements backend.Optional.GatedDeltaPrep: tokens on the workers.
func (b *Backend) GatedDeltaPrep(a backend.GatedDeltaPrepArgs) error {
	const op = "gated delta prep"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	in, err := b.gatedDeltaPrepInputs(op, d, a.Mixed, a.B, a.A, a.Conv, a.DtBias, a.ALog, a.CuSeqlens)
	if err != nil {
		return err
	}
	outs := map[string][]float32{}
	for _, x := range []struct {
		name string
		t    T
	}{{"Q", a.Q}, {"K", a.K}, {"V", a.V}, {"Beta", a.Beta}, {"G", a.G}} {
		if outs[x.name], err = f32only(op, x.name, x.t); err != nil {
			return err
		}
	}
	q, k, v, beta, g := outs["Q"], outs["K"], outs["V"], outs["Beta"], outs["G"]
	starts := docStarts(in.cu, d.N)
	kd, vd := d.KH*d.KD, d.VH*d.VD
	scale := 1 / math.Sqrt(float64(d.KD))
	b.pool.rows(d.N, max(1, convChunk/(d.D*d.L)), func(lo, hi int) {
		u := make([]float64, d.D)
		for t := lo; t < hi; t++ {
			for c := range u {
				s := in.pre(d, t, starts[t], c)
				u[c] = s * sigmoid64(s)
			}
			for h := 0; h < 2*d.KH; h++ {
				x := u[h*d.KD : (h+1)*d.KD]
				ss := 0.0
				for _, e := range x {
					ss += e * e
				}
				inv := 1 / math.Sqrt(ss+1e-6)
				var dst []float32
				if h < d.KH {
					dst, inv = q[t*kd+h*d.KD:], inv*scale
				} else {
					dst = k[t*kd+(h-d.KH)*d.KD:]
				}
				for i, e := range x {
					dst[i] = float32(e * inv)
				}
			}
			for i := range vd {
				v[t*vd+i] = float32(u[2*kd+i])
			}
			for h := 0; h < d.VH; h++ {
				i := t*d.VH + h
				beta[i] = float32(sigmoid64(float64(in.b[i])))
				x := float64(in.a[i]) + float64(in.dt[h])
				g[i] = float32(-math.Exp(float64(in.alog[h])) * softplus64(x))
			}
		}
	})
	return nil
}

// GatedDeltaPrepBackward implements backend.Optional.GatedDeltaPrepBackward: the gradient of
// each conv pre-activation first (tokens on the workers), then the input gradient from the
// later taps of each token's document, then the per-channel sums of the parameters'
// gradients in float64 (channels on the workers, tokens in order), added once.
func (b *Backend) GatedDeltaPrepBackward(a backend.GatedDeltaPrepBackwardArgs) error {
	const op = "gated delta prep backward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	in, err := b.gatedDeltaPrepInputs(op, d, a.Mixed, a.B, a.A, a.Conv, a.DtBias, a.ALog, a.CuSeqlens)
	if err != nil {
		return err
	}
	grads := map[string][]float32{}
	for _, x := range []struct {
		name string
		t    T
	}{{"DQ", a.DQ}, {"DK", a.DK}, {"DBeta", a.DBeta}, {"DG", a.DG}} {
		if grads[x.name], err = f32only(op, x.name, x.t); err != nil {
			return err
		}
	}
	dq, dk, dbeta, dg := grads["DQ"], grads["DK"], grads["DBeta"], grads["DG"]
	dv, err := b.in(op, "DV", a.DV)
	if err != nil {
		return err
	}
	starts := docStarts(in.cu, d.N)
	kd, vd := d.KH*d.KD, d.VH*d.VD
	scale := 1 / math.Sqrt(float64(d.KD))
	// dpre [N,D]: the gradient of the conv's pre-activation.
	dpre := make([]float64, d.N*d.D)
	b.pool.rows(d.N, max(1, convChunk/(d.D*d.L)), func(lo, hi int) {
		pre, u := make([]float64, d.D), make([]float64, d.D)
		du := make([]float64, d.D)
		for t := lo; t < hi; t++ {
			for c := range u {
				pre[c] = in.pre(d, t, starts[t], c)
				u[c] = pre[c] * sigmoid64(pre[c])
			}
			// y = s·x·inv with inv = (Σx²+1e-6)^-½: dx = s·inv·(gy - x̂·(x̂·gy)), x̂ = x·inv.
			for h := 0; h < 2*d.KH; h++ {
				x := u[h*d.KD : (h+1)*d.KD]
				var gy []float32
				s := scale
				if h < d.KH {
					gy = dq[t*kd+h*d.KD:]
				} else {
					gy, s = dk[t*kd+(h-d.KH)*d.KD:], 1
				}
				ss := 0.0
				for _, e := range x {
					ss += e * e
				}
				inv, dot := 1/math.Sqrt(ss+1e-6), 0.0
				for i, e := range x {
					dot += e * inv * float64(gy[i])
				}
				for i, e := range x {
					du[h*d.KD+i] = s * inv * (float64(gy[i]) - e*inv*dot)
				}
			}
			for i := range vd {
				du[2*kd+i] = float64(dv[t*vd+i])
			}
			for c := range du {
				sg := sigmoid64(pre[c])
				dpre[t*d.D+c] = du[c] * sg * (1 + pre[c]*(1-sg))
			}
		}
	})
	// The end of each token's document, for the taps that read it.
	ends := make([]int, d.N)
	for di := 0; di+1 < len(in.cu); di++ {
		for t := int(in.cu[di]); t < int(in.cu[di+1]); t++ {
			ends[t] = int(in.cu[di+1])
		}
	}
	dmixed, flush, err := b.out(op, "DMixed", a.DMixed, false)
	if err != nil {
		return err
	}
	b.pool.rows(d.N, max(1, convChunk/(d.D*d.L)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			for c := 0; c < d.D; c++ {
				s := 0.0
				for back := 0; back < d.L && t+back < ends[t]; back++ {
					s += float64(in.conv[c*d.L+d.L-1-back]) * dpre[(t+back)*d.D+c]
				}
				dmixed[t*d.D+c] = float32(s)
			}
		}
	})
	flush()
	// The gates: β = σ(b); g = -e^{A}·softplus(x), x = a + dt_bias: dg/dA = g, dg/dx =
	// -e^{A}·σ(x) (1 above softplus's threshold, where it is x itself).
	db, flushB, err := b.out(op, "DB", a.DB, false)
	if err != nil {
		return err
	}
	da, flushA, err := b.out(op, "DA", a.DA, false)
	if err != nil {
		return err
	}
	dA, dAlog := make([]float64, d.N*d.VH), make([]float64, d.N*d.VH)
	for i := range dA {
		h := i % d.VH
		bt := sigmoid64(float64(in.b[i]))
		db[i] = float32(float64(dbeta[i]) * bt * (1 - bt))
		e, x := math.Exp(float64(in.alog[h])), float64(in.a[i])+float64(in.dt[h])
		ds := sigmoid64(x)
		if x > 20 {
			ds = 1
		}
		dA[i] = float64(dg[i]) * -e * ds
		dAlog[i] = float64(dg[i]) * -e * softplus64(x)
		da[i] = float32(dA[i])
	}
	flushB()
	flushA()
	gconv := make([]float64, d.D*d.L)
	if !a.GConv.IsNil() {
		b.pool.rows(d.D, 1, func(lo, hi int) {
			for c := lo; c < hi; c++ {
				for t := 0; t < d.N; t++ {
					g := dpre[t*d.D+c]
					for j := 0; j < d.L; j++ {
						if src := t + j - d.L + 1; src >= starts[t] {
							gconv[c*d.L+j] += g * float64(in.mixed[src*d.D+c])
						}
					}
				}
			}
		})
	}
	gdt, galog := make([]float64, d.VH), make([]float64, d.VH)
	for t := 0; t < d.N; t++ {
		for h := 0; h < d.VH; h++ {
			gdt[h] += dA[t*d.VH+h]
			galog[h] += dAlog[t*d.VH+h]
		}
	}
	return b.addGrads(op, gradSum{"GConv", a.GConv, gconv}, gradSum{"GDtBias", a.GDtBias, gdt}, gradSum{"GALog", a.GALog, galog})
}

// GatedRMSNorm implements backend.Optional.GatedRMSNorm: rows on the workers.
func (b *Backend) GatedRMSNorm(a backend.GatedRMSNormArgs) error {
	const op = "gated rmsnorm"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	x, z, w, err := b.gatedNormInputs(op, a.X, a.Z, a.Weight)
	if err != nil {
		return err
	}
	rstd, err := f32only(op, "RStd", a.RStd)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	b.pool.rows(d.R, max(1, convChunk/d.W), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			ss := 0.0
			for _, e := range x[r*d.W : (r+1)*d.W] {
				ss += float64(e) * float64(e)
			}
			rs := 1 / math.Sqrt(ss/float64(d.W)+float64(a.Eps))
			rstd[r] = float32(rs)
			for j := 0; j < d.W; j++ {
				zj := float64(z[r*d.W+j])
				out[r*d.W+j] = float32(float64(x[r*d.W+j]) * rs * float64(w[j]) * zj * sigmoid64(zj))
			}
		}
	})
	flush()
	return nil
}

func (b *Backend) gatedNormInputs(op string, xt, zt, wt T) (x, z, w []float32, err error) {
	if x, err = b.in(op, "X", xt); err != nil {
		return
	}
	if z, err = b.in(op, "Z", zt); err != nil {
		return
	}
	w, err = b.in(op, "Weight", wt)
	return
}

// GatedRMSNormBackward implements backend.Optional.GatedRMSNormBackward: DX and DZ per row on
// the workers, then GWeight summed over the rows in order in float64 and added once.
func (b *Backend) GatedRMSNormBackward(a backend.GatedRMSNormBackwardArgs) error {
	const op = "gated rmsnorm backward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	x, z, w, err := b.gatedNormInputs(op, a.X, a.Z, a.Weight)
	if err != nil {
		return err
	}
	rstd, err := f32only(op, "RStd", a.RStd)
	if err != nil {
		return err
	}
	dout, err := b.in(op, "DOut", a.DOut)
	if err != nil {
		return err
	}
	dx, flushX, err := b.out(op, "DX", a.DX, false)
	if err != nil {
		return err
	}
	dz, flushZ, err := b.out(op, "DZ", a.DZ, false)
	if err != nil {
		return err
	}
	b.pool.rows(d.R, max(1, convChunk/d.W), func(lo, hi int) {
		dn := make([]float64, d.W)
		for r := lo; r < hi; r++ {
			rs, dot := float64(rstd[r]), 0.0
			for j := 0; j < d.W; j++ {
				i := r*d.W + j
				zj := float64(z[i])
				sg := sigmoid64(zj)
				nv, g := float64(x[i])*rs, float64(dout[i])
				dz[i] = float32(g * nv * float64(w[j]) * sg * (1 + zj*(1-sg)))
				dn[j] = g * float64(w[j]) * zj * sg
				dot += dn[j] * nv
			}
			dot /= float64(d.W)
			for j := 0; j < d.W; j++ {
				i := r*d.W + j
				dx[i] = float32(rs * (dn[j] - float64(x[i])*rs*dot))
			}
		}
	})
	flushX()
	flushZ()
	if a.GWeight.IsNil() {
		return nil
	}
	gw := make([]float64, d.W)
	for r := 0; r < d.R; r++ {
		rs := float64(rstd[r])
		for j := 0; j < d.W; j++ {
			i := r*d.W + j
			zj := float64(z[i])
			gw[j] += float64(dout[i]) * float64(x[i]) * rs * zj * sigmoid64(zj)
		}
	}
	cur, flush, err := b.out(op, "GWeight", a.GWeight, true)
	if err != nil {
		return err
	}
	for j := range cur {
		cur[j] += float32(gw[j])
	}
	flush()
	return nil
}
