package nn

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// besideParam is one parameter of a test MoEBesideMLP and its gradient.
type besideParam struct {
	name string
	w, g T
}

// newBeside builds a MoEBesideMLP of hidden size c, dense width f, expert width inter,
// experts experts and top-k k, with weights of dtype dt and F32 gradients, the experts stacked
// as Gemma 4 binds them (each expert's Linear a view into GateUp and Down), and lists its
// parameters with their gradients.
func newBeside(e *env, dt tensor.DType, c, f, inter, experts, k int) (*MoEBesideMLP, []besideParam) {
	var ps []besideParam
	param := func(name string, w T, shape ...int) (T, T) {
		if dt != tensor.F32 {
			v, err := backend.FromFloat32(e.b, e.get(w), dt, shape...)
			if err != nil {
				e.t.Fatal(err)
			}
			_ = e.b.Free(w)
			w = v
		}
		g := e.zeros(shape...)
		ps = append(ps, besideParam{name, w, g})
		return w, g
	}
	lin := func(name string, scale float64, out, in int) Linear {
		w, g := param(name, e.randn(scale, out, in), out, in)
		return Linear{Name: name, W: w, GW: g}
	}
	norm := func(name string) RMSNorm {
		w, g := param(name, e.ones(0.2, c), c)
		return RMSNorm{Name: name, W: w, GW: g, Eps: 1e-6}
	}
	m := &MoEBesideMLP{Name: "moe", TopK: k, RouterEps: 1e-6}
	m.PreMLP = norm("pre_feedforward_layernorm")
	m.MLP = &MLP{Name: "mlp", Gate: lin("mlp.gate", 0.3, f, c), Up: lin("mlp.up", 0.3, f, c), Down: lin("mlp.down", 0.3, c, f), Act: GELUTanh}
	m.PostMLP = norm("post_feedforward_layernorm_1")
	m.Router = lin("router.proj", 1, experts, c)
	m.RouterScale, m.GRouterScale = param("router.scale", e.ones(0.3, c), c)
	m.PerExpertScale, m.GPerExpertScale = param("router.per_expert_scale", e.ones(0.4, experts), experts)
	m.PreExperts = norm("pre_feedforward_layernorm_2")
	m.PostExperts = norm("post_feedforward_layernorm_2")
	gu, ggu := param("experts.gate_up_proj", e.randn(0.3, experts, 2*inter, c), experts, 2*inter, c)
	dn, gdn := param("experts.down_proj", e.randn(0.3, experts, c, inter), experts, c, inter)
	m.GateUp = Linear{Name: "experts.gate_up_proj", W: gu, GW: ggu}
	m.Down = Linear{Name: "experts.down_proj", W: dn, GW: gdn}
	view := func(t T, off int, shape ...int) T {
		v, err := t.View(off, shape...)
		if err != nil {
			e.t.Fatal(err)
		}
		return v
	}
	for x := 0; x < experts; x++ {
		g, u, d := x*2*inter*c, x*2*inter*c+inter*c, x*c*inter
		name := fmt.Sprintf("experts.%d.", x)
		m.Experts = append(m.Experts, Expert{
			Gate: Linear{Name: name + "gate", W: view(gu, g, inter, c), GW: view(ggu, g, inter, c)},
			Up:   Linear{Name: name + "up", W: view(gu, u, inter, c), GW: view(ggu, u, inter, c)},
			Down: Linear{Name: name + "down", W: view(dn, d, c, inter), GW: view(gdn, d, c, inter)},
		})
	}
	return m, ps
}

