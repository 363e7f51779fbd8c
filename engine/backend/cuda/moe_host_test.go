package cuda

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// moeHostSource is kernels/moe.cu prepared for the host emulation: its dynamic shared memory
// read from emu_smem, its static shared arrays made function statics (the harness runs one
// block at a time).
func moeHostSource(t *testing.T) string {
	src, err := kernelSource(moeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		decl, host string
		count      int
	}{
		{"extern __shared__ float moe_sh[];", "float* moe_sh = emu_smem;", 2},
		{"extern __shared__ int moe_h[];", "int* moe_h = (int*)emu_smem;", 1},
		{"extern __shared__ int moe_t[];", "int* moe_t = (int*)emu_smem;", 1},
	} {
		if n := strings.Count(src, r.decl); n != r.count {
			t.Fatalf("moe.cu declares %q %d times; the harness expects %d", r.decl, n, r.count)
		}
		src = strings.ReplaceAll(src, r.decl, r.host)
	}
	return strings.ReplaceAll(src, "__shared__ ", "static ")
}

// moeHostGeGLU is one packed GeGLU case: R rows of width I in dtype dt, vec running the bf16x8
// kernels.
type moeHostGeGLU struct {
	r, i int
	dt   tensor.DType
	vec  bool
}

// moeHostRoute is one router case over N tokens and E experts, with the per-expert scale.
type moeHostRoute struct {
	n, e    int
	routing backend.MoERouting
}

// exactIn returns n values of a fixed pattern of size about scale, exact in dt.
func exactIn(n int, seed, scale float64, dt tensor.DType) []float32 {
	v := make([]float32, n)
	for i := range v {
		x := float32(scale * math.Sin(float64(i)*0.917+seed) * (1 + 0.5*math.Cos(float64(i)*0.31+2*seed)))
		if dt == tensor.BF16 {
			x = tensor.BF16ToF32(tensor.F32ToBF16(x))
		}
		v[i] = x
	}
	return v
}

// TestMoEKernelsOnHost runs kernels/moe.cu's packed GeGLU (scalar and bf16x8 kernels) and its
// router with the per-expert scale (moe_route_fwd, moe_route_bwd with the dscale terms and
// the column sums into dscale) as host C++ (testdata/hostemu: a block's threads as fibers,
// the warp shuffles, __syncwarp and __syncthreads as barriers) and compares every output with
// the CPU backend's GeGLUPacked, GeGLUPackedBackward (in place), MoERoute and
// MoERouteBackward: f32 within 1e-5 of each output's rms, bf16 within a few bf16 steps, the
// selection exactly; at top-k 1, 2, 3 and E, more experts than a warp's lanes, softmax and
// sigmoid, with and without the renormalisation. It needs a C++17 compiler (g++ or clang++)
// and skips without one.
func TestMoEKernelsOnHost(t *testing.T) {
	// _FORTIFY_SOURCE would check _longjmp against the current stack, which a fiber switch leaves.
	bin := buildHostEmu(t, "MoE", "moe_check", moeHostSource(t), "-O1", "-U_FORTIFY_SOURCE")
	c := cpu.New(cpu.Options{Workers: 1})
	defer c.Close()
	o := c.Optional()

	t.Run("geglu", func(t *testing.T) {
		cases := []moeHostGeGLU{{5, 6, tensor.F32, false}, {3, 40, tensor.F32, false}, {4, 16, tensor.BF16, false}, {7, 16, tensor.BF16, true}, {2, 24, tensor.BF16, true}}
		var in bytes.Buffer
		var wants []map[string][]float32
		for ci, gc := range cases {
			gu, dout := exactIn(gc.r*2*gc.i, float64(ci), 2, gc.dt), exactIn(gc.r*gc.i, float64(ci)+0.5, 1, gc.dt)
			want := map[string][]float32{}
			err := func() error {
				gt, err := backend.FromFloat32(c, gu, gc.dt, gc.r, 2*gc.i)
				if err != nil {
					return err
				}
				dt, err := backend.FromFloat32(c, dout, gc.dt, gc.r, gc.i)
				if err != nil {
					return err
				}
				out, err := c.Alloc(gc.dt, gc.r, gc.i)
				if err != nil {
					return err
				}
				if err := o.GeGLUPacked(out, gt); err != nil {
					return err
				}
				if err := o.GeGLUPackedBackward(gt, dt, gt); err != nil {
					return err
				}
				if want["out"], err = backend.ToFloat32(c, out); err != nil {
					return err
				}
				want["dgu"], err = backend.ToFloat32(c, gt)
				return err
			}()
			if err != nil {
				t.Fatalf("%+v: CPU: %v", gc, err)
			}
			wants = append(wants, want)
			vec := 0
			if gc.vec {
				vec = 1
			}
			fmt.Fprintf(&in, "geglu %d %d %d %d\n", gc.r, gc.i, int(gc.dt), vec)
			writeFloats(&in, gu)
			writeFloats(&in, dout)
		}
		gots := runHostEmu(t, bin, &in, 2, len(cases))
		for ci, gc := range cases {
			tol := 1e-5
			if gc.dt == tensor.BF16 {
				tol = 3e-2
			}
			for _, name := range []string{"out", "dgu"} {
				if e := maxErrOverRMS(gots[ci][name], wants[ci][name]); !(e <= tol) || len(gots[ci][name]) != len(wants[ci][name]) {
					t.Errorf("%+v: %s: max |err|/rms = %.3g against the CPU (%d values, want %d), above %.0e", gc, name, e, len(gots[ci][name]), len(wants[ci][name]), tol)
				}
			}
		}
	})

	t.Run("route", func(t *testing.T) {
		cases := []moeHostRoute{
			{9, 6, backend.MoERouting{TopK: 2, NormTopK: true}},
			{7, 5, backend.MoERouting{TopK: 1, NormTopK: true}},
			{11, 8, backend.MoERouting{TopK: 8, NormTopK: true}},
			{5, 40, backend.MoERouting{TopK: 3, NormTopK: true}},
			{6, 6, backend.MoERouting{Score: backend.RouterSigmoid, TopK: 2, NormTopK: true, RoutedScaling: 2.5}},
			{4, 4, backend.MoERouting{TopK: 2}},
		}
		var in bytes.Buffer
		var wants []map[string][]float32
		for ci, rc := range cases {
			n, e, k := rc.n, rc.e, rc.routing.TopK
			logits := exactIn(n*e, float64(ci)+0.25, 2, tensor.F32)
			escale := exactIn(e, float64(ci)+1.5, 0.4, tensor.F32)
			for j := range escale {
				escale[j] += 1
			}
			dw := exactIn(n*k, float64(ci)+2.75, 1, tensor.F32)
			want, err := cpuRoute(c, rc, logits, escale, dw)
			if err != nil {
				t.Fatalf("%+v: CPU: %v", rc, err)
			}
			wants = append(wants, want)
			norm := 0
			if rc.routing.NormTopK {
				norm = 1
			}
			sig := 0
			if rc.routing.Score == backend.RouterSigmoid {
				sig = 1
			}
			fmt.Fprintf(&in, "route %d %d %d %d %d %g\n", n, e, k, sig, norm, rc.routing.Scaling())
			writeFloats(&in, logits)
			writeFloats(&in, escale)
			writeFloats(&in, dw)
		}
		gots := runHostEmu(t, bin, &in, 5, len(cases))
		for ci, rc := range cases {
			for _, name := range []string{"probs", "sel", "weights", "dlogits", "dscale"} {
				g, w := gots[ci][name], wants[ci][name]
				if len(g) != len(w) {
					t.Errorf("%+v: %s: %d values, the CPU %d", rc, name, len(g), len(w))
					continue
				}
				if name == "sel" {
					if fmt.Sprint(g) != fmt.Sprint(w) {
						t.Errorf("%+v: sel %v, the CPU %v", rc, g, w)
					}
					continue
				}
				if e := maxErrOverRMS(g, w); !(e <= 1e-5) {
					t.Errorf("%+v: %s: max |err|/rms = %.3g against the CPU, above 1e-5", rc, name, e)
				}
			}
		}
	})
}

