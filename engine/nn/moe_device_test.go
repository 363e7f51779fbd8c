package nn

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// newStackedMoE is newMoE with the experts' weights and gradients laid out as the stacked
// gate_up [E,2I,C] and down [E,C,I] tensors, each expert's Linear a view into them.
func newStackedMoE(e *env, c, f, experts, k int, norm bool) *MoE {
	m := &MoE{Name: "moe", Router: Linear{Name: "router", W: e.randn(1, experts, c), GW: e.zeros(experts, c)},
		TopK: k, NormTopK: norm}
	m.GateUp = Linear{Name: "gate_up", W: e.randn(0.3, experts, 2*f, c), GW: e.zeros(experts, 2*f, c)}
	m.Down = Linear{Name: "down", W: e.randn(0.3, experts, c, f), GW: e.zeros(experts, c, f)}
	view := func(t T, off int, shape ...int) T {
		v, err := t.View(off, shape...)
		if err != nil {
			e.t.Fatal(err)
		}
		return v
	}
	for x := 0; x < experts; x++ {
		g, u, d := x*2*f*c, x*2*f*c+f*c, x*c*f
		m.Experts = append(m.Experts, Expert{
			Gate: Linear{W: view(m.GateUp.W, g, f, c), GW: view(m.GateUp.GW, g, f, c)},
			Up:   Linear{W: view(m.GateUp.W, u, f, c), GW: view(m.GateUp.GW, u, f, c)},
			Down: Linear{W: view(m.Down.W, d, c, f), GW: view(m.Down.GW, d, c, f)},
		})
	}
	return m
}

// TestMoEDevicePathMatchesComposition runs the block's device path (the CPU backend's MoE ops
// and grouped GEMM) and its host composition on the same weights and compares the output, dx,
// the router's and every expert's gradient, the load and the aux loss: equal within fp32
// rounding, at K=1, K=E, with renormalised weights, a balancing bias, the aux gradient, and
// more experts than routed rows (experts without tokens).
func TestMoEDevicePathMatchesComposition(t *testing.T) {
	const C, F = 12, 10
	cases := []struct {
		e, k, n int
		norm    bool
		bias    bool
		aux     bool
		deep    bool // sigmoid, score bias, 2-of-NGroup groups, scaling 2.5, shared expert
	}{
		{5, 2, 9, true, false, false, false},
		{5, 1, 9, false, false, true, false},
		{4, 4, 7, true, false, false, false},
		{6, 3, 11, true, true, true, false},
		{16, 2, 3, false, false, false, false}, // 6 slots over 16 experts: most have no token
		// DeepSeek-V3's router: sigmoid scores, a correction bias, groups, scaled weights and a
		// shared expert.
		{6, 2, 9, true, false, false, true},
		{8, 3, 11, false, true, false, true},
		{8, 2, 7, true, true, true, true},
	}
	for _, outputs := range []string{"keep", "recompute"} {
		for _, tc := range cases {
			name := fmt.Sprintf("outputs=%s/E%d_K%d_N%d_norm=%v_bias=%v_aux=%v_deepseek=%v", outputs, tc.e, tc.k, tc.n, tc.norm, tc.bias, tc.aux, tc.deep)
			t.Run(name, func(t *testing.T) {
				t.Setenv("HALO_MOE_EXPERT_OUTPUTS", outputs)
				e := newEnv(t)
				m := newStackedMoE(e, C, F, tc.e, tc.k, tc.norm)
				if tc.bias {
					m.Bias = make([]float32, tc.e)
					for j := range m.Bias {
						m.Bias[j] = float32(0.05 * e.rng.NormFloat64())
					}
				}
				params := []T{m.Router.GW, m.GateUp.GW, m.Down.GW}
				if tc.deep {
					deepseekRouter(e, m, C, F, tc.e/2)
					params = append(params, m.Shared.Gate.GW, m.Shared.Down.GW)
				}
				p := e.pass([]int{tc.n}, 4)
				x := e.randn(1, tc.n, C)
				dy := e.randn(1, tc.n, C)
				type result struct {
					out, dx []float32
					grads   [][]float32
					load    []int
					aux     float64
				}
				run := func(composed bool) result {
					m.Composed = composed
					for _, g := range params {
						if err := p.B.Fill(g, 0); err != nil {
							t.Fatal(err)
						}
					}
					out, err := m.Forward(p, x, true)
					if err != nil {
						t.Fatal(err)
					}
					r := m.Routing()
					if err := r.Fetch(); err != nil {
						t.Fatal(err)
					}
					aux, c, err := LoadBalancingLoss([]*Routing{r}, 0.3)
					if err != nil {
						t.Fatal(err)
					}
					m.AuxGrad = nil
					if tc.aux {
						m.AuxGrad = c
					}
					dx, err := m.Backward(p, dy)
					if err != nil {
						t.Fatal(err)
					}
					res := result{out: e.get(out), dx: e.get(dx), load: r.Load(), aux: aux}
					for _, g := range params {
						res.grads = append(res.grads, e.get(g))
					}
					return res
				}
				want := run(true)
				got := run(false)
				cmp := func(name string, g, w []float32) {
					t.Helper()
					for i := range w {
						if d := math.Abs(float64(g[i] - w[i])); d > 1e-5+1e-4*math.Abs(float64(w[i])) {
							t.Fatalf("%s[%d] = %g on the device path, %g composed", name, i, g[i], w[i])
						}
					}
				}
				cmp("out", got.out, want.out)
				cmp("dx", got.dx, want.dx)
				for i, n := range []string{"router grad", "gate_up grad", "down grad", "shared gate grad", "shared down grad"}[:len(params)] {
					cmp(n, got.grads[i], want.grads[i])
				}
				if fmt.Sprint(got.load) != fmt.Sprint(want.load) {
					t.Fatalf("load %v on the device path, %v composed", got.load, want.load)
				}
				if math.Abs(got.aux-want.aux) > 1e-6*math.Abs(want.aux) {
					t.Fatalf("aux loss %v on the device path, %v composed", got.aux, want.aux)
				}
			})
		}
	}
}