// TestMoEBesideMLPDevicePathMatchesHost runs Gemma 4's MoE block on its device path (the CPU
// backend's MoE ops, GeGLUPacked and grouped GEMM) and on its host path with the same weights,
// packed batches of several documents, and compares the output, dx and every parameter's
// gradient (the router scale, the per-expert scale, the router, the stacked experts, the four
// norms and the dense MLP): within fp32 rounding in f32 (1e-5 of each tensor's largest value)
// and a few bf16 steps in bf16, at top-k 1, 2 and E, with experts that receive no token, with
// the experts' outputs kept and recomputed.
func TestMoEBesideMLPDevicePathMatchesHost(t *testing.T) {
	const C, F, I = 16, 12, 8
	cases := []struct {
		e, k  int
		lens  []int
		empty bool // some expert receives no token (checked)
	}{
		{4, 1, []int{3, 5, 2}, false},
		{5, 2, []int{4, 1, 6}, false},
		{4, 4, []int{2, 5}, false},
		{12, 2, []int{1, 2}, true}, // 6 slots over 12 experts
		{8, 1, []int{2, 3}, true},
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, outputs := range []string{"keep", "recompute"} {
			for _, tc := range cases {
				name := fmt.Sprintf("%s/outputs=%s/E%d_K%d_docs%v", dt, outputs, tc.e, tc.k, tc.lens)
				t.Run(name, func(t *testing.T) {
					t.Setenv("HALO_MOE_EXPERT_OUTPUTS", outputs)
					e := newEnv(t)
					m, params := newBeside(e, dt, C, F, I, tc.e, tc.k)
					p := e.pass(tc.lens, 4)
					p.DType = dt
					x := e.randn(1, p.N, C)
					dy := e.randn(1, p.N, C)
					if dt != tensor.F32 {
						x = toDType(t, e.b, x, dt)
						dy = toDType(t, e.b, dy, dt)
					}
					type result struct {
						out, dx []float32
						grads   [][]float32
						counts  []int
					}
					run := func(composed bool) result {
						m.Composed = composed
						for _, pr := range params {
							if err := p.B.Fill(pr.g, 0); err != nil {
								t.Fatal(err)
							}
						}
						out, err := m.Forward(p, x, true)
						if err != nil {
							t.Fatal(err)
						}
						if m.onDev == composed {
							t.Fatalf("composed=%v: the forward ran on the device path = %v", composed, m.onDev)
						}
						var counts []int
						if composed {
							counts = make([]int, tc.e)
							for _, s := range m.sel {
								counts[s]++
							}
						}
						dx, err := m.Backward(p, dy)
						if err != nil {
							t.Fatal(err)
						}
						res := result{out: e.get(out), dx: e.get(dx), counts: counts}
						for _, pr := range params {
							res.grads = append(res.grads, e.get(pr.g))
						}
						_ = e.b.Free(out)
						_ = e.b.Free(dx)
						return res
					}
					want := run(true)
					got := run(false)
					empty := false
					for _, c := range want.counts {
						empty = empty || c == 0
					}
					if empty != tc.empty {
						t.Fatalf("expert loads %v: an expert without tokens = %v, want %v", want.counts, empty, tc.empty)
					}
					// At top-k 1 the renormalised weight is 1 (times the per-expert scale): the
					// router and its scale get no gradient but rounding noise, and the per-expert
					// scale, which then scales whole rows of PostExperts' input, none through
					// that norm but its epsilon's.
					flat := map[string]bool{"router.proj": tc.k == 1, "router.scale": tc.k == 1, "router.per_expert_scale": tc.k == 1}
					cmp := func(name string, g, w []float32) {
						t.Helper()
						scale := 0.0
						for _, v := range w {
							scale = math.Max(scale, math.Abs(float64(v)))
						}
						if flat[name] {
							// What is left of terms of order 1 that cancel: compared at that order.
							scale = 1
						} else if scale < 1e-3 {
							t.Fatalf("%s is at most %g on the host path: the comparison checks little", name, scale)
						}
						tol := 1e-5*scale + 1e-7
						if dt == tensor.BF16 {
							// Both paths round their intermediates to bf16 at different places
							// (per-expert GEMMs against grouped ones, the combine's single rounding).
							tol = 3e-2*scale + 1e-4
						}
						for i := range w {
							if d := math.Abs(float64(g[i] - w[i])); !(d <= tol) {
								t.Fatalf("%s[%d] = %g on the device path, %g on the host path (tolerance %.2g)", name, i, g[i], w[i], tol)
							}
						}
					}
					cmp("out", got.out, want.out)
					cmp("dx", got.dx, want.dx)
					for i, pr := range params {
						cmp(pr.name, got.grads[i], want.grads[i])
					}
				})
			}
		}
	}
}

// TestMoEBesideMLPPathSwitch: HALO_MOE_PATH=composed sends Gemma 4's MoE block through its host
// path, device (the default) through the device path; a block without stacked weights takes
// the host path.
func TestMoEBesideMLPPathSwitch(t *testing.T) {
	for _, tc := range []struct {
		value    string
		stacked  bool
		wantHost bool
	}{{"", true, false}, {"device", true, false}, {"composed", true, true}, {"", false, true}} {
		t.Run(fmt.Sprintf("HALO_MOE_PATH=%s/stacked=%v", tc.value, tc.stacked), func(t *testing.T) {
			t.Setenv("HALO_MOE_PATH", tc.value)
			e := newEnv(t)
			m, _ := newBeside(e, tensor.F32, 8, 6, 4, 4, 2)
			if !tc.stacked {
				m.GateUp, m.Down = Linear{}, Linear{}
			}
			p := e.pass([]int{5}, 4)
			out, err := m.Forward(p, e.randn(1, 5, 8), true)
			if err != nil {
				t.Fatal(err)
			}
			_ = e.b.Free(out)
			if host := m.probs != nil; host != tc.wantHost || m.onDev == tc.wantHost {
				t.Fatalf("host routing = %v (device path %v), want host %v", host, m.onDev, tc.wantHost)
			}
			m.Release(p)
		})
	}
}
