package parallel

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/models"
)

// Expert load and aux-loss-free balancing on a plan. Every rank holds the full router of each
// MoE layer and routes its own tokens; ranks of one tensor group route the same tokens, so a
// step's load is the sum over the ranks with tensor coordinate 0 (every data and context rank)
// of their per-expert counts. Every rank then applies the same bias update from that sum, so
// the routers stay identical, and equal to a single-device run over the same micro-batches.

// takeLoads resets every rank's load count and returns the step's loads summed over the
// ranks that route distinct tokens (nil for dense models).
func (p *Plan) takeLoads() ([][]int, error) {
	var sum [][]int
	for _, rk := range p.ranks {
		l := rk.m.TakeExpertLoad()
		if rk.c.TP != 0 || l == nil {
			continue
		}
		if sum == nil {
			sum = make([][]int, len(l))
			for j := range l {
				sum[j] = make([]int, len(l[j]))
			}
		}
		if len(l) != len(sum) {
			return nil, fmt.Errorf("parallel: rank %d counted the load of %d MoE layers, rank 0 of %d", rk.id, len(l), len(sum))
		}
		for j := range l {
			if len(l[j]) != len(sum[j]) {
				return nil, fmt.Errorf("parallel: rank %d: MoE layer %d has %d experts, rank 0 %d", rk.id, j, len(l[j]), len(sum[j]))
			}
			for e, v := range l[j] {
				sum[j][e] += v
			}
		}
	}
	return sum, nil
}

// ExpertLoad returns the tokens routed to each expert of each MoE layer (in layer order) by
// the last ForwardBackward, summed over its rows and every data and context rank (nil for
// dense models). models.(*Model).ExpertLoadStats summarises it.
func (p *Plan) ExpertLoad() [][]int {
	if p.load == nil {
		return nil
	}
	out := make([][]int, len(p.load))
	for j, l := range p.load {
		out[j] = append([]int(nil), l...)
	}
	return out
}

// SetExpertBalancing turns aux-loss-free balancing on (rate > 0) or off (0) on every rank, as
// models.(*Model).SetExpertBalancing does; a non-nil bias (per MoE layer, per expert) replaces
// the zero bias it starts from.
func (p *Plan) SetExpertBalancing(rate float64, bias [][]float32) error {
	for _, rk := range p.ranks {
		if err := rk.m.SetExpertBalancing(rate); err != nil {
			return fmt.Errorf("parallel: rank %d: %w", rk.id, err)
		}
		if bias != nil && rate > 0 {
			if err := rk.m.SetExpertBias(bias); err != nil {
				return fmt.Errorf("parallel: rank %d: %w", rk.id, err)
			}
		}
	}
	return nil
}

// BalanceExperts applies one balancing update on every rank from the load of the last
// ForwardBackward (summed over ranks). Call it after Step; it does nothing when balancing is
// off.
func (p *Plan) BalanceExperts() error {
	if p.load == nil {
		return nil
	}
	for _, rk := range p.ranks {
		if err := rk.m.BalanceExpertsWith(p.load); err != nil {
			return fmt.Errorf("parallel: rank %d: %w", rk.id, err)
		}
	}
	return nil
}

// ExpertBias returns the balancing bias of each MoE layer (the same on every rank; nil when
// balancing is off).
func (p *Plan) ExpertBias() [][]float32 { return p.ranks[0].m.ExpertBias() }

// ExpertBalancing returns the balancing rate (0 when off).
func (p *Plan) ExpertBalancing() float64 { return p.ranks[0].m.ExpertBalancing() }

// copyBalancing gives dst the balancing rate and bias of src.
func copyBalancing(dst, src *models.Model) error {
	rate := src.ExpertBalancing()
	if dst.ExpertBalancing() != rate {
		if err := dst.SetExpertBalancing(rate); err != nil {
			return err
		}
	}
	if rate == 0 {
		return nil
	}
	return dst.SetExpertBias(src.ExpertBias())
}
