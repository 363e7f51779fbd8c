package cuda

import (
	"fmt"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUCopyColumns compares CopyColumns with the CPU backend for the copies multi-head latent
// attention makes (per-head splits, a broadcast to every head, the sum over heads, accumulation)
// at odd widths, in bf16 and f32 and mixed.
func TestGPUCopyColumns(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		name         string
		rows, dc, sc int
		dd, sd       tensor.DType
		a            backend.ColumnCopyArgs
	}{
		{"split", 37, 5 * 24, 5 * 40, tensor.BF16, tensor.BF16, backend.ColumnCopyArgs{Groups: 5, Width: 24, SrcOffset: 16, SrcStride: 40, DstStride: 24}},
		{"place", 37, 5 * 48, 5 * 24, tensor.F32, tensor.F32, backend.ColumnCopyArgs{Groups: 5, Width: 24, SrcStride: 24, DstOffset: 8, DstStride: 48}},
		{"broadcast", 129, 7 * 40, 8, tensor.BF16, tensor.F32, backend.ColumnCopyArgs{Groups: 7, Width: 8, DstStride: 40}},
		{"sum", 129, 8, 7 * 40, tensor.F32, tensor.BF16, backend.ColumnCopyArgs{Groups: 7, Width: 8, SrcStride: 40, Accumulate: true}},
		{"accumulate", 3, 3 * 33, 3 * 33, tensor.BF16, tensor.BF16, backend.ColumnCopyArgs{Groups: 3, Width: 17, SrcOffset: 16, SrcStride: 33, DstStride: 33, Accumulate: true}},
	} {
		rel := 2 * bf16Eps
		if s.dd == tensor.F32 && s.sd == tensor.F32 {
			rel = 1e-6
		}
		c := opCase{
			Name: fmt.Sprintf("copy_columns/%s/%s_%s", s.name, s.dd, s.sd),
			Tensors: []tspec{
				{Name: "src", DType: s.sd, Shape: []int{s.rows, s.sc}, Gen: gen{Scale: 1}},
				{Name: "dst", DType: s.dd, Shape: []int{s.rows, s.dc}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-5, Rel: rel},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				a := s.a
				a.Dst, a.Src = ts["dst"], ts["src"]
				return be.CopyColumns(a)
			},
		}
		t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
	}
}