// TestMoEPathSwitch: HALO_MOE_PATH=composed sends a block that could take the device path
// through the host composition (whose routing is on the host), device (the default) does not.
func TestMoEPathSwitch(t *testing.T) {
	for _, tc := range []struct {
		value    string
		wantHost bool
	}{{"", false}, {"device", false}, {"composed", true}} {
		t.Run("HALO_MOE_PATH="+tc.value, func(t *testing.T) {
			t.Setenv("HALO_MOE_PATH", tc.value)
			e := newEnv(t)
			m := newStackedMoE(e, 8, 6, 4, 2, true)
			p := e.pass([]int{5}, 4)
			out, err := m.Forward(p, e.randn(1, 5, 8), false)
			if err != nil {
				t.Fatal(err)
			}
			_ = e.b.Free(out)
			if host := m.Routing().Probs != nil; host != tc.wantHost {
				t.Fatalf("host routing = %v, want %v", host, tc.wantHost)
			}
		})
	}
}

// deepseekRouter turns m into a DeepSeek-V3 block: sigmoid scores, a correction bias, the best
// 2 of ngroup expert groups, weights scaled by 2.5 and a shared SwiGLU expert of width f.
func deepseekRouter(e *env, m *MoE, c, f, ngroup int) {
	m.Score, m.NGroup, m.TopKGroup, m.RoutedScaling = backend.RouterSigmoid, ngroup, 2, 2.5
	m.ScoreBias = e.randn(0.05, m.Routed())
	m.Shared = &MLP{Name: "shared",
		Gate: Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
		Up:   Linear{W: e.randn(0.3, f, c), GW: e.zeros(f, c)},
		Down: Linear{W: e.randn(0.3, c, f), GW: e.zeros(c, f)}}
}
