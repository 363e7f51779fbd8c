package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The shared expert of a MoE block, optionally gated (Qwen2-MoE):
//
//	s[n]   = sigmoid(x[n] @ SharedGate^T)      [N] (fp32)
//	out[n] = s[n] * Shared(x[n])               [N,C]
//
// Backward: ds[n] = dout[n] . Shared(x[n]) (RowDot), dz = s(1-s) ds into SharedGate, and
// s[n] * dout[n] into Shared. Where the backend has the MoE router ops the sigmoid and its
// derivative run on the device as a one-expert sigmoid router (MoERoute with E = K = 1: the
// weight is sigmoid(z); MoERouteBackward gives s(1-s) ds), so the gate reads nothing back;
// elsewhere they run on the host. Cached for backward (keep): s on the device (with the
// router's one-expert selection on the device path) and the ungated Shared output [N,C];
// Shared caches its own activations.

type sharedGateCache struct {
	s    T // [N] F32 gate values (a view of sOwn on the device path)
	sOwn T // [N,1] F32: the one-expert router's weights, owned (device path)
	sel  T // [N,1] I32: its selection (device path)
	y    T // [N,C] ungated shared output (kept for the gate's gradient)
	x    T // [N,C] the block input (not owned)
}

func (c *sharedGateCache) release(p *Pass) {
	if !c.sOwn.IsNil() {
		c.s = T{}
	}
	_ = free(p.B, &c.s, &c.sOwn, &c.sel, &c.y)
	c.x = T{}
}

// gateRouting is the one-expert sigmoid router that computes the gate on the device.
var gateRouting = backend.MoERouting{Score: backend.RouterSigmoid, TopK: 1}

// deviceGate sets c.s (and c.sOwn, c.sel) to sigmoid(z) on the device, z [N,1].
func (m *MoE) deviceGate(p *Pass, o backend.Optional, z T) error {
	c := &m.sg
	n := z.Dim(0)
	probs, err := p.outF32(n, 1)
	if err != nil {
		return wrap(m.Name+" shared gate", err)
	}
	defer func() { _ = free(p.B, &probs) }()
	if c.sOwn, err = p.outF32(n, 1); err == nil {
		if c.sel, err = p.B.Empty(tensor.I32, n, 1); err == nil {
			if err = o.MoERoute(backend.MoERouteArgs{MoERouting: gateRouting, Logits: z, Probs: probs, Sel: c.sel, Weights: c.sOwn}); err == nil {
				c.s, err = c.sOwn.Reshape(n)
			}
		}
	}
	return wrap(m.Name+" shared gate", err)
}

// sharedForward returns the (gated) shared expert output [N,C], a new tensor.
func (m *MoE) sharedForward(p *Pass, x T, keep bool) (ys T, err error) {
	if ys, err = m.Shared.Forward(p, x, keep); err != nil || m.SharedGate == nil {
		return ys, err
	}
	c := &m.sg
	defer func() {
		if err != nil {
			_ = free(p.B, &ys)
			c.release(p)
		} else if !keep {
			c.release(p)
		}
	}()
	z, err := m.SharedGate.Forward(p, x)
	if err != nil {
		return T{}, err
	}
	if z.Rank() != 2 || z.Dim(0) != x.Dim(0) || z.Dim(1) != 1 {
		_ = free(p.B, &z)
		return T{}, fmt.Errorf("nn: %s: shared expert gate gives %v for %d tokens; its weight must be [1, C]", m.Name, z, x.Dim(0))
	}
	if o := p.B.Optional(); o.MoERoute != nil && o.MoERouteBackward != nil {
		err = m.deviceGate(p, o, z)
		_ = free(p.B, &z)
		if err != nil {
			return T{}, err
		}
		return m.gateOutput(p, x, ys, keep)
	}
	zv, err := backend.ToFloat32(p.B, z)
	_ = free(p.B, &z)
	if err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	if len(zv) != x.Dim(0) {
		return T{}, fmt.Errorf("nn: %s: shared expert gate gives %d values for %d tokens; its weight must be [1, C]", m.Name, len(zv), x.Dim(0))
	}
	sv := make([]float32, len(zv))
	for i, v := range zv {
		sv[i] = float32(1 / (1 + math.Exp(-float64(v))))
	}
	if c.s, err = backend.FromFloat32(p.B, sv, tensor.F32, len(sv)); err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	return m.gateOutput(p, x, ys, keep)
}

// gateOutput keeps what the backward needs and scales the shared output ys by the gate c.s.
func (m *MoE) gateOutput(p *Pass, x, ys T, keep bool) (T, error) {
	c := &m.sg
	var err error
	if keep {
		c.x = x
		if c.y, err = p.out(ys.Shape()...); err == nil {
			err = p.B.Copy(c.y, ys)
		}
		if err != nil {
			return T{}, wrap(m.Name+" shared gate", err)
		}
	}
	if err = p.B.ScaleRows(ys, c.s); err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	return ys, nil
}

// sharedBackward returns a new dx [N,C] through the (gated) shared expert and accumulates its
// parameter gradients (and the gate's).
func (m *MoE) sharedBackward(p *Pass, dy T) (dx T, err error) {
	if m.SharedGate == nil {
		return m.Shared.Backward(p, dy)
	}
	c := &m.sg
	defer c.release(p)
	if c.s.IsNil() || c.y.IsNil() {
		return T{}, fmt.Errorf("nn: %s: shared gate Backward without a cached Forward", m.Name)
	}
	n := dy.Dim(0)
	var ds, dz T
	defer func() { _ = free(p.B, &ds, &dz) }()
	if ds, err = p.allocF32(n); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = p.B.RowDot(ds, dy, c.y); err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	if !c.sOwn.IsNil() {
		// Device path: dz = s(1-s) ds from the one-expert router's backward.
		var ds1 T
		if ds1, err = ds.Reshape(n, 1); err == nil {
			if dz, err = p.out(n, 1); err == nil {
				err = p.B.Optional().MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: gateRouting, Probs: c.sOwn, Sel: c.sel,
					Weights: c.sOwn, DWeights: ds1, DLogits: dz})
			}
		}
		if err != nil {
			return T{}, wrap(m.Name+" shared gate", err)
		}
		return m.gatedSharedBackward(p, dy, dz)
	}
	dsv, err := backend.ToFloat32(p.B, ds)
	if err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	sv, err := backend.ToFloat32(p.B, c.s)
	if err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	dzv := make([]float32, n)
	for i := range dzv {
		s := float64(sv[i])
		dzv[i] = float32(s * (1 - s) * float64(dsv[i]))
	}
	if dz, err = p.alloc(n, 1); err != nil {
		return T{}, wrap(m.Name, err)
	}
	if err = upload(p.B, dz, dzv); err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	return m.gatedSharedBackward(p, dy, dz)
}

// gatedSharedBackward runs the shared expert's backward on s * dy and the gate's on dz [N,1].
func (m *MoE) gatedSharedBackward(p *Pass, dy, dz T) (dx T, err error) {
	c := &m.sg
	var dys T
	defer func() { _ = free(p.B, &dys) }()
	if dys, err = p.out(dy.Shape()...); err == nil {
		if err = p.B.Copy(dys, dy); err == nil {
			err = p.B.ScaleRows(dys, c.s)
		}
	}
	if err != nil {
		return T{}, wrap(m.Name+" shared gate", err)
	}
	if dx, err = m.Shared.Backward(p, dys); err != nil {
		return T{}, err
	}
	if err = m.SharedGate.Backward(p, dx, dz, c.x, true); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}
