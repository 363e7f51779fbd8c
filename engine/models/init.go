package models

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// InitRandom fills every parameter as transformers' _init_weights does for these families:
// linear weights and embeddings from normal(0, initializer_range), the pad_token_id row of the
// embedding zeroed, RMSNorm weights 1, biases 0. Each parameter draws from its own stream keyed
// by (seed, parameter index in the table of the model holding every expert), so the result
// depends only on the seed and the spec table, and a model holding a subset of the experts gets
// the same values as the full model.
func (m *Model) InitRandom(seed uint64) error {
	std := m.Arch.InitStd
	if !(std > 0) {
		return fmt.Errorf("models: %s: initializer_range must be > 0 for random init, got %v", m.Arch.ModelType, std)
	}
	for i := range m.Specs {
		if err := m.initParam(i, seed); err != nil {
			return err
		}
	}
	return nil
}

// initParam fills parameter i as InitRandom does.
func (m *Model) initParam(i int, seed uint64) error {
	std := m.Arch.InitStd
	if !(std > 0) {
		std = 0.02 // transformers' default initializer_range
	}
	s := m.Specs[i]
	vals := make([]float32, s.Numel())
	switch s.Init {
	case InitNormal:
		k := i
		if m.fullIndex != nil {
			k = m.fullIndex[i]
		}
		rng := rand.New(rand.NewPCG(seed, uint64(k)+1))
		for j := range vals {
			vals[j] = float32(rng.NormFloat64() * std)
		}
		if s.ZeroRow >= 0 && len(s.Shape) == 2 {
			cols := s.Shape[1]
			clear(vals[s.ZeroRow*cols : (s.ZeroRow+1)*cols])
		}
	case InitOnes, InitUnit:
		for j := range vals {
			vals[j] = 1
		}
	case InitLogUniform:
		k := i
		if m.fullIndex != nil {
			k = m.fullIndex[i]
		}
		rng := rand.New(rand.NewPCG(seed, uint64(k)+1))
		for j := range vals {
			vals[j] = float32(math.Log(16 * (1 - rng.Float64())))
		}
	case InitZeros:
	default:
		return fmt.Errorf("models: parameter %s: unknown init %v", s.Name, s.Init)
	}
	if err := m.SetParam(s.Name, vals); err != nil {
		return err
	}
	return nil
}
