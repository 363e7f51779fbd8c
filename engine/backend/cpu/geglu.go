package cpu

import "math"

// geluTanhC is sqrt(2/pi), the constant of the tanh approximation of GELU.
const geluTanhC = 0.7978845608028654

// geluTanh returns gelu_tanh(g) and its derivative, computed in float64 and used by both GeGLU
// directions so that the two agree with each other:
//
//	t  = tanh(c * (g + 0.044715 g^3))
//	y  = g/2 * (1 + t)
//	y' = (1 + t)/2 + g/2 * (1 - t^2) * c * (1 + 3 * 0.044715 g^2)
func geluTanh(g float32) (y, dy float64) {
	x := float64(g)
	t := math.Tanh(geluTanhC * (x + 0.044715*x*x*x))
	y = 0.5 * x * (1 + t)
	dy = 0.5*(1+t) + 0.5*x*(1-t*t)*geluTanhC*(1+3*0.044715*x*x)
	return y, dy
}

// GeGLU computes out = gelu_tanh(gate) * up.
func (b *Backend) GeGLU(out, gate, up T) error {
	const op = "geglu"
	n := gate.Numel()
	if err := numel(op, "up", up, n, "numel(gate)"); err != nil {
		return err
	}
	if err := numel(op, "out", out, n, "numel(gate)"); err != nil {
		return err
	}
	gs, err := b.in(op, "gate", gate)
	if err != nil {
		return err
	}
	us, err := b.in(op, "up", up)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(n, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			y, _ := geluTanh(gs[i])
			os[i] = float32(y * float64(us[i]))
		}
	})
	flush()
	return nil
}

// GeGLUBackward computes dGate = dOut * up * gelu_tanh'(gate) and dUp = dOut * gelu_tanh(gate).
func (b *Backend) GeGLUBackward(dGate, dUp, dOut, gate, up T) error {
	const op = "geglu-backward"
	n := gate.Numel()
	for _, c := range []struct {
		name string
		t    T
	}{{"up", up}, {"dOut", dOut}, {"dGate", dGate}, {"dUp", dUp}} {
		if err := numel(op, c.name, c.t, n, "numel(gate)"); err != nil {
			return err
		}
	}
	gs, err := b.in(op, "gate", gate)
	if err != nil {
		return err
	}
	us, err := b.in(op, "up", up)
	if err != nil {
		return err
	}
	ds, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	dg, flushG, err := b.out(op, "dGate", dGate, false)
	if err != nil {
		return err
	}
	du, flushU, err := b.out(op, "dUp", dUp, false)
	if err != nil {
		return err
	}
	b.pool.rows(n, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			y, dy := geluTanh(gs[i])
			d := float64(ds[i])
			dg[i] = float32(d * float64(us[i]) * dy)
			du[i] = float32(d * y)
		}
	})
	flushG()
	flushU()
	return nil
}

// GeGLUPacked implements backend.Optional.GeGLUPacked with GeGLU's arithmetic.
func (b *Backend) GeGLUPacked(out, gateUp T) error {
	return b.packedRows("geglu-packed", out, gateUp, func(g, u, dst, _ []float32) {
		for i, gv := range g {
			y, _ := geluTanh(gv)
			dst[i] = float32(y * float64(u[i]))
		}
	})
}

// GeGLUPackedBackward implements backend.Optional.GeGLUPackedBackward with GeGLUBackward's
// arithmetic.
func (b *Backend) GeGLUPackedBackward(dGateUp, dOut, gateUp T) error {
	return b.packedBackwardRows("geglu-packed-backward", dGateUp, dOut, gateUp, func(g, u, d, dg, du, _ []float32) {
		for i, gv := range g {
			y, dy := geluTanh(gv)
			dv := float64(d[i])
			dg[i] = float32(dv * float64(u[i]) * dy)
			du[i] = float32(dv * y)
		}
	})
}
