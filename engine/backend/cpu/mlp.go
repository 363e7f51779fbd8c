package cpu

// sigmoidInto sets s[i] = 1/(1+exp(-g[i])) using the vector exp.
func sigmoidInto(s, g []float32) {
	s = s[:len(g)]
	for i, v := range g {
		s[i] = -v
	}
	expVec(s, s)
	for i, e := range s {
		s[i] = 1 / (1 + e)
	}
}

// SwiGLU computes out = silu(gate) * up.
func (b *Backend) SwiGLU(out, gate, up T) error {
	const op = "swiglu"
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
		sb := getScratch(hi - lo)
		defer putScratch(sb)
		sg := *sb
		sigmoidInto(sg, gs[lo:hi])
		for i := lo; i < hi; i++ {
			g := gs[i]
			os[i] = g * sg[i-lo] * us[i]
		}
	})
	flush()
	return nil
}

// SwiGLUBackward computes dGate = dOut*up*silu'(gate) and dUp = dOut*silu(gate), with
// silu'(g) = s(g)*(1 + g*(1-s(g))).
func (b *Backend) SwiGLUBackward(dGate, dUp, dOut, gate, up T) error {
	const op = "swiglu-backward"
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
		sb := getScratch(hi - lo)
		defer putScratch(sb)
		sg := *sb
		sigmoidInto(sg, gs[lo:hi])
		for i := lo; i < hi; i++ {
			g, u, d := gs[i], us[i], ds[i]
			s := sg[i-lo]
			dg[i] = d * u * s * (1 + g*(1-s))
			du[i] = d * g * s
		}
	})
	flushG()
	flushU()
	return nil
}
