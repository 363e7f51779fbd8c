package nn

import (
	"fmt"
	"testing"

	"github.com/halo-shell/halo-shell/engine/profile"
)

// TestMoEDeviceForwardKeepsWhatItCounts: after a training forward of the device path (and the
// model's read of the routing statistics), the block holds exactly MoEKeptBytes beyond its
// output: the sorted rows and the SwiGLU output are not kept.
func TestMoEDeviceForwardKeepsWhatItCounts(t *testing.T) {
	const C, F = 12, 10
	for _, tc := range []struct{ e, k, n int }{{5, 2, 9}, {4, 4, 7}, {16, 2, 3}} {
		t.Run(fmt.Sprintf("E%d_K%d_N%d", tc.e, tc.k, tc.n), func(t *testing.T) {
			e := newEnv(t)
			m := newStackedMoE(e, C, F, tc.e, tc.k, true)
			p := e.pass([]int{tc.n}, 4)
			x := e.randn(1, tc.n, C)
			before := e.b.MemStats().Allocated
			out, err := m.Forward(p, x, true)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Routing().Fetch(); err != nil {
				t.Fatal(err)
			}
			kept := e.b.MemStats().Allocated - before - out.Bytes()
			want := MoEKeptBytes(tc.n, C, tc.e, tc.k, F, 4)
			if kept != want {
				t.Fatalf("the forward keeps %d bytes, MoEKeptBytes counts %d", kept, want)
			}
			if saved := MoERecomputedBytes(tc.n, C, tc.k, F, 4); saved != int64(tc.n*tc.k*(C+F)*4) {
				t.Fatalf("recomputed bytes %d, want N*K*(C+I)*4 = %d", saved, tc.n*tc.k*(C+F)*4)
			}
			dx, err := m.Backward(p, e.randn(1, tc.n, C))
			if err != nil {
				t.Fatal(err)
			}
			if left := e.b.MemStats().Allocated - before - out.Bytes() - dx.Bytes() - int64(tc.n*C*4); left != 0 {
				t.Fatalf("%d bytes still held after the backward", left)
			}
		})
	}
}

// moeLaunchBudget is the most backend ops (each one launch of a fused op or GEMM on a device
// backend, or one transfer) one device-path MoE layer may issue in a training forward and its
// backward, with the aux gradient on and no balancing bias. Forward: router GEMM, MoERoute,
// MoEPermute, the statistics copy, two grouped GEMMs, SwiGLUPacked, MoECombine (8). Backward:
// MoECombineBackward, the re-sort (MoEPermute), four grouped GEMMs, the SwiGLU recompute and
// its backward, MoEPermuteBackward, the aux gradient's upload, MoERouteBackward and the
// router's LinearBackward (12). The statistics read (Routing.Fetch) stages the offsets and
// probability sums with two copies and reads them with one download.
//
// With HALO_MOE_EXPERT_OUTPUTS=recompute the backward replaces MoECombineBackward by the
// unweighted gather of the output gradient and of the weights (two MoEPermute), the weights'
// row dot product, two ScaleRows and the gather of their gradient (MoEPermuteBackward): 17.
const (
	moeForwardOps           = 8
	moeBackwardOps          = 12
	moeBackwardRecomputeOps = 17
	moeFetchOps             = 3
)

// TestMoEDeviceLayerLaunchBudget counts the ops of one device-path MoE layer through the
// profiling wrapper: the count does not grow with the experts (no per-expert op), stays within
// moeLaunchBudget, and the only host reads are Fetch's.
func TestMoEDeviceLayerLaunchBudget(t *testing.T) {
	const C, F, N = 12, 10, 9
	for _, tc := range []struct {
		outputs  string
		experts  int
		backward int
	}{{"keep", 4, moeBackwardOps}, {"keep", 16, moeBackwardOps}, {"recompute", 4, moeBackwardRecomputeOps}, {"recompute", 16, moeBackwardRecomputeOps}} {
		experts := tc.experts
		t.Run(fmt.Sprintf("outputs=%s/E%d", tc.outputs, experts), func(t *testing.T) {
			t.Setenv("HALO_MOE_EXPERT_OUTPUTS", tc.outputs)
			e := newEnv(t)
			m := newStackedMoE(e, C, F, experts, 2, true)
			rec := profile.NewRecorder()
			rec.Enable(true, true)
			p := e.pass([]int{N}, 4)
			p.B = profile.Wrap(e.b, rec)
			x := e.randn(1, N, C)
			dy := e.randn(1, N, C)
			count := func(phase string, run func() error) (ops, reads int) {
				t.Helper()
				rec.BeginStep(1)
				if err := run(); err != nil {
					t.Fatalf("%s: %v", phase, err)
				}
				st, ok := rec.EndStep()
				if !ok {
					t.Fatal("no step recorded")
				}
				for _, sp := range st.Spans {
					if sp.Name == "Download" {
						reads++
					}
				}
				return st.Ops, reads
			}
			var out, dx T
			fwd, fr := count("forward", func() (err error) {
				out, err = m.Forward(p, x, true)
				return err
			})
			fetch, reads := count("fetch", func() error { return m.Routing().Fetch() })
			m.AuxGrad = make([]float64, experts)
			bwd, br := count("backward", func() (err error) {
				dx, err = m.Backward(p, dy)
				return err
			})
			_ = free(e.b, &out, &dx)
			t.Logf("forward %d ops, backward %d ops, statistics %d reads", fwd, bwd, reads)
			if fwd != moeForwardOps || bwd != tc.backward {
				t.Errorf("forward %d ops, backward %d: the budget is %d and %d", fwd, bwd, moeForwardOps, tc.backward)
			}
			if fr != 0 || br != 0 || reads != 1 || fetch != moeFetchOps {
				t.Errorf("host reads: forward %d, backward %d, statistics %d in %d ops; want 0, 0 and 1 in %d", fr, br, reads, fetch, moeFetchOps)
			}
		})
	}
}

