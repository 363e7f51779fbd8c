package cpu

import (
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestCopyColumns checks the column-block copy against values written out by hand: a per-head
// split, a broadcast of one block to every group, the sum of the groups into one block (the
// broadcast's backward), accumulation, and bf16 storage; columns outside the blocks keep their
// values.
func TestCopyColumns(t *testing.T) {
	b := newTestBackend(t)
	// src: 2 rows of 6 columns, two groups of 3 (head 0: a b c, head 1: d e f).
	src := []float64{1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60}
	for _, c := range []struct {
		name  string
		dt    tensor.DType
		dcols int
		dst0  float64 // every Dst element before the op
		a     backend.ColumnCopyArgs
		want  []float64
	}{
		{"last two of each head, packed", tensor.F32, 4, 0,
			backend.ColumnCopyArgs{Groups: 2, Width: 2, SrcOffset: 1, SrcStride: 3, DstStride: 2},
			[]float64{2, 3, 5, 6, 20, 30, 50, 60}},
		{"into strided heads, others kept", tensor.F32, 8, -1,
			backend.ColumnCopyArgs{Groups: 2, Width: 3, SrcStride: 3, DstOffset: 1, DstStride: 4},
			[]float64{-1, 1, 2, 3, -1, 4, 5, 6, -1, 10, 20, 30, -1, 40, 50, 60}},
		{"broadcast the first column", tensor.F32, 3, 0,
			backend.ColumnCopyArgs{Groups: 3, Width: 1, SrcStride: 0, DstStride: 1},
			[]float64{1, 1, 1, 10, 10, 10}},
		{"sum the heads", tensor.F32, 3, 0,
			backend.ColumnCopyArgs{Groups: 2, Width: 3, SrcStride: 3, DstStride: 0},
			[]float64{5, 7, 9, 50, 70, 90}},
		{"sum the heads onto dst", tensor.F32, 3, 1,
			backend.ColumnCopyArgs{Groups: 2, Width: 3, SrcStride: 3, Accumulate: true},
			[]float64{6, 8, 10, 51, 71, 91}},
		{"accumulate per head", tensor.F32, 6, 0.5,
			backend.ColumnCopyArgs{Groups: 2, Width: 1, SrcOffset: 2, SrcStride: 3, DstOffset: 1, DstStride: 3, Accumulate: true},
			[]float64{0.5, 3.5, 0.5, 0.5, 6.5, 0.5, 0.5, 30.5, 0.5, 0.5, 60.5, 0.5}},
		{"bf16 dst", tensor.BF16, 2, 0,
			backend.ColumnCopyArgs{Groups: 1, Width: 2, SrcOffset: 4},
			[]float64{5, 6, 50, 60}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := c.a
			a.Src = up(t, b, src, tensor.F32, 2, 6)
			init := make([]float64, 2*c.dcols)
			for i := range init {
				init[i] = c.dst0
			}
			a.Dst = up(t, b, init, c.dt, 2, c.dcols)
			must(t, b.CopyColumns(a))
			if got := down(t, b, a.Dst); !slices.Equal(got, c.want) {
				t.Fatalf("dst = %v, want %v", got, c.want)
			}
		})
	}
}

// TestCopyColumnsRefuses: blocks past the end, overlapping groups, different row counts and
// aliasing are refused with the argument named.
func TestCopyColumnsRefuses(t *testing.T) {
	b := newTestBackend(t)
	src, dst := zeros(t, b, tensor.F32, 2, 6), zeros(t, b, tensor.F32, 2, 4)
	other := zeros(t, b, tensor.F32, 3, 4)
	for _, c := range []struct {
		a    backend.ColumnCopyArgs
		want string
	}{
		{backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: 2, Width: 3, SrcStride: 3, DstStride: 3}, "end at column 6 of Dst"},
		{backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: 2, Width: 2, SrcOffset: 1, SrcStride: 4, DstStride: 2}, "end at column 7 of Src"},
		{backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: 2, Width: 2, SrcStride: 2, DstStride: 1}, "would overlap"},
		{backend.ColumnCopyArgs{Dst: other, Src: src, Groups: 1, Width: 1}, "same number of rows"},
		{backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: 0, Width: 1}, "at least 1"},
		{backend.ColumnCopyArgs{Dst: src, Src: src, Groups: 1, Width: 1, DstOffset: 1}, "overlap"},
	} {
		err := b.CopyColumns(c.a)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one containing %q", c.a, err, c.want)
		}
	}
}
