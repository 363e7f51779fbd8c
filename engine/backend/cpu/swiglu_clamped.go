package cpu

import (
	"fmt"
	"math"
)

// clampedShape checks gateUp [R, 2I] against out [R, I] and returns R and I.
func clampedShape(op string, out, gateUp T) (r, i int, err error) {
	if gateUp.Rank() != 2 || gateUp.Dim(1)%2 != 0 {
		return 0, 0, fmt.Errorf("cpu: %s: gateUp %v must be [R, 2I]", op, gateUp)
	}
	r, i = gateUp.Dim(0), gateUp.Dim(1)/2
	if out.Numel() != r*i {
		return 0, 0, fmt.Errorf("cpu: %s: out %v must have R*I = %d elements for gateUp %v", op, out, r*i, gateUp)
	}
	return r, i, nil
}

// clampedGate returns, for one gate/up pair, the activation and its two derivatives (zero
// where a clamp holds the input).
func clampedGate(gate, up, alpha, limit float32) (y, dg, du float64) {
	g, u := float64(gate), float64(up)
	l, a := float64(limit), float64(alpha)
	gm, pass := g, 1.0
	if g > l {
		gm, pass = l, 0
	}
	um, passU := u, 1.0
	if u > l {
		um, passU = l, 0
	} else if u < -l {
		um, passU = -l, 0
	}
	s := 1 / (1 + math.Exp(-a*gm))
	glu := gm * s
	y = (um + 1) * glu
	dg = pass * (um + 1) * (s + a*gm*s*(1-s))
	du = passU * glu
	return y, dg, du
}

// SwiGLUClamped implements backend.Ops.SwiGLUClamped.
func (b *Backend) SwiGLUClamped(out, gateUp T, alpha, limit float32) error {
	const op = "swiglu-clamped"
	r, w, err := clampedShape(op, out, gateUp)
	if err != nil {
		return err
	}
	gu, err := b.in(op, "gateUp", gateUp)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(r*w, convChunk, func(lo, hi int) {
		for k := lo; k < hi; k++ {
			y, _, _ := clampedGate(gu[2*k], gu[2*k+1], alpha, limit)
			os[k] = float32(y)
		}
	})
	flush()
	return nil
}

// SwiGLUClampedBackward implements backend.Ops.SwiGLUClampedBackward.
func (b *Backend) SwiGLUClampedBackward(dGateUp, dOut, gateUp T, alpha, limit float32) error {
	const op = "swiglu-clamped-backward"
	r, w, err := clampedShape(op, dOut, gateUp)
	if err != nil {
		return err
	}
	if err := numel(op, "dGateUp", dGateUp, 2*r*w, "R*2I"); err != nil {
		return err
	}
	gu, err := b.in(op, "gateUp", gateUp)
	if err != nil {
		return err
	}
	d, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	dg, flush, err := b.out(op, "dGateUp", dGateUp, false)
	if err != nil {
		return err
	}
	b.pool.rows(r*w, convChunk, func(lo, hi int) {
		for k := lo; k < hi; k++ {
			// Each pair is read before it is written: dGateUp may be gateUp.
			_, g, u := clampedGate(gu[2*k], gu[2*k+1], alpha, limit)
			dg[2*k] = float32(float64(d[k]) * g)
			dg[2*k+1] = float32(float64(d[k]) * u)
		}
	})
	flush()
	return nil
}
