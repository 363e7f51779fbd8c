package optim

import (
	"fmt"
	"sort"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// StateTensor is one named optimizer tensor on the host, ready for a checkpoint file: names are
// "<param>.exp_avg", "<param>.exp_avg_sq" and, for fp32 masters of bf16 weights,
// "<param>.master". Data holds little-endian elements of DType.
type StateTensor struct {
	Name  string
	DType tensor.DType
	Shape []int
	Data  []byte
}

func (o *AdamW) entries() []struct {
	name string
	t    tensor.Tensor
	p    Param
} {
	var es []struct {
		name string
		t    tensor.Tensor
		p    Param
	}
	for _, s := range o.slots {
		add := func(suffix string, t tensor.Tensor) {
			es = append(es, struct {
				name string
				t    tensor.Tensor
				p    Param
			}{s.p.Name + suffix, t, s.p})
		}
		add(".exp_avg", s.m)
		add(".exp_avg_sq", s.v)
		if !s.master.IsNil() {
			add(".master", s.master)
		}
	}
	return es
}

// Export copies the optimizer state to the host: the step count and every state tensor, shaped
// like its parameter.
func (o *AdamW) Export() (step int, ts []StateTensor, err error) {
	for _, e := range o.entries() {
		raw := make([]byte, e.t.Bytes())
		if err := o.b.Download(raw, e.t); err != nil {
			return 0, nil, fmt.Errorf("optim: export %s: %w", e.name, err)
		}
		ts = append(ts, StateTensor{Name: e.name, DType: e.t.DType(), Shape: e.p.Value.Shape().Clone(), Data: raw})
	}
	return o.step, ts, nil
}

// Import restores state written by Export for the same parameters and mode. Every expected
// tensor must be present with the right dtype and element count; extra names are an error, so
// a checkpoint from a different model or optimizer is refused rather than half-loaded.
func (o *AdamW) Import(step int, ts []StateTensor) error {
	if step < 0 {
		return fmt.Errorf("optim: import: step %d is negative", step)
	}
	byName := map[string]StateTensor{}
	for _, t := range ts {
		if _, dup := byName[t.Name]; dup {
			return fmt.Errorf("optim: import: state tensor %q appears twice", t.Name)
		}
		byName[t.Name] = t
	}
	es := o.entries()
	for _, e := range es {
		t, ok := byName[e.name]
		if !ok {
			return fmt.Errorf("optim: import: state tensor %q is missing (was the checkpoint written by %s for this model?)", e.name, o.cfg.Mode)
		}
		if t.DType != e.t.DType() {
			return fmt.Errorf("optim: import: state tensor %q is %s, want %s (optimizer mode %s)", e.name, t.DType, e.t.DType(), o.cfg.Mode)
		}
		if int64(len(t.Data)) != e.t.Bytes() {
			return fmt.Errorf("optim: import: state tensor %q has %d bytes, want %d (shape %v)", e.name, len(t.Data), e.t.Bytes(), e.p.Value.Shape())
		}
	}
	if len(byName) > len(es) {
		want := map[string]bool{}
		for _, e := range es {
			want[e.name] = true
		}
		var extra []string
		for n := range byName {
			if !want[n] {
				extra = append(extra, n)
			}
		}
		sort.Strings(extra)
		return fmt.Errorf("optim: import: unexpected state tensors %v (a different model or optimizer?)", extra[:min(len(extra), 5)])
	}
	for _, e := range es {
		if err := o.b.Upload(e.t, byName[e.name].Data); err != nil {
			return fmt.Errorf("optim: import %s: %w", e.name, err)
		}
	}
	o.step = step
	return nil
}
