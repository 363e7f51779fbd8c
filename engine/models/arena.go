package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Arena is one device allocation holding every parameter (or every gradient) of a model, with
// a named view per ParamSpec in spec order. Flat is the whole buffer as a 1-D tensor, so the
// optimizer, the gradient norm, collectives and checkpoints can each treat it as one block.
type Arena struct {
	Flat  tensor.Tensor   // [total] every element, in spec order
	Views []tensor.Tensor // Views[i] has Specs[i].Shape
	// Offs[i] is Views[i]'s element offset in Flat (ArenaLayout): what sharding, expert ranges
	// and optimizer slabs address Flat by.
	Offs  []int
	index map[string]int
}

// ArenaAlign is the element alignment of every view in an arena: each parameter starts on a
// multiple of 8 elements (16 bytes in bf16, 32 in float32), so that a parameter of odd size (a
// per-layer scalar, an odd bias) does not leave the ones after it misaligned for the kernels'
// 16-byte vector loads, tensor-memory-accelerator copies and cuBLASLt's tensor-core algorithms.
// The padding between views is zero and stays zero (no gradient reaches it).
const ArenaAlign = 8

// AlignArenaOffset rounds an element offset up to the next view boundary (ArenaAlign).
func AlignArenaOffset(off int) int {
	return (off + ArenaAlign - 1) / ArenaAlign * ArenaAlign
}

// ArenaLayout returns the element offset of each spec's view in an arena of specs, and the
// arena's total length (padding included). Everything that addresses Flat by element offsets
// (sharding, expert ranges, optimizer slabs) takes them from here, through Arena.Offs.
func ArenaLayout(specs []ParamSpec) (offs []int, total int) {
	offs = make([]int, len(specs))
	for i, s := range specs {
		total = AlignArenaOffset(total)
		offs[i] = total
		total += s.Numel()
	}
	return offs, total
}

// newArena allocates one zeroed buffer of dtype dt for specs.
func newArena(b backend.Backend, dt tensor.DType, specs []ParamSpec) (*Arena, error) {
	offs, total := ArenaLayout(specs)
	flat, err := b.Alloc(dt, total)
	if err != nil {
		return nil, fmt.Errorf("models: arena of %d %s elements: %w", total, dt, err)
	}
	a := &Arena{Flat: flat, Views: make([]tensor.Tensor, len(specs)), Offs: offs, index: make(map[string]int, len(specs))}
	for i, s := range specs {
		v, err := flat.View(offs[i], s.Shape...)
		if err != nil {
			_ = b.Free(flat)
			return nil, fmt.Errorf("models: arena view %s: %w", s.Name, err)
		}
		a.Views[i] = v
		a.index[s.Name] = i
	}
	return a, nil
}

// Get returns the view of a parameter by HF name.
func (a *Arena) Get(name string) (tensor.Tensor, bool) {
	i, ok := a.index[name]
	if !ok {
		return tensor.Tensor{}, false
	}
	return a.Views[i], true
}

func (a *Arena) free(b backend.Backend) error {
	if a == nil || a.Flat.IsNil() {
		return nil
	}
	err := b.Free(a.Flat)
	a.Flat = tensor.Tensor{}
	return err
}
