package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// QuantWeight is a linear layer's frozen base weight stored in 4-bit NormalFloat (QLoRA): the
// packed codes and block scales live on the device (Dev, uploaded by NewQuantWeight), and each
// pass that multiplies with the weight produces it in bf16 into the pass's WeightScratch,
// which every quantised layer of the model shares, so that one layer's bf16 weight exists at a
// time. Host keeps the host copy of the same state for backends without the device op.
type QuantWeight struct {
	O, I int                    // the weight's shape [O, I]
	Dev  backend.DequantNF4Args // device state (Out unset)
	Host *quant.Weight
}

// NewQuantWeight uploads w (shape [O, I]) to b.
func NewQuantWeight(b backend.Backend, w *quant.Weight) (*QuantWeight, error) {
	if len(w.Shape) != 2 {
		return nil, fmt.Errorf("nn: a quantised linear weight is [O, I]; got shape %v", w.Shape)
	}
	dev, err := backend.UploadNF4(b, w)
	if err != nil {
		return nil, err
	}
	return &QuantWeight{O: w.Shape[0], I: w.Shape[1], Dev: dev, Host: w}, nil
}

// Bytes is the device memory the quantised weight holds.
func (q *QuantWeight) Bytes() int64 {
	var n int64
	for _, t := range []T{q.Dev.Packed, q.Dev.Absmax, q.Dev.NestedAbsmax, q.Dev.NestedMap} {
		if !t.IsNil() {
			n += t.Bytes()
		}
	}
	return n
}

// Free releases the device state.
func (q *QuantWeight) Free(b backend.Backend) { backend.FreeNF4(b, q.Dev) }

// Dequantize writes the weight into dst [O, I] (bf16, or f32 through a bf16 copy in the
// scratch), with the backend's DequantNF4 when it has one, else on the host and uploaded.
func (q *QuantWeight) Dequantize(p *Pass, dst T) error {
	if dst.Numel() != q.O*q.I {
		return fmt.Errorf("nn: dequantising a [%d, %d] weight into %v", q.O, q.I, dst)
	}
	if dst.DType() != tensor.BF16 {
		return fmt.Errorf("nn: a quantised weight dequantises to bf16, not %s", dst.DType())
	}
	if f := p.B.Optional().DequantNF4; f != nil {
		a := q.Dev
		a.Out = dst
		return f(a)
	}
	host := make([]uint16, q.O*q.I)
	if err := q.Host.DequantizeBF16(host); err != nil {
		return err
	}
	raw := make([]byte, 2*len(host))
	for i, v := range host {
		raw[2*i], raw[2*i+1] = byte(v), byte(v>>8)
	}
	return p.B.Upload(dst, raw)
}

// WeightScratch is the buffer quantised layers produce their bf16 weight into, shared by every
// layer of a model and reused across passes: it grows to the largest weight it has held (plus
// an f32 twin for f32 passes) and is freed with Free. The weight a layer gets from it is valid
// until the next layer asks for its own.
type WeightScratch struct {
	bf16, f32 T
}

// view returns a [o, i] tensor of dt at the start of the scratch, growing it as needed.
func (s *WeightScratch) view(b backend.Backend, dt tensor.DType, o, i int) (T, error) {
	buf := &s.bf16
	if dt == tensor.F32 {
		buf = &s.f32
	}
	if buf.IsNil() || buf.Numel() < o*i {
		if !buf.IsNil() {
			if err := b.Free(*buf); err != nil {
				return T{}, err
			}
			*buf = T{}
		}
		t, err := b.Empty(dt, o*i)
		if err != nil {
			return T{}, fmt.Errorf("nn: weight scratch of %d elements: %w", o*i, err)
		}
		*buf = t
	}
	return tensor.New(buf.Buffer(), buf.Offset(), dt, o, i)
}

// Bytes is the device memory the scratch holds.
func (s *WeightScratch) Bytes() int64 {
	var n int64
	for _, t := range []T{s.bf16, s.f32} {
		if !t.IsNil() {
			n += t.Bytes()
		}
	}
	return n
}

// Free releases the scratch.
func (s *WeightScratch) Free(b backend.Backend) error { return free(b, &s.bf16, &s.f32) }

// quantWeight produces l.Quant's weight in the pass dtype in the scratch.
func (l *Linear) quantWeight(p *Pass) (T, error) {
	if p.Scratch == nil {
		return T{}, fmt.Errorf("nn: %s has a quantised weight but the pass has no WeightScratch", l.Name)
	}
	if !l.GW.IsNil() {
		return T{}, fmt.Errorf("nn: %s: a quantised base weight is frozen; it cannot have a gradient (GW)", l.Name)
	}
	q := l.Quant
	w, err := p.Scratch.view(p.B, tensor.BF16, q.O, q.I)
	if err != nil {
		return T{}, err
	}
	if err := q.Dequantize(p, w); err != nil {
		return T{}, err
	}
	if p.DType == tensor.BF16 {
		return w, nil
	}
	w32, err := p.Scratch.view(p.B, p.DType, q.O, q.I)
	if err != nil {
		return T{}, err
	}
	return w32, p.B.Copy(w32, w)
}
