package models

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// recomputes reports whether the model generates without a KV cache: a family with a decoder
// of its own (deepseek_v4), or one whose attention keeps no cache (jetmoe's mixture of
// attention heads).
func (m *Model) recomputes() bool {
	if m.Family.Host != nil {
		return true
	}
	if m.cfg != nil {
		if f := m.cfg.Family(); f != nil && f.MoA {
			return true
		}
	}
	return false
}

// generateRecompute is GenerateBatch for the models that keep no KV cache (recomputes): each
// new token of a row re-runs the row's whole sequence (deepseek_v4 on its device decoder or
// the host tape, as HALO_DSV4_PATH says; the others through NextLogits) and samples from its
// last position's logits, so a row of n tokens costs n forwards of growing length.
// Sampling, streaming and stopping are GenerateBatch's (each row its own stream).
func (m *Model) generateRecompute(prompts [][]int32, o BatchGenerateOptions) (_ [][]int32, err error) {
	if m.Family.Host != nil && (m.lora != nil || m.quant != nil) {
		return nil, m.errHostOnly("adapters or 4-bit base")
	}
	rngs := make([]*rand.Rand, len(prompts))
	seqs := make([][]int32, len(prompts))
	running := make([]int, len(prompts))
	for r := range prompts {
		rngs[r], seqs[r], running[r] = rowRNG(o.Seed, r), slices.Clone(prompts[r]), r
	}
	next, done, err := m.nextLogitsFunc()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, done()) }()
	out := make([][]int32, len(prompts))
	for step := 0; len(running) > 0; step++ {
		logits := make([][]float32, len(running))
		for i, r := range running {
			var err error
			if logits[i], err = next(seqs[r]); err != nil {
				return out, fmt.Errorf("models: Generate: row %d: %w", r, err)
			}
		}
		ids, bad := sampleRows(logits, running, o.GenerateOptions, rngs)
		if bad >= 0 {
			return out, fmt.Errorf("models: Generate: row %d has NaN logits at new token %d: the weights or activations are not finite", running[bad], step)
		}
		var keep []int
		for i, r := range running {
			out[r] = append(out[r], ids[i])
			seqs[r] = append(seqs[r], ids[i])
			if o.OnRowToken != nil {
				if err := o.OnRowToken(r, ids[i]); err != nil {
					return out, err
				}
			}
			if !slices.Contains(o.StopIDs, ids[i]) && len(out[r]) < o.MaxNewTokens {
				keep = append(keep, r)
			}
		}
		running = keep
	}
	return out, nil
}

// nextLogitsFunc returns a function that runs one sequence without a cache and returns the
// logits [V] of its last position: through the family's own decoder where it has one (built
// once, the host tape's parameters downloaded once, for every call), else NextLogits; and a
// function that releases the decoder.
func (m *Model) nextLogitsFunc() (next func(seq []int32) ([]float32, error), done func() error, err error) {
	if m.Family.Host == nil {
		return m.NextLogits, func() error { return nil }, nil
	}
	ids := func(seq []int32) ([]int, error) {
		out := make([]int, len(seq))
		for i, id := range seq {
			if id < 0 || int(id) >= m.Arch.Vocab {
				return nil, fmt.Errorf("token id %d at %d is outside the vocabulary of %d", id, i, m.Arch.Vocab)
			}
			out[i] = int(id)
		}
		return out, nil
	}
	if !m.hostOnDevice() {
		// The leaves hold the parameters; each call runs on a tape of its own over them.
		var leafTape nn.HostTape
		_, dec, err := m.hostTapeDecoder(&leafTape)
		if err != nil {
			return nil, nil, err
		}
		return func(seq []int32) ([]float32, error) {
			x, err := ids(seq)
			if err != nil {
				return nil, err
			}
			var tape nn.HostTape
			l, err := dec.Logits(&tape, x)
			if err != nil {
				return nil, err
			}
			out := make([]float32, l.C)
			for j := range out {
				out[j] = float32(l.V[(l.R-1)*l.C+j])
			}
			return out, nil
		}, func() error { return nil }, nil
	}
	dev, _, _, err := m.deviceDecoder(false)
	if err != nil {
		return nil, nil, err
	}
	return func(seq []int32) ([]float32, error) {
		x, err := ids(seq)
		if err != nil {
			return nil, err
		}
		tape := nn.NewDevTape(m.b, false)
		h, err := dev.Hidden(tape, x)
		var out []float32
		if err == nil {
			out, err = m.headLogits(h.V)
		}
		return out, errors.Join(err, tape.Close())
	}, dev.Close, nil
}

// headLogits applies the LM head to the last row of hidden [T, C] and returns its logits [V].
func (m *Model) headLogits(hidden tensor.Tensor) ([]float32, error) {
	head, err := m.paramOrTied(nameLMHead)
	if err != nil {
		return nil, err
	}
	last, err := hidden.Rows(hidden.Dim(0)-1, hidden.Dim(0))
	if err != nil {
		return nil, err
	}
	l, err := m.b.Alloc(m.DType(), 1, m.Arch.Vocab)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(l)
	if err := m.b.Linear(l, last, head, tensor.Tensor{}); err != nil {
		return nil, err
	}
	return backend.ToFloat32(m.b, l)
}

// paramOrTied is the parameter name, the embedding for a tied LM head.
func (m *Model) paramOrTied(name string) (tensor.Tensor, error) {
	if name == nameLMHead && m.Arch.Tied {
		name = nameEmbed
	}
	t, ok := m.Params.Get(name)
	if !ok {
		return tensor.Tensor{}, fmt.Errorf("models: %s has no parameter %s", m.Arch.ModelType, name)
	}
	return t, nil
}
