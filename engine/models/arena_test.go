package models

import (
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Every view of a model's arenas starts on a 16-byte boundary, at the offset
// ArenaLayout gives, without overlapping the one before, in every family's tiny preset (gemma4_text's
// per-layer scalar of one element among them), in bf16 and float32; the padding is zero.
func TestArenaViewsAreAligned(t *testing.T) {
	b := newCPU()
	defer b.Close()
	odd := false
	for _, family := range config.Families() {
		if _, err := Lookup(family); err != nil {
			continue // read by engine/hf/config, not built here (jetmoe)
		}
		presets, err := config.Presets(family)
		if err != nil || !slices.Contains(presets, "tiny") {
			continue
		}
		c, err := config.Preset(family, "tiny")
		if err != nil {
			t.Fatalf("%s: %v", family, err)
		}
		for _, dt := range []tensor.DType{tensor.BF16, tensor.F32} {
			m, err := New(c.Clone(), b, Options{DType: dt})
			if err != nil {
				t.Errorf("%s %s: %v", family, dt, err)
				continue
			}
			offs, total := ArenaLayout(m.Specs)
			if m.Params.Flat.Numel() != total {
				t.Errorf("%s %s: arena of %d elements, layout says %d", family, dt, m.Params.Flat.Numel(), total)
			}
			el := int64(dt.Size())
			end := 0
			for i, s := range m.Specs {
				off := int((m.Params.Views[i].Offset() - m.Params.Flat.Offset()) / el)
				if off != offs[i] || off != m.Params.Offs[i] || int64(off)*el%16 != 0 || off < end {
					t.Errorf("%s %s: %s at element %d (layout %d, previous view ends at %d): want 16-byte aligned views", family, dt, s.Name, off, offs[i], end)
				}
				odd = odd || s.Numel()%ArenaAlign != 0
				end = off + s.Numel()
			}
			vals, err := backend.ToFloat32(b, m.Params.Flat)
			if err != nil {
				t.Errorf("%s %s: %v", family, dt, err)
			} else {
				for i, s := range m.Specs {
					stop := total
					if i+1 < len(offs) {
						stop = offs[i+1]
					}
					for j := offs[i] + s.Numel(); j < stop; j++ {
						if vals[j] != 0 {
							t.Errorf("%s %s: padding element %d after %s is %g, want 0", family, dt, j, s.Name, vals[j])
							break
						}
					}
				}
			}
			m.Close()
		}
	}
	if !odd {
		t.Error("no tiny preset has a parameter of a size that is not a multiple of ArenaAlign: the test checks no padding")
	}
}
