package cpu

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestScaleRowsAndRowDot checks both row ops against float64 references on f32 and bf16 rows,
// including a 3-d tensor whose rows are its last dimension.
func TestScaleRowsAndRowDot(t *testing.T) {
	b := newTestBackend(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		dt    tensor.DType
		shape []int
		tol   float64
	}{
		{tensor.F32, []int{5, 7}, 1e-6},
		{tensor.BF16, []int{33, 65}, 8e-3},
		{tensor.F32, []int{2, 3, 4}, 1e-6},
	} {
		rows := 1
		for _, d := range tc.shape[:len(tc.shape)-1] {
			rows *= d
		}
		c := tc.shape[len(tc.shape)-1]
		x := rounded(randn(r, rows*c, 1), tc.dt)
		y := rounded(randn(r, rows*c, 1), tc.dt)
		w := rounded(randn(r, rows, 1), tensor.F32)
		xt, yt := up(t, b, x, tc.dt, tc.shape...), up(t, b, y, tc.dt, tc.shape...)
		wt, dot := up(t, b, w, tensor.F32, rows), zeros(t, b, tensor.F32, rows)
		must(t, b.RowDot(dot, xt, yt))
		must(t, b.ScaleRows(xt, wt))
		wantDot, wantScaled := make([]float64, rows), make([]float64, rows*c)
		for i := range rows {
			for j := range c {
				wantDot[i] += x[i*c+j] * y[i*c+j]
				wantScaled[i*c+j] = x[i*c+j] * w[i]
			}
		}
		approx(t, "row_dot", down(t, b, dot), wantDot, 1e-5, 1e-5)
		approx(t, "scale_rows", down(t, b, xt), rounded(wantScaled, tc.dt), 1e-6, tc.tol)
	}
}

func TestRowOpsRefuseMismatchedShapes(t *testing.T) {
	b := newTestBackend(t)
	x := zeros(t, b, tensor.F32, 4, 3)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"weights per row", b.ScaleRows(x, zeros(t, b, tensor.F32, 3)), "w"},
		{"bf16 weights", b.ScaleRows(x, zeros(t, b, tensor.BF16, 4)), "want f32"},
		{"shapes differ", b.RowDot(zeros(t, b, tensor.F32, 4), x, zeros(t, b, tensor.F32, 3, 4)), "differ in shape"},
		{"out per row", b.RowDot(zeros(t, b, tensor.F32, 3), x, x), "out"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error naming %q", tc.name, tc.err, tc.want)
		}
	}
}
