package nn

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// PerLayerInput is the stage Gemma 4 adds at the end of a decoder layer for its per-layer
// input embeddings (PLE): with h the layer's output so far and pl this layer's per-layer
// input [N,P],
//
//	y = h + Norm(Proj(gelu_tanh(Gate(h)) * pl))
//
// Gate W [P,C], Proj W [C,P]. The per-layer inputs of all layers are one [N, L*P] tensor that
// the model computes before the layers (In) and whose gradient it collects (DIn, +=); this
// layer's are columns [Col, Col+P).
//
// Cached for backward: h (owned), Gate(h), pl, their product, Proj's output and the norm's rstd.
type PerLayerInput struct {
	Name       string
	Gate, Proj Linear
	Norm       RMSNorm
	// In [N, L*P] is set by the model before the forward and DIn [N, L*P] (zeroed, +=) before
	// the backward; Col is this layer's first column.
	In, DIn T
	Col     int

	h, g, pl, a, o, ro T
	live               bool
}

// width is P.
func (s *PerLayerInput) width() int { return s.Gate.W.Dim(0) }

// Forward takes h [N,C] (owned: it is cached or freed) and returns the layer's new output.
func (s *PerLayerInput) Forward(p *Pass, h T, keep bool) (y T, err error) {
	if s.live {
		_ = free(p.B, &h)
		return T{}, fmt.Errorf("nn: %s: Forward called twice without Backward or Release", s.Name)
	}
	if s.In.IsNil() {
		_ = free(p.B, &h)
		return T{}, fmt.Errorf("nn: %s: the model set no per-layer inputs", s.Name)
	}
	s.h, s.live = h, true
	defer func() {
		if err != nil || !keep {
			s.Release(p)
		}
	}()
	pw := s.width()
	if s.g, err = s.Gate.Forward(p, h); err != nil {
		return T{}, err
	}
	if s.pl, err = p.out(p.N, pw); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: s.pl, Src: s.In, Groups: 1, Width: pw, SrcOffset: s.Col}); err != nil {
		return T{}, wrap(s.Name+" per-layer input", err)
	}
	if s.a, err = p.out(p.N, pw); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if err = p.B.GeGLU(s.a, s.g, s.pl); err != nil {
		return T{}, wrap(s.Name, err)
	}
	if s.o, err = s.Proj.Forward(p, s.a); err != nil {
		return T{}, err
	}
	if y, s.ro, err = s.Norm.Forward(p, s.o); err != nil {
		return T{}, err
	}
	if err = p.B.Add(y, h, y); err != nil {
		_ = free(p.B, &y)
		return T{}, wrap(s.Name+" residual", err)
	}
	return y, nil
}

// Backward turns dy (the gradient of the output) into the gradient of h, in place, and adds
// the gradient of the per-layer input into DIn.
func (s *PerLayerInput) Backward(p *Pass, dy T) (err error) {
	if !s.live {
		return fmt.Errorf("nn: %s: Backward without a cached Forward", s.Name)
	}
	if s.DIn.IsNil() {
		return fmt.Errorf("nn: %s: the model set no gradient for the per-layer inputs", s.Name)
	}
	defer s.Release(p)
	var do, da T
	defer func() { _ = free(p.B, &do, &da) }()
	if do, err = p.out(s.o.Shape()...); err != nil {
		return wrap(s.Name, err)
	}
	if err = s.Norm.Backward(p, do, dy, s.o, s.ro, false); err != nil {
		return err
	}
	if da, err = p.out(s.a.Shape()...); err != nil {
		return wrap(s.Name, err)
	}
	if err = s.Proj.Backward(p, da, do, s.a, false); err != nil {
		return err
	}
	// dGate and dPl overwrite the cached gate output and per-layer input.
	if err = p.B.GeGLUBackward(s.g, s.pl, da, s.g, s.pl); err != nil {
		return wrap(s.Name, err)
	}
	if err = p.B.CopyColumns(backend.ColumnCopyArgs{Dst: s.DIn, Src: s.pl, Groups: 1, Width: s.width(), DstOffset: s.Col, Accumulate: true}); err != nil {
		return wrap(s.Name+" per-layer input", err)
	}
	return s.Gate.Backward(p, dy, s.g, s.h, true)
}

// Release frees the cache without a backward.
func (s *PerLayerInput) Release(p *Pass) {
	_ = free(p.B, &s.h, &s.g, &s.pl, &s.a, &s.o, &s.ro)
	s.live = false
}