// TestFetchRoutingsReadsEveryLayerAtOnce: the statistics of several device-path layers (one
// with a balancing bias, whose unbiased counts come along) are read with one download and equal
// what each layer's own Fetch reads.
func TestFetchRoutingsReadsEveryLayerAtOnce(t *testing.T) {
	const C, F, N = 12, 10, 9
	e := newEnv(t)
	layers := []*MoE{newStackedMoE(e, C, F, 5, 2, true), newStackedMoE(e, C, F, 5, 2, false), newStackedMoE(e, C, F, 6, 3, true)}
	layers[1].Bias = []float32{0.3, -0.2, 0, 0.1, -0.4}
	rec := profile.NewRecorder()
	rec.Enable(true, true)
	p := e.pass([]int{N}, 4)
	p.B = profile.Wrap(e.b, rec)
	x := e.randn(1, N, C)
	type stats struct {
		load []int
		aux  float64
	}
	read := func(together bool) (got []stats, downloads int) {
		var rs []*Routing
		for _, m := range layers {
			out, err := m.Forward(p, x, false)
			if err != nil {
				t.Fatal(err)
			}
			_ = free(e.b, &out)
			rs = append(rs, m.Routing())
		}
		rec.BeginStep(1)
		if together {
			if err := FetchRoutings(rs); err != nil {
				t.Fatal(err)
			}
		} else {
			for _, r := range rs {
				if err := r.Fetch(); err != nil {
					t.Fatal(err)
				}
			}
		}
		st, _ := rec.EndStep()
		for _, sp := range st.Spans {
			if sp.Name == "Download" {
				downloads++
			}
		}
		for _, r := range rs {
			aux, _, err := LoadBalancingLoss([]*Routing{r}, 1)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, stats{r.Load(), aux})
		}
		return got, downloads
	}
	want, _ := read(false)
	before := e.b.MemStats().Allocated // the bias's device copy stays with its layer
	got, downloads := read(true)
	if downloads != 1 {
		t.Fatalf("%d downloads for %d layers, want one", downloads, len(layers))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("statistics read together %v, one by one %v", got, want)
	}
	if left := e.b.MemStats().Allocated - before; left != 0 {
		t.Fatalf("%d bytes of statistics left on the device", left)
	}
}

// TestMoEDeviceBackwardPeak: the device path's backward frees each buffer once its last use is
// queued, so beyond what the forward kept it holds at most dx, the weights' gradient and the
// larger of (dys, dact, act) and (dxs, the re-sorted rows and the sort's indices).
func TestMoEDeviceBackwardPeak(t *testing.T) {
	for _, outputs := range []string{"keep", "recompute"} {
		t.Run("outputs="+outputs, func(t *testing.T) {
			t.Setenv("HALO_MOE_EXPERT_OUTPUTS", outputs)
			backwardPeak(t, outputs == "recompute")
		})
	}
}

// backwardPeak is TestMoEDeviceBackwardPeak in one mode; without kept outputs the down
// projection's phase also holds the sorted weights and their gradient [S] F32.
func backwardPeak(t *testing.T, recompute bool) {
	const C, F, N, E, K = 12, 10, 9, 5, 2
	e := newEnv(t)
	m := newStackedMoE(e, C, F, E, K, true)
	p := e.pass([]int{N}, 4)
	x := e.randn(1, N, C)
	dy := e.randn(1, N, C)
	out, err := m.Forward(p, x, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Routing().Fetch(); err != nil {
		t.Fatal(err)
	}
	before := e.b.MemStats().Allocated
	e.b.ResetPeak()
	dx, err := m.Backward(p, dy)
	if err != nil {
		t.Fatal(err)
	}
	_ = free(e.b, &out, &dx)
	const S = N * K
	down := S*C + 2*S*F
	if recompute {
		down += 2 * S
	}
	experts := max(down, 2*S*C+(E+1)+S+N*K)
	bound := int64(4 * (N*C + N*K + experts))
	if grew := e.b.MemStats().Peak - before; grew > bound {
		t.Fatalf("the backward's peak is %d bytes above the forward's cache, want at most %d", grew, bound)
	}
}
