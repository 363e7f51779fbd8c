package cuda

import (
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUDSV4Hyper compares kernels/dsv4_hyper.cu with the CPU backend's hyper-connection
// weights, stream collapse and expansion, sqrt-softplus and split clamped SwiGLU, forward and
// backward: the host-emulation cases, then model-sized ones (DeepSeek-V4's 4 streams and 20
// Sinkhorn iterations over thousands of rows, 8 streams, the head's mix, 4096 channels,
// a million elements), in f32 and bf16, with dsv4HyperTol's bounds on every result.
func TestGPUDSV4Hyper(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	cases := slices.Clone(dsv4HyperCases)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		cases = append(cases,
			dsv4HyperCase{kind: "hyper", N: 4099, n: 4, iters: 20, dt: dt, eps: 1e-6},
			dsv4HyperCase{kind: "hyper", N: 600, n: 8, iters: 20, dt: dt, eps: 1e-6},
			dsv4HyperCase{kind: "hyper", N: 4099, n: 4, head: true, dt: dt, eps: 1e-6},
			dsv4HyperCase{kind: "collapse", N: 513, n: 4, C: 4096, dt: dt},
			dsv4HyperCase{kind: "expand", N: 513, n: 4, C: 4096, dt: dt},
			dsv4HyperCase{kind: "expand", N: 37, n: 8, C: 1000, dt: dt},
			dsv4HyperCase{kind: "sqrtsp", N: 1<<20 + 3, dt: dt},
			dsv4HyperCase{kind: "swiglu", N: 1<<20 + 3, dt: dt, limit: 10},
		)
	}
	for _, hc := range cases {
		want, err := runDSV4Hyper(c, hc)
		if err != nil {
			t.Fatalf("%v: CPU: %v", hc, err)
		}
		got, err := runDSV4Hyper(g, hc)
		if err != nil {
			t.Fatalf("%v: GPU: %v", hc, err)
		}
		compareDSV4Hyper(t, hc, got, want, "the GPU")
	}
	report.addCheck("DeepSeek-V4 hyper-connection kernels match the CPU", !t.Failed(),
		"f32 and bf16, 1 to 8 streams, 20 Sinkhorn iterations over 4099 rows, 4096 channels")
}

// TestGPUDSV4HyperDeterministic: the parameter gradients of HyperWeightsBackward are sums in a
// fixed order, so two runs agree bit for bit.
func TestGPUDSV4HyperDeterministic(t *testing.T) {
	g := gpu(t)
	hc := dsv4HyperCase{kind: "hyper", N: 5000, n: 4, iters: 20, dt: tensor.F32, eps: 1e-6}
	first, err := runDSV4Hyper(g, hc)
	if err != nil {
		t.Fatal(err)
	}
	for run := 0; run < 3; run++ {
		again, err := runDSV4Hyper(g, hc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"dz", "gscale", "gbase"} {
			if !slices.Equal(again[name], first[name]) {
				t.Fatalf("run %d: %s differs from the first run's", run+2, name)
			}
		}
	}
}

// TestGPUDSV4HyperRefusesManyStreams: more streams than the kernels hold are refused before
// anything is launched.
func TestGPUDSV4HyperRefusesManyStreams(t *testing.T) {
	g := gpu(t)
	const N, n = 2, dsv4MaxStreams + 1
	m := (2 + n) * n
	alloc := func(shape ...int) T {
		x, err := g.Alloc(tensor.F32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Free(x) })
		return x
	}
	a := backend.HyperWeightsArgs{Z: alloc(N, m), Scale: alloc(3), Base: alloc(m), Streams: n, Iters: 2, Eps: 1e-6,
		Pre: alloc(N, n), Post: alloc(N, n), Comb: alloc(N, n*n)}
	if err := g.HyperWeights(a); err == nil || !strings.Contains(err.Error(), "at most 8") {
		t.Fatalf("HyperWeights with %d streams: %v, want a refusal", n, err)
	}
	e := backend.StreamExpandArgs{Out: alloc(N, n), Post: alloc(N, n), F: alloc(N, 1), Comb: alloc(N, n*n), X: alloc(N, n)}
	if err := g.StreamExpand(e); err == nil || !strings.Contains(err.Error(), "at most 8") {
		t.Fatalf("StreamExpand with %d streams: %v, want a refusal", n, err)
	}
}
