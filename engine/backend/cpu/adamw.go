package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// AdamW performs one AdamW update (torch.optim.AdamW semantics; see backend.AdamWArgs).
func (b *Backend) AdamW(a backend.AdamWArgs) error {
	const op = "adamw"
	n := a.Param.Numel()
	for _, c := range []struct {
		name string
		t    T
	}{{"Grad", a.Grad}, {"M", a.M}, {"V", a.V}} {
		if err := numel(op, c.name, c.t, n, "numel(Param)"); err != nil {
			return err
		}
	}
	if a.Step < 1 {
		return fmt.Errorf("cpu: adamw: Step %d must be >= 1 (the count after this update)", a.Step)
	}
	ps, flushP, err := b.out(op, "Param", a.Param, true)
	if err != nil {
		return err
	}
	gs, err := b.in(op, "Grad", a.Grad)
	if err != nil {
		return err
	}
	ms, flushM, err := b.out(op, "M", a.M, true)
	if err != nil {
		return err
	}
	vs, flushV, err := b.out(op, "V", a.V, true)
	if err != nil {
		return err
	}
	var shadow []uint16
	var shadowF []float32
	if !a.Shadow.IsNil() {
		if err := numel(op, "Shadow", a.Shadow, n, "numel(Param)"); err != nil {
			return err
		}
		raw, err := hostBytes(op, "Shadow", a.Shadow)
		if err != nil {
			return err
		}
		switch a.Shadow.DType() {
		case tensor.BF16:
			shadow = u16alias(raw)
		case tensor.F32:
			shadowF = f32alias(raw)
		default:
			return fmt.Errorf("cpu: adamw: Shadow %v must be bf16 or f32", a.Shadow)
		}
	}
	scale := a.GradScale
	if scale == 0 {
		scale = 1
	}
	b1, b2 := a.Beta1, a.Beta2
	bc1 := 1 - math.Pow(float64(b1), float64(a.Step))
	bc2 := 1 - math.Pow(float64(b2), float64(a.Step))
	stepSize := float32(float64(a.LR) / bc1)
	bc2sqrt := float32(math.Sqrt(bc2))
	decay := 1 - a.LR*a.WeightDecay
	w1, w2 := 1-b1, 1-b2
	for _, o := range []struct {
		dst *float32
		v   float32
	}{{&stepSize, a.StepSize}, {&bc2sqrt, a.BC2Sqrt}, {&decay, a.Decay}, {&w1, a.Weight1}, {&w2, a.Weight2}} {
		if o.v != 0 {
			*o.dst = o.v
		}
	}
	sr := a.Stochastic
	pbf := a.Param.DType() == tensor.BF16
	mbf := a.M.DType() == tensor.BF16
	vbf := a.V.DType() == tensor.BF16
	step := uint64(a.Step)
	b.pool.rows(n, convChunk, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			g := gs[i] * scale
			m := ms[i] + w1*(g-ms[i]) // torch: exp_avg.lerp_(grad, 1-beta1)
			v := b2*vs[i] + w2*g*g
			p := ps[i] * decay
			p -= stepSize * m / (float32(math.Sqrt(float64(v)))/bc2sqrt + a.Eps)
			if sr {
				e := uint64(i)
				if pbf {
					p = tensor.BF16ToF32(tensor.F32ToBF16Stochastic(p, backend.SRBits(a.Seed, step, a.ParamIndex, 0, e)))
				}
				if mbf {
					m = tensor.BF16ToF32(tensor.F32ToBF16Stochastic(m, backend.SRBits(a.Seed, step, a.ParamIndex, 1, e)))
				}
				if vbf {
					v = tensor.BF16ToF32(tensor.F32ToBF16Stochastic(v, backend.SRBits(a.Seed, step, a.ParamIndex, 2, e)))
				}
			}
			ps[i], ms[i], vs[i] = p, m, v
			if shadow != nil {
				if sr {
					shadow[i] = tensor.F32ToBF16Stochastic(p, backend.SRBits(a.Seed, step, a.ParamIndex, 3, uint64(i)))
				} else {
					shadow[i] = tensor.F32ToBF16(p)
				}
			} else if shadowF != nil {
				shadowF[i] = p
			}
		}
	})
	// Stochastically rounded values are already exact bf16 numbers, so the flush's
	// round-to-nearest stores them unchanged.
	flushP()
	flushM()
	flushV()
	return nil
}