// cpuRoute runs the CPU backend's MoERoute with the expert scale and MoERouteBackward with its
// gradient on one case and returns probs, sel, weights, dlogits and dscale.
func cpuRoute(c *cpu.Backend, rc moeHostRoute, logits, escale, dw []float32) (map[string][]float32, error) {
	n, e, k := rc.n, rc.e, rc.routing.TopK
	o := c.Optional()
	lt, err := backend.FromFloat32(c, logits, tensor.F32, n, e)
	if err != nil {
		return nil, err
	}
	et, err := backend.FromFloat32(c, escale, tensor.F32, e)
	if err != nil {
		return nil, err
	}
	dwt, err := backend.FromFloat32(c, dw, tensor.F32, n, k)
	if err != nil {
		return nil, err
	}
	probs, err := c.Alloc(tensor.F32, n, e)
	if err != nil {
		return nil, err
	}
	sel, err := c.Alloc(tensor.I32, n, k)
	if err != nil {
		return nil, err
	}
	w, err := c.Alloc(tensor.F32, n, k)
	if err != nil {
		return nil, err
	}
	dz, err := c.Alloc(tensor.F32, n, e)
	if err != nil {
		return nil, err
	}
	ds, err := c.Alloc(tensor.F32, e)
	if err != nil {
		return nil, err
	}
	if err := o.MoERoute(backend.MoERouteArgs{MoERouting: rc.routing, Logits: lt, Probs: probs, Sel: sel, Weights: w, ExpertScale: et}); err != nil {
		return nil, err
	}
	if err := o.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: rc.routing, Probs: probs, Sel: sel, Weights: w,
		DWeights: dwt, DLogits: dz, ExpertScale: et, DExpertScale: ds}); err != nil {
		return nil, err
	}
	out := map[string][]float32{}
	for name, t := range map[string]backend.T{"probs": probs, "weights": w, "dlogits": dz, "dscale": ds} {
		if out[name], err = backend.ToFloat32(c, t); err != nil {
			return nil, err
		}
	}
	ids, err := backend.ToInt32(c, sel)
	if err != nil {
		return nil, err
	}
	for _, x := range ids {
		out["sel"] = append(out["sel"], float32(x))
	}
	return out, nil
}
