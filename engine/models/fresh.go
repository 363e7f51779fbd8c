package models

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/internal/switches"
)

// swGradZero chooses how ZeroGrads clears the gradients of the stacked experts.
var swGradZero = switches.Register(switches.Switch{Name: "HALO_GRAD_ZERO", Kind: switches.Tuning,
	Default: "lazy", Values: []string{"lazy", "fill"},
	Doc: "How an optimizer step starts the gradients of MoE blocks' stacked experts: lazy (not filled: the block's first backward of the step writes them with =, its grouped weight-gradient GEMM writing every expert's block, or zeroes them first on the paths that accumulate; saves the fill and the GEMM's read of the zeros, about 4 bytes per expert parameter) or fill (zeroed with the rest, every write accumulates)."})

// collectFresh lists the gradients that ZeroGrads may leave unfilled: the stacked experts of
// the MoE blocks, gpt-oss's and Gemma 4's beside the MLP included (each written only by its
// block's backward, which takes it from the pass's FreshGrads), with their element ranges in
// the gradient arena.
func (m *Model) collectFresh() {
	m.freshGrads, m.freshRanges = nil, nil
	if m.Grads == nil || m.lora != nil {
		return
	}
	flat := m.Grads.Flat
	el := int64(flat.DType().Size())
	for _, blk := range m.blocks {
		var gs []tensor.Tensor
		switch f := blk.FFN.(type) {
		case *nn.MoE:
			gs = []tensor.Tensor{f.GateUp.GW, f.Down.GW}
		case *nn.OSSMoE:
			gs = []tensor.Tensor{f.GGateUp, f.GDown}
		case *nn.MoEBesideMLP:
			gs = []tensor.Tensor{f.GateUp.GW, f.Down.GW}
		}
		for _, g := range gs {
			if g.IsNil() || g.Buffer() != flat.Buffer() {
				continue
			}
			lo := int((g.Offset() - flat.Offset()) / el)
			m.freshGrads = append(m.freshGrads, g)
			m.freshRanges = append(m.freshRanges, [2]int{lo, lo + g.Numel()})
		}
	}
	slices.SortFunc(m.freshRanges, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
}

// zeroGradsLazily fills every gradient but the fresh ones (the stretches of the arena between
// their ranges) and marks those fresh for the step's passes.
func (m *Model) zeroGradsLazily() error {
	flat := m.Grads.Flat
	fill := func(lo, hi int) error {
		if hi <= lo {
			return nil
		}
		v, err := flat.View(lo, hi-lo)
		if err != nil {
			return fmt.Errorf("models: ZeroGrads: %w", err)
		}
		return m.b.Fill(v, 0)
	}
	at := 0
	for _, r := range m.freshRanges {
		if err := fill(at, r[0]); err != nil {
			return err
		}
		at = max(at, r[1])
	}
	if err := fill(at, flat.Numel()); err != nil {
		return err
	}
	if m.fresh == nil {
		m.fresh = &nn.FreshGrads{}
	}
	m.fresh.Mark(m.freshGrads...)
	return nil
}

// SettleGrads zeroes the gradients that no pass has written since ZeroGrads left them unfilled,
// so that every gradient holds its value: call it before reading the gradients of a step (the
// trainer does, before the gradient norm; every forward-backward does on its way out).
func (m *Model) SettleGrads() error {
	if m.fresh.Len() == 0 {
		return nil
	}
	return m.fresh.Settle(m.b)
}
