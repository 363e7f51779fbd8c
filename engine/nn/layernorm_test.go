package nn

import (
	"math"
	"testing"
)

// TestLayerNormValues checks a centred norm with bias against nn.LayerNorm's formula in float64:
// (x - mean) / sqrt(var + eps) * w + b, with the biased variance, on rows whose mean is far from
// zero (so an uncentred RMSNorm would differ) and also through AddForward.
func TestLayerNormValues(t *testing.T) {
	const rows, C = 5, 24
	const eps = 1e-5
	e := newEnv(t)
	n := &RMSNorm{Name: "ln", W: e.ones(0.3, C), B: e.randn(0.5, C), Eps: eps, Center: true}
	xs := e.get(e.randn(1, rows, C))
	for i := range xs {
		xs[i] += float32(i/C) - 2
	}
	w, b := e.get(n.W), e.get(n.B)
	want := make([]float64, rows*C)
	for r := 0; r < rows; r++ {
		row := xs[r*C : (r+1)*C]
		mean, vr := 0.0, 0.0
		for _, v := range row {
			mean += float64(v)
		}
		mean /= C
		for _, v := range row {
			vr += (float64(v) - mean) * (float64(v) - mean)
		}
		vr /= C
		for j, v := range row {
			want[r*C+j] = (float64(v)-mean)/math.Sqrt(vr+eps)*float64(w[j]) + float64(b[j])
		}
	}
	p := &Pass{B: e.b, DType: e.zeros(1).DType()}
	x := e.zeros(rows, C)
	e.set(x, xs)
	out, _, err := n.Forward(p, x)
	if err != nil {
		t.Fatal(err)
	}
	// AddForward: residual (x - 1) + 1 = x.
	res := e.zeros(rows, C)
	shifted := make([]float32, len(xs))
	for i, v := range xs {
		shifted[i] = v - 1
	}
	e.set(res, shifted)
	one := e.zeros(rows, C)
	e.set(one, func() []float32 {
		v := make([]float32, rows*C)
		for i := range v {
			v[i] = 1
		}
		return v
	}())
	out2, _, err := n.AddForward(p, one, res)
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]T{"Forward": out, "AddForward": out2} {
		got := e.get(o)
		for i := range want {
			if math.Abs(float64(got[i])-want[i]) > 1e-4 {
				t.Fatalf("%s: element %d = %.6f, LayerNorm gives %.6f", name, i, got[i], want[i])
			}
		}
	}
}

// TestLayerNormGradients checks dx and the weight and bias gradients of the centred norm (with
// and without bias) against central differences, accumulating into dx as the blocks do.
func TestLayerNormGradients(t *testing.T) {
	const rows, C = 6, 16
	for _, bias := range []bool{false, true} {
		t.Run(map[bool]string{false: "no bias", true: "bias"}[bias], func(t *testing.T) {
			e := newEnv(t)
			p := e.pass([]int{rows}, 4)
			n := &RMSNorm{Name: "ln", W: e.ones(0.3, C), GW: e.zeros(C), Eps: 1e-5, Center: true}
			params, grads := []T{n.W}, []T{n.GW}
			if bias {
				n.B, n.GB = e.randn(0.5, C), e.zeros(C)
				params, grads = append(params, n.B), append(grads, n.GB)
			}
			x := e.randn(1, rows, C)
			var rstd T
			l := layer{
				fwd: func(p *Pass, x T, keep bool) (T, error) {
					y, r, err := n.Forward(p, x)
					if keep {
						rstd = r
					}
					return y, err
				},
				bwd: func(p *Pass, x, dy T) (T, error) {
					dx := e.randn(1, rows, C) // accumulated into: the check subtracts it
					before := e.get(dx)
					if err := n.Backward(p, dx, dy, x, rstd, true); err != nil {
						return T{}, err
					}
					v := e.get(dx)
					for i := range v {
						v[i] -= before[i]
					}
					e.set(dx, v)
					return dx, nil
				},
				param: params,
				grad:  grads,
			}
			checkGradients(t, e, p, x, l)
		})
	}
}
