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
	index map[string]int
}

// newArena allocates one zeroed buffer of dtype dt for specs.
func newArena(b backend.Backend, dt tensor.DType, specs []ParamSpec) (*Arena, error) {
	total := 0
	for _, s := range specs {
		total += s.Numel()
	}
	flat, err := b.Alloc(dt, total)
	if err != nil {
		return nil, fmt.Errorf("models: arena of %d %s elements: %w", total, dt, err)
	}
	a := &Arena{Flat: flat, Views: make([]tensor.Tensor, len(specs)), index: make(map[string]int, len(specs))}
	off := 0
	for i, s := range specs {
		v, err := flat.View(off, s.Shape...)
		if err != nil {
			_ = b.Free(flat)
			return nil, fmt.Errorf("models: arena view %s: %w", s.Name, err)
		}
		a.Views[i] = v
		a.index[s.Name] = i
		off += s.Numel()
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
