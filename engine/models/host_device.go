package models

import (
	"errors"
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// hostOnDevice reports whether the host decoder runs through the backend's ops
// (nn.DSV4Device) rather than on the host tape (HALO_DSV4_PATH).
func (m *Model) hostOnDevice() bool {
	return nn.DSV4OnDevice(m.b.Name(), m.b.Optional().DSV4 != nil)
}

// deviceRun is hostRun through the backend's ops: the parameters stay where the model keeps
// them, each document runs nn.DSV4Device to its final hidden states, and the LM head's
// CrossEntropy gives each token's log-probability; with seed set its gradients are
// back-propagated into the gradient arena.
func (m *Model) deviceRun(r *resolved, seed func(lp []float32) ([]float64, error)) (lp []float32, err error) {
	train := seed != nil
	if train {
		if err := m.EnableGrads(); err != nil {
			return nil, err
		}
	}
	dev, head, headG, err := m.deviceDecoder(train)
	if err != nil {
		return nil, err
	}
	tape := nn.NewDevTape(m.b, train)
	defer func() { err = errors.Join(err, tape.Close(), dev.Close()) }()
	type doc struct {
		lo, hi  int
		hidden  *nn.DVar
		targets tensor.Tensor
	}
	var docs []doc
	lp = make([]float32, len(r.tokens))
	for d := 0; d+1 < len(r.cu); d++ {
		lo, hi := int(r.cu[d]), int(r.cu[d+1])
		ids := make([]int, hi-lo)
		tg := make([]int32, hi-lo)
		for i := range ids {
			if int(r.positions[lo+i]) != i {
				return nil, fmt.Errorf("models: %s: token %d has position %d; the decoder numbers each document's tokens from 0", m.Arch.ModelType, lo+i, r.positions[lo+i])
			}
			ids[i] = int(r.tokens[lo+i])
			tg[i] = backend.IgnoreIndex
			if r.targets != nil && r.targets[lo+i] != backend.IgnoreIndex {
				tg[i] = r.targets[lo+i]
				if tg[i] < 0 || int(tg[i]) >= m.Arch.Vocab {
					return nil, fmt.Errorf("models: target %d at token %d is outside the vocabulary of %d", tg[i], lo+i, m.Arch.Vocab)
				}
			}
		}
		h, err := dev.Hidden(tape, ids)
		if err != nil {
			return nil, err
		}
		tt, err := backend.FromInt32(m.b, tg, len(tg))
		if err != nil {
			return nil, err
		}
		tape.Own(tt)
		lpT, err := m.b.Alloc(tensor.F32, len(tg))
		if err != nil {
			return nil, err
		}
		tape.Own(lpT)
		if err := m.b.CrossEntropy(backend.CrossEntropyArgs{Hidden: h.V, Weight: head, Targets: tt, LogProb: lpT}); err != nil {
			return nil, fmt.Errorf("models: %s LM head: %w", m.Arch.ModelType, err)
		}
		v, err := backend.ToFloat32(m.b, lpT)
		if err != nil {
			return nil, err
		}
		for i, x := range v {
			if tg[i] != backend.IgnoreIndex {
				lp[lo+i] = x
			}
		}
		docs = append(docs, doc{lo: lo, hi: hi, hidden: h, targets: tt})
	}
	if !train {
		return lp, nil
	}
	g, err := seed(lp)
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		// CrossEntropy's backward is GradScale·TokenScale·d(-logprob): TokenScale = -g gives
		// each token's gradient g with respect to its log-probability.
		scale := make([]float32, d.hi-d.lo)
		for i := range scale {
			scale[i] = -float32(g[d.lo+i])
		}
		st, err := backend.FromFloat32(m.b, scale, tensor.F32, len(scale))
		if err != nil {
			return nil, err
		}
		tape.Own(st)
		dh, err := tape.Grad(d.hidden)
		if err != nil {
			return nil, err
		}
		a := backend.CrossEntropyArgs{Hidden: d.hidden.V, Weight: head, Targets: d.targets, DHidden: dh, GradScale: 1, TokenScale: st}
		if !headG.IsNil() {
			a.DWeight = headG
		}
		// DHidden is written (=); it is the hidden states' only gradient.
		if err := m.b.CrossEntropy(a); err != nil {
			return nil, fmt.Errorf("models: %s LM head backward: %w", m.Arch.ModelType, err)
		}
	}
	if err := tape.Backward(); err != nil {
		return nil, err
	}
	return lp, nil
}

// deviceDecoder builds the device decoder over the model's parameters (their gradients when
// train) and returns it with the LM head's weight and gradient.
func (m *Model) deviceDecoder(train bool) (*nn.DSV4Device, tensor.Tensor, tensor.Tensor, error) {
	base, err := m.Family.Host.decoder(m, func(string) *nn.HVar { return nil })
	if err != nil {
		return nil, tensor.Tensor{}, tensor.Tensor{}, err
	}
	param := func(name string) (tensor.Tensor, tensor.Tensor, error) {
		if name == nameLMHead && m.Arch.Tied {
			name = nameEmbed
		}
		w, ok := m.Params.Get(name)
		if !ok {
			return tensor.Tensor{}, tensor.Tensor{}, fmt.Errorf("models: %s has no parameter %s", m.Arch.ModelType, name)
		}
		var g tensor.Tensor
		if train {
			g, _ = m.Grads.Get(name)
		}
		return w, g, nil
	}
	dev, err := nn.NewDSV4Device(base.Cfg, m.b, m.DType(), param, base.Tid2Eid)
	if err != nil {
		return nil, tensor.Tensor{}, tensor.Tensor{}, err
	}
	head, headG, err := param(nameLMHead)
	if err != nil {
		_ = dev.Close()
		return nil, tensor.Tensor{}, tensor.Tensor{}, err
	}
	return dev, head, headG, nil
}
