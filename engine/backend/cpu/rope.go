package cpu

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// ropeCache keeps the last by-position table: the same frequencies and scaling are used by
// every layer's q and k, forward and backward, so the table is computed once per step.
type ropeCache struct {
	mu       sync.Mutex
	inv      []float32
	scale    float32
	cos, sin []float32 // [rows][R/2], rows = positions 0..rows-1
	rows     int
}

// table returns cos and sin of float32(pos)*invFreq[i] times the scaling as [rows][R/2] tables
// and the table row of each token. Positions restart per packed document, so the table is
// indexed by position (0..max, cached across calls) when that is smaller than the token count,
// else by token.
func (rc *ropeCache) table(pos []int32, inv []float32, scale float32) (cos, sin []float32, row []int32, err error) {
	maxPos := int32(0)
	for i, p := range pos {
		if p < 0 {
			return nil, nil, nil, fmt.Errorf("cpu: rope: positions[%d] = %d is negative", i, p)
		}
		maxPos = max(maxPos, p)
	}
	if int(maxPos) >= len(pos) {
		row = make([]int32, len(pos))
		for t := range row {
			row[t] = int32(t)
		}
		cos, sin = ropeRows(pos, inv, scale)
		return cos, sin, row, nil
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.scale != scale || !slices.Equal(rc.inv, inv) || rc.rows <= int(maxPos) {
		vals := make([]int32, max(int(maxPos)+1, rc.rows))
		for p := range vals {
			vals[p] = int32(p)
		}
		rc.cos, rc.sin = ropeRows(vals, inv, scale)
		rc.inv, rc.scale, rc.rows = slices.Clone(inv), scale, len(vals)
	}
	return rc.cos, rc.sin, pos, nil
}

// ropeRows computes the cos and sin rows for the given positions.
func ropeRows(vals []int32, inv []float32, scale float32) (cos, sin []float32) {
	h := len(inv)
	cos = make([]float32, len(vals)*h)
	sin = make([]float32, len(cos))
	for k, p := range vals {
		for i, f := range inv {
			ang := float64(float32(p) * f)
			cos[k*h+i] = float32(math.Cos(ang)) * scale
			sin[k*h+i] = float32(math.Sin(ang)) * scale
		}
	}
	return cos, sin
}

func (b *Backend) rope(op string, out, x T, a backend.RoPEArgs, sign float32) error {
	hd := a.HeadDim
	r := a.RotaryDim
	if r == 0 {
		r = hd
	}
	if a.Heads <= 0 || hd <= 0 || r <= 0 || r%2 != 0 || r > hd {
		return fmt.Errorf("cpu: %s: need Heads > 0, HeadDim > 0 and an even RotaryDim <= HeadDim (got %d, %d, %d)", op, a.Heads, hd, r)
	}
	pos, err := ints(op, "positions", a.Positions)
	if err != nil {
		return err
	}
	n := len(pos)
	w := a.Heads * hd
	if err := numel(op, "x", x, n*w, "numel(positions)*Heads*HeadDim"); err != nil {
		return err
	}
	if err := numel(op, "out", out, n*w, "numel(x)"); err != nil {
		return err
	}
	if err := numel(op, "inv_freq", a.InvFreq, r/2, "RotaryDim/2"); err != nil {
		return err
	}
	inv, err := f32only(op, "inv_freq", a.InvFreq)
	if err != nil {
		return err
	}
	scale := a.AttentionScaling
	if scale == 0 {
		scale = 1
	}
	cos, sin, row, err := b.ropeTab.table(pos, inv, scale)
	if err != nil {
		return err
	}
	xs, err := b.in(op, "x", x)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	half := r / 2
	// Pair i is (i, i+R/2), or (2i, 2i+1) when interleaved.
	first, second, step := 0, half, 1
	if a.Interleaved {
		first, second, step = 0, 1, 2
	}
	b.pool.rows(n, 64, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			k := int(row[t])
			cs := cos[k*half : (k+1)*half]
			sn := sin[k*half : (k+1)*half]
			for h := 0; h < a.Heads; h++ {
				base := t*w + h*hd
				xv := xs[base : base+hd]
				ov := os[base : base+hd]
				for i := 0; i < half; i++ {
					c, s := cs[i], sign*sn[i]
					j1, j2 := first+step*i, second+step*i
					x1, x2 := xv[j1], xv[j2]
					ov[j1] = x1*c - x2*s
					ov[j2] = x2*c + x1*s
				}
				copy(ov[r:], xv[r:])
			}
		}
	})
	flush()
	return nil
}

// RoPE rotates each head's first R dims by pos*inv_freq (HF rotate-half convention).
func (b *Backend) RoPE(out, x T, a backend.RoPEArgs) error { return b.rope("rope", out, x, a, 1) }

// RoPEBackward applies the transposed rotation to dY.
func (b *Backend) RoPEBackward(dX, dY T, a backend.RoPEArgs) error {
	return b.rope("rope-backward", dX, dY, a, -1)
}
