package nn

import (
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// FreshGrads is the set of gradient tensors that hold no values yet in this optimizer step:
// the model's ZeroGrads leaves them unfilled (HALO_GRAD_ZERO=lazy), and the first write of the
// step must overwrite them, as torch's gradients set to None are assigned by their first
// backward. A layer that owns such a gradient takes it (Take) before writing: a taken fresh
// gradient is written with = by an op that writes every element, or zeroed (Zero) and then
// accumulated into. Whatever is still fresh when the gradients are read is zeroed (Settle).
//
// What this saves is the zero fill of those gradients and, in the op that writes them, the
// read of the zeros it would add to: for the stacked experts of a MoE model, most of the
// model's gradient bytes, twice.
type FreshGrads struct {
	mu    sync.Mutex
	fresh map[freshKey]T
}

// freshKey identifies a tensor by its memory: the buffer, the byte offset and the byte size.
type freshKey struct {
	buf   tensor.Buffer
	off   int64
	bytes int64
}

func keyOf(t T) freshKey { return freshKey{t.Buffer(), t.Offset(), t.Bytes()} }

// Mark adds ts to the set (zero tensors are skipped).
func (f *FreshGrads) Mark(ts ...T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fresh == nil {
		f.fresh = map[freshKey]T{}
	}
	for _, t := range ts {
		if !t.IsNil() {
			f.fresh[keyOf(t)] = t
		}
	}
}

// Take reports whether t is fresh and removes it from the set: the caller's write is the first
// of the step. A nil set, or a tensor never marked, is not fresh.
func (f *FreshGrads) Take(t T) bool {
	if f == nil || t.IsNil() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k := keyOf(t)
	_, ok := f.fresh[k]
	delete(f.fresh, k)
	return ok
}

// Zero takes t and, if it was fresh, fills it with zeros: for a writer that only accumulates.
func (f *FreshGrads) Zero(b backend.Backend, t T) error {
	if !f.Take(t) {
		return nil
	}
	return b.Fill(t, 0)
}

// Len is the number of fresh tensors.
func (f *FreshGrads) Len() int {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.fresh)
}

// Settle zeroes every tensor still fresh (no layer wrote it this step) and empties the set.
func (f *FreshGrads) Settle(b backend.Backend) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	rest := f.fresh
	f.fresh = nil
	f.mu.Unlock()
	for _, t := range rest {
		if err := b.Fill(t, 0); err != nil {
			return err
		}
	}
	return nil
}

// zeroFresh zeroes those of a MoE block's stacked expert gradients gs that are fresh, for a
// path that accumulates into them; name is the block's, for errors.
func zeroFresh(p *Pass, name string, gs ...T) error {
	for _, g := range gs {
		if err := p.Fresh.Zero(p.B, g); err != nil {
			return wrap(name+" expert gradients", err)
		}
	}
	return nil
}
