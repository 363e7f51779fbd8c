package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// GPU tests of kernels/moe.cu against the CPU backend, at shapes that take the vectorised bf16
// kernels (rows a multiple of 8 wide) and the scalar ones. Tolerances:
//
//   - router probabilities and weights: 1e-6 + 2e-5*|ref| (fp32 expf against the CPU's fp64
//     softmax rounded once); the selection must be identical for every token whose CPU scores
//     separate its K-th and (K+1)-th choice by more than 1e-5 (closer ones may swap);
//   - router backward: 1e-5*rms + 1e-4*|ref| for fp32 dlogits, 2*bf16Eps*|ref| more for bf16;
//   - permutation (offsets, order, slot, gathered rows): exact;
//   - permute backward and combine (fp32 sums in the same k order, one rounding): 1e-6*rms +
//     1e-6*|ref| in fp32, 2*bf16Eps*|ref| for bf16 outputs (one rounding may fall either way);
//   - combine backward: dYs as combine; dWeights (a block tree against the CPU's fp64 dot)
//     1e-5*rms + 1e-5*|ref|;
//   - packed SwiGLU: as TestGPUSwiGLU.

func moeOpt(t *testing.T, be backend.Backend) backend.Optional {
	t.Helper()
	o := be.Optional()
	if o.MoERoute == nil || o.MoEPermute == nil || o.MoECombine == nil || o.SwiGLUPacked == nil {
		t.Fatalf("%s lacks the MoE ops", be.Name())
	}
	return o
}

type routeCase struct {
	name string
	r    backend.MoERouting
	n, e int
	dt   tensor.DType // logits
	bias bool
}

var gpuRouteCases = []routeCase{
	{"qwen3_moe E128 K8 norm bf16", backend.MoERouting{TopK: 8, NormTopK: true}, 1000, 128, tensor.BF16, false},
	{"mixtral E8 K2 norm f32", backend.MoERouting{TopK: 2, NormTopK: true}, 777, 8, tensor.F32, false},
	{"olmoe E64 K8 f32", backend.MoERouting{TopK: 8}, 513, 64, tensor.F32, false},
	{"E160 K6 bias", backend.MoERouting{TopK: 6, NormTopK: true}, 300, 160, tensor.F32, true},
	{"K=E", backend.MoERouting{TopK: 4, NormTopK: true}, 65, 4, tensor.F32, false},
	{"K=1", backend.MoERouting{TopK: 1}, 65, 16, tensor.BF16, false},
	{"deepseek_v3 sigmoid E256 K8 groups 8/4", backend.MoERouting{Score: backend.RouterSigmoid, TopK: 8, NormTopK: true, RoutedScaling: 2.5, NGroup: 8, TopKGroup: 4}, 600, 256, tensor.F32, true},
	{"glm4_moe sigmoid E128 K8 groups 1", backend.MoERouting{Score: backend.RouterSigmoid, TopK: 8, NormTopK: true, RoutedScaling: 1.8, NGroup: 1, TopKGroup: 1}, 400, 128, tensor.BF16, true},
	// The shared expert's gate (engine/nn): a one-expert sigmoid router gives sigmoid(z).
	{"shared gate sigmoid E1 K1 bf16", backend.MoERouting{Score: backend.RouterSigmoid, TopK: 1}, 300, 1, tensor.BF16, false},
	// gpt-oss: softmax over the chosen logits, as a renormalised full softmax.
	{"gpt_oss E32 K4 norm bf16", backend.MoERouting{TopK: 4, NormTopK: true}, 500, 32, tensor.BF16, false},
}

type routeOut struct {
	probs, weights, probSum []float32
	sel, counts             []int32
}

func runRoute(t *testing.T, be backend.Backend, c routeCase, logits, bias []float32) routeOut {
	t.Helper()
	o := moeOpt(t, be)
	k := c.r.TopK
	mk := func(dt tensor.DType, shape ...int) tensor.Tensor {
		x, err := be.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Free(x) })
		return x
	}
	lt, err := backend.FromFloat32(be, logits, c.dt, c.n, c.e)
	if err != nil {
		t.Fatal(err)
	}
	a := backend.MoERouteArgs{MoERouting: c.r, Logits: lt, Probs: mk(tensor.F32, c.n, c.e), Sel: mk(tensor.I32, c.n, k),
		Weights: mk(tensor.F32, c.n, k), Counts: mk(tensor.I32, c.e), ProbSum: mk(tensor.F32, c.e)}
	if bias != nil {
		if a.Bias, err = backend.FromFloat32(be, bias, tensor.F32, c.e); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.MoERoute(a); err != nil {
		t.Fatalf("%s: %v", be.Name(), err)
	}
	var out routeOut
	get := func(x tensor.Tensor) []float32 {
		v, err := backend.ToFloat32(be, x)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	geti := func(x tensor.Tensor) []int32 {
		v, err := backend.ToInt32(be, x)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	out.probs, out.weights, out.probSum = get(a.Probs), get(a.Weights), get(a.ProbSum)
	out.sel, out.counts = geti(a.Sel), geti(a.Counts)
	return out
}

func within(a, b float64, abs, rel float64) bool { return math.Abs(a-b) <= abs+rel*math.Abs(b) }

// moeGPU is the GPU backend with the MoE routing kernels offered (HALO_CUDA_MOE_KERNELS=on) for
// the duration of the test, whatever the environment says.
func moeGPU(t *testing.T) *Backend {
	t.Helper()
	g := gpu(t)
	if !g.moeKernels {
		g.moeKernels = true
		t.Cleanup(func() { g.moeKernels = false })
	}
	return g
}

// TestGPUMoERoute compares the router with the CPU's on the routings of the supported families.
func TestGPUMoERoute(t *testing.T) {
	g := moeGPU(t)
	ref := cpu.New(cpu.Options{})
	defer ref.Close()
	for _, c := range gpuRouteCases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.e)))
			logits := make([]float32, c.n*c.e)
			for i := range logits {
				logits[i] = float32(rng.NormFloat64() * 2)
				if c.dt == tensor.BF16 {
					logits[i] = tensor.BF16ToF32(tensor.F32ToBF16(logits[i]))
				}
			}
			var bias []float32
			if c.bias {
				bias = make([]float32, c.e)
				for i := range bias {
					bias[i] = float32(rng.NormFloat64() * 0.05)
				}
			}
			want := runRoute(t, ref, c, logits, bias)
			got := runRoute(t, g, c, logits, bias)
			for i := range want.probs {
				if !within(float64(got.probs[i]), float64(want.probs[i]), 1e-6, 2e-5) {
					t.Fatalf("probs[%d] = %g, CPU %g", i, got.probs[i], want.probs[i])
				}
			}
			k, close := c.r.TopK, 0
			for n := range c.n {
				if nearTie(logits[n*c.e:(n+1)*c.e], want.probs[n*c.e:(n+1)*c.e], bias, want.sel[n*k:(n+1)*k], c.r) {
					close++
					continue
				}
				for j := range k {
					q := n*k + j
					if got.sel[q] != want.sel[q] {
						t.Fatalf("token %d: sel %v, CPU %v", n, got.sel[n*k:(n+1)*k], want.sel[n*k:(n+1)*k])
					}
					if !within(float64(got.weights[q]), float64(want.weights[q]), 1e-6, 2e-5) {
						t.Fatalf("token %d: weight %d = %g, CPU %g", n, j, got.weights[q], want.weights[q])
					}
				}
			}
			if close > c.n/10 {
				t.Fatalf("%d of %d tokens have near-tied choices: the case does not test the selection", close, c.n)
			}
			counts := make([]int32, c.e)
			for _, x := range got.sel {
				counts[x]++
			}
			for e := range counts {
				if got.counts[e] != counts[e] {
					t.Fatalf("counts[%d] = %d, the GPU's selection has %d", e, got.counts[e], counts[e])
				}
				if !within(float64(got.probSum[e]), float64(want.probSum[e]), 1e-5, 2e-5) {
					t.Fatalf("probSum[%d] = %g, CPU %g", e, got.probSum[e], want.probSum[e])
				}
			}
			t.Logf("%d tokens, %d with near-tied choices not compared", c.n, close)
		})
	}
}

// nearTie reports whether a token's choice could flip under fp32 rounding: two candidate
// scores (or, grouped, two group scores) at the selection boundary within 1e-5. Experts with
// equal logits and bias tie exactly on both backends (ties go to the lower index on both), so
// they are compared.
func nearTie(z, p, bias []float32, sel []int32, r backend.MoERouting) bool {
	e := len(p)
	same := func(i, j int) bool { return z[i] == z[j] && (bias == nil || bias[i] == bias[j]) }
	score := make([]float64, e)
	for j := range score {
		score[j] = float64(p[j])
		if bias != nil {
			score[j] += float64(bias[j])
		}
	}
	if r.Grouped() {
		per := e / r.NGroup
		gs := make([]float64, r.NGroup)
		for g := range gs {
			s := append([]float64(nil), score[g*per:(g+1)*per]...)
			sort.Sort(sort.Reverse(sort.Float64Slice(s)))
			gs[g] = s[0]
			if per > 1 {
				gs[g] += s[1]
			}
		}
		srt := append([]float64(nil), gs...)
		sort.Sort(sort.Reverse(sort.Float64Slice(srt)))
		if r.TopKGroup < r.NGroup && srt[r.TopKGroup-1]-srt[r.TopKGroup] < 1e-5 {
			return true
		}
	}
	chosen := map[int32]bool{}
	weakest := int(sel[len(sel)-1])
	for _, x := range sel {
		chosen[x] = true
	}
	for j, s := range score {
		if !chosen[int32(j)] && math.Abs(score[weakest]-s) < 1e-5 && !same(weakest, j) {
			// an unchosen expert that scores within 1e-5 of the weakest chosen one (in a
			// dropped group it could not have been chosen, which only makes this stricter)
			return true
		}
	}
	for i := 1; i < len(sel); i++ {
		a, b := int(sel[i-1]), int(sel[i])
		if math.Abs(score[a]-score[b]) < 1e-5 && !same(a, b) {
			return true // the order of two chosen experts may swap
		}
	}
	return false
}

// TestGPUMoERouteBackward feeds both backends the CPU forward's routing and compares dlogits.
func TestGPUMoERouteBackward(t *testing.T) {
	g := moeGPU(t)
	for _, c := range gpuRouteCases {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			k := c.r.TopK
			rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.e)))
			var probs []float64
			for range c.n {
				z := make([]float64, c.e)
				s := 0.0
				for j := range z {
					z[j] = rng.NormFloat64() * 2
					if c.r.Score == backend.RouterSigmoid {
						z[j] = 1 / (1 + math.Exp(-z[j]))
					} else {
						z[j] = math.Exp(z[j])
						s += z[j]
					}
				}
				for j := range z {
					if s > 0 {
						z[j] /= s
					}
				}
				probs = append(probs, z...)
			}
			sel := make([]int32, c.n*k)
			for n := range c.n {
				perm := rng.Perm(c.e)
				for j := range k {
					sel[n*k+j] = int32(perm[j])
				}
			}
			rel := 1e-4
			if dt == tensor.BF16 {
				rel += 2 * bf16Eps
			}
			tensors := []tspec{
				{Name: "probs", DType: tensor.F32, Shape: []int{c.n, c.e}, Gen: gen{}},
				{Name: "sel", DType: tensor.I32, Shape: []int{c.n, k}, Gen: gen{Ints: sel}},
				{Name: "weights", DType: tensor.F32, Shape: []int{c.n, k}, Gen: gen{Scale: 0.3}},
				{Name: "dweights", DType: tensor.F32, Shape: []int{c.n, k}, Gen: gen{Scale: 1}},
				{Name: "aux", DType: tensor.F32, Shape: []int{c.e}, Gen: gen{Scale: 0.1}},
				{Name: "dlogits", DType: dt, Shape: []int{c.n, c.e}, Out: true, AbsFrac: 1e-5, Rel: rel},
			}
			oc := opCase{
				Name:    fmt.Sprintf("moe_route_backward/%s/%s", c.name, dt),
				Tensors: tensors,
				Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
					p32 := make([]float32, len(probs))
					for i, v := range probs {
						p32[i] = float32(v)
					}
					if err := be.Upload(ts["probs"], mustEncode(tensor.F32, p32)); err != nil {
						return err
					}
					return be.Optional().MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: c.r, Probs: ts["probs"], Sel: ts["sel"],
						Weights: ts["weights"], DWeights: ts["dweights"], AuxGrad: ts["aux"], DLogits: ts["dlogits"]})
				},
			}
			t.Run(oc.Name, func(t *testing.T) { runCase(t, g, oc) })
		}
	}
}

// moeSel draws an uneven routing of n tokens over e experts, K distinct experts per token,
// with expert `empty` never chosen (none when empty < 0) and low experts favoured. It panics
// when k distinct experts cannot be drawn, rather than loop for ever.
func moeSel(rng *rand.Rand, n, e, k, empty int) []int32 {
	avail := e
	if empty >= 0 && empty < e {
		avail--
	}
	if k > avail {
		panic(fmt.Sprintf("moeSel: %d distinct experts of %d with one kept empty", k, e))
	}
	sel := make([]int32, 0, n*k)
	for range n {
		chosen := map[int]bool{}
		for len(chosen) < k {
			x := int(math.Abs(rng.NormFloat64()) * float64(e) / 2.5)
			if x >= e || x == empty || chosen[x] {
				x = rng.IntN(e)
			}
			if x == empty || chosen[x] {
				continue
			}
			chosen[x] = true
			sel = append(sel, int32(x))
		}
	}
	return sel
}

// TestGPUMoEPermute compares the counting sort and gather (exactly) and the gather's backward.
func TestGPUMoEPermute(t *testing.T) {
	g := moeGPU(t)
	for _, s := range []struct {
		N, E, K, C int
		dt         tensor.DType
	}{
		{777, 64, 8, 1024, tensor.BF16}, // 16-byte rows
		{300, 8, 2, 33, tensor.F32},     // 4-byte words
		{129, 16, 4, 7, tensor.BF16},    // 2-byte words
		{1, 4, 4, 64, tensor.BF16},      // K=E, one token
		{2048, 128, 8, 256, tensor.BF16},
	} {
		rng := rand.New(rand.NewPCG(uint64(s.N), uint64(s.C)))
		empty := s.E / 2
		if s.K == s.E {
			empty = -1 // every expert is chosen: none can stay empty
		}
		sel := moeSel(rng, s.N, s.E, s.K, empty)
		S := s.N * s.K
		rel := 1e-6
		if s.dt == tensor.BF16 {
			rel = 2 * bf16Eps
		}
		fwd := opCase{
			Name: fmt.Sprintf("moe_permute/%s/N%d_E%d_K%d_C%d", s.dt, s.N, s.E, s.K, s.C),
			Tensors: []tspec{
				{Name: "sel", DType: tensor.I32, Shape: []int{s.N, s.K}, Gen: gen{Ints: sel}},
				{Name: "x", DType: s.dt, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}},
				{Name: "offsets", DType: tensor.I32, Shape: []int{s.E + 1}, Out: true},
				{Name: "order", DType: tensor.I32, Shape: []int{S}, Out: true},
				{Name: "slot", DType: tensor.I32, Shape: []int{s.N, s.K}, Out: true},
				{Name: "xs", DType: s.dt, Shape: []int{S, s.C}, Out: true},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.Optional().MoEPermute(backend.MoEPermuteArgs{E: s.E, Sel: ts["sel"], X: ts["x"], Offsets: ts["offsets"], Order: ts["order"], Slot: ts["slot"], Xs: ts["xs"]})
			},
		}
		t.Run(fwd.Name, func(t *testing.T) { runCase(t, g, fwd) })
		// A slot permutation as the forward makes it (any permutation of [0,S) will do).
		perm := rng.Perm(S)
		slot := make([]int32, S)
		for i, p := range perm {
			slot[i] = int32(p)
		}
		for _, acc := range []bool{false, true} {
			bwd := opCase{
				Name: fmt.Sprintf("moe_permute_backward/%s/N%d_K%d_C%d/acc=%v", s.dt, s.N, s.K, s.C, acc),
				Tensors: []tspec{
					{Name: "dxs", DType: s.dt, Shape: []int{S, s.C}, Gen: gen{Scale: 1}},
					{Name: "slot", DType: tensor.I32, Shape: []int{s.N, s.K}, Gen: gen{Ints: slot}},
					{Name: "dx", DType: s.dt, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-6, Rel: rel},
				},
				Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
					return be.Optional().MoEPermuteBackward(backend.MoEPermuteBackwardArgs{DXs: ts["dxs"], Slot: ts["slot"], DX: ts["dx"], Accumulate: acc})
				},
			}
			t.Run(bwd.Name, func(t *testing.T) { runCase(t, g, bwd) })
		}
	}
}

// TestGPUMoECombine compares the weighted combine and its backward.
func TestGPUMoECombine(t *testing.T) {
	g := moeGPU(t)
	for _, s := range []struct {
		N, K, C int
		dt      tensor.DType
	}{{777, 8, 1024, tensor.BF16}, {300, 2, 33, tensor.F32}, {64, 1, 4096, tensor.BF16}, {5, 4, 7, tensor.F32}, {50, 3, 36, tensor.BF16}} {
		rng := rand.New(rand.NewPCG(uint64(s.N), uint64(s.C)))
		S := s.N * s.K
		perm := rng.Perm(S)
		slot := make([]int32, S)
		for i, p := range perm {
			slot[i] = int32(p)
		}
		rel := 1e-6
		if s.dt == tensor.BF16 {
			rel = 2 * bf16Eps
		}
		for _, acc := range []bool{false, true} {
			fwd := opCase{
				Name:   fmt.Sprintf("moe_combine/%s/N%d_K%d_C%d/acc=%v", s.dt, s.N, s.K, s.C, acc),
				Inputs: fmt.Sprintf("combine %d %d %d", s.N, s.K, s.C),
				Tensors: []tspec{
					{Name: "ys", DType: s.dt, Shape: []int{S, s.C}, Gen: gen{Scale: 1}},
					{Name: "slot", DType: tensor.I32, Shape: []int{s.N, s.K}, Gen: gen{Ints: slot}},
					{Name: "w", DType: tensor.F32, Shape: []int{s.N, s.K}, Gen: gen{Scale: 0.5}},
					{Name: "out", DType: s.dt, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-6, Rel: rel},
				},
				Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
					return be.Optional().MoECombine(backend.MoECombineArgs{Ys: ts["ys"], Slot: ts["slot"], Weights: ts["w"], Out: ts["out"], Accumulate: acc})
				},
			}
			t.Run(fwd.Name, func(t *testing.T) { runCase(t, g, fwd) })
		}
		bwd := opCase{
			Name: fmt.Sprintf("moe_combine_backward/%s/N%d_K%d_C%d", s.dt, s.N, s.K, s.C),
			Tensors: []tspec{
				{Name: "dout", DType: s.dt, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}},
				{Name: "ys", DType: s.dt, Shape: []int{S, s.C}, Gen: gen{Scale: 1}},
				{Name: "slot", DType: tensor.I32, Shape: []int{s.N, s.K}, Gen: gen{Ints: slot}},
				{Name: "w", DType: tensor.F32, Shape: []int{s.N, s.K}, Gen: gen{Scale: 0.5}},
				{Name: "dys", DType: s.dt, Shape: []int{S, s.C}, Out: true, AbsFrac: 1e-6, Rel: rel},
				{Name: "dw", DType: tensor.F32, Shape: []int{s.N, s.K}, Out: true, AbsFrac: 1e-5, Rel: 1e-5},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.Optional().MoECombineBackward(backend.MoECombineBackwardArgs{DOut: ts["dout"], Ys: ts["ys"], Slot: ts["slot"], Weights: ts["w"], DYs: ts["dys"], DWeights: ts["dw"]})
			},
		}
		t.Run(bwd.Name, func(t *testing.T) { runCase(t, g, bwd) })
	}
}

// TestGPUSwiGLUPacked compares SwiGLU over packed gate|up rows, forward and in-place backward.
func TestGPUSwiGLUPacked(t *testing.T) {
	packedActivationCases(t, "swiglu_packed", 768, func(o backend.Optional) (packedFwd, packedBwd) {
		return o.SwiGLUPacked, o.SwiGLUPackedBackward
	})
}

// TestGPUGeGLUPacked compares GeGLU over packed gate|up rows (Gemma 4's experts), forward and
// in-place backward, on the bf16x8 kernels (I a multiple of 8) and the scalar ones.
func TestGPUGeGLUPacked(t *testing.T) {
	packedActivationCases(t, "geglu_packed", 704, func(o backend.Optional) (packedFwd, packedBwd) {
		return o.GeGLUPacked, o.GeGLUPackedBackward
	})
}

type (
	packedFwd func(out, gateUp tensor.Tensor) error
	packedBwd func(dGateUp, dOut, gateUp tensor.Tensor) error
)

// packedActivationCases compares a packed gate|up activation (ops picks its forward and
// backward from a backend's Optional) with the CPU's, forward and in-place backward, over rows
// of width wide (bf16, the bf16x8 kernels), 1000 (f32) and 5 (bf16, the scalar kernels).
func packedActivationCases(t *testing.T, name string, wide int, ops func(backend.Optional) (packedFwd, packedBwd)) {
	g := moeGPU(t)
	for _, s := range []struct {
		R, I int
		dt   tensor.DType
	}{{512, wide, tensor.BF16}, {37, 1000, tensor.F32}, {3, 5, tensor.BF16}} {
		rel := 2 * bf16Eps
		if s.dt == tensor.F32 {
			rel = 1e-5
		}
		fwd := opCase{
			Name: fmt.Sprintf("%s/%s/R%d_I%d", name, s.dt, s.R, s.I),
			Tensors: []tspec{
				{Name: "gu", DType: s.dt, Shape: []int{s.R, 2 * s.I}, Gen: gen{Scale: 2}},
				{Name: "out", DType: s.dt, Shape: []int{s.R, s.I}, Out: true, AbsFrac: 1e-4, Rel: rel},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				f, _ := ops(be.Optional())
				return f(ts["out"], ts["gu"])
			},
		}
		t.Run(fwd.Name, func(t *testing.T) { runCase(t, g, fwd) })
		bwd := opCase{
			Name: fmt.Sprintf("%s_backward/%s/R%d_I%d", name, s.dt, s.R, s.I),
			Tensors: []tspec{
				{Name: "gu", DType: s.dt, Shape: []int{s.R, 2 * s.I}, Gen: gen{Scale: 2}, Out: true, AbsFrac: 1e-4, Rel: rel},
				{Name: "dout", DType: s.dt, Shape: []int{s.R, s.I}, Gen: gen{Scale: 1}},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				_, f := ops(be.Optional())
				return f(ts["gu"], ts["dout"], ts["gu"])
			},
		}
		t.Run(bwd.Name, func(t *testing.T) { runCase(t, g, bwd) })
	}
}

// TestGPUMoERouteExpertScale compares the router with a per-expert scale (Gemma 4's
// per_expert_scale, MoERoute's ExpertScale) with the CPU's: the weights of every token whose
// choice is not near-tied, and the backward's dlogits and dExpertScale (the per-token terms
// summed per expert by the column-sum kernels) on the CPU forward's routing. Tolerances as
// TestGPUMoERoute and TestGPUMoERouteBackward; dExpertScale, an fp32 sum over N tokens against
// the CPU's fp64 one, within 1e-5*rms + 1e-4*|ref|.
func TestGPUMoERouteExpertScale(t *testing.T) {
	g := moeGPU(t)
	ref := cpu.New(cpu.Options{})
	defer ref.Close()
	for _, c := range []routeCase{
		{"gemma4 E128 K8 norm bf16", backend.MoERouting{TopK: 8, NormTopK: true}, 1000, 128, tensor.BF16, false},
		{"E8 K2 norm f32", backend.MoERouting{TopK: 2, NormTopK: true}, 777, 8, tensor.F32, false},
		{"K=1", backend.MoERouting{TopK: 1, NormTopK: true}, 300, 16, tensor.F32, false},
		{"K=E", backend.MoERouting{TopK: 4, NormTopK: true}, 65, 4, tensor.F32, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n)+1, uint64(c.e)))
			k := c.r.TopK
			logits := make([]float32, c.n*c.e)
			for i := range logits {
				logits[i] = float32(rng.NormFloat64() * 2)
				if c.dt == tensor.BF16 {
					logits[i] = tensor.BF16ToF32(tensor.F32ToBF16(logits[i]))
				}
			}
			scale := make([]float32, c.e)
			for i := range scale {
				scale[i] = float32(1 + 0.3*rng.NormFloat64())
			}
			dw := make([]float32, c.n*k)
			for i := range dw {
				dw[i] = float32(rng.NormFloat64())
			}
			type out struct {
				probs, weights, dlogits, dscale []float32
				sel                             []int32
			}
			run := func(be backend.Backend, probs []float32, sel []int32) out {
				o := moeOpt(t, be)
				mk := func(dt tensor.DType, shape ...int) tensor.Tensor {
					x, err := be.Alloc(dt, shape...)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { be.Free(x) })
					return x
				}
				up := func(v []float32, dt tensor.DType, shape ...int) tensor.Tensor {
					x, err := backend.FromFloat32(be, v, dt, shape...)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { be.Free(x) })
					return x
				}
				get := func(x tensor.Tensor) []float32 {
					v, err := backend.ToFloat32(be, x)
					if err != nil {
						t.Fatal(err)
					}
					return v
				}
				st := up(scale, tensor.F32, c.e)
				a := backend.MoERouteArgs{MoERouting: c.r, Logits: up(logits, c.dt, c.n, c.e), Probs: mk(tensor.F32, c.n, c.e),
					Sel: mk(tensor.I32, c.n, k), Weights: mk(tensor.F32, c.n, k), ExpertScale: st}
				if err := o.MoERoute(a); err != nil {
					t.Fatalf("%s: %v", be.Name(), err)
				}
				var r out
				r.probs, r.weights = get(a.Probs), get(a.Weights)
				var err error
				if r.sel, err = backend.ToInt32(be, a.Sel); err != nil {
					t.Fatal(err)
				}
				// The backward runs on the given routing (the CPU's), so that both backends
				// differentiate the same selection.
				if probs == nil {
					probs, sel = r.probs, r.sel
				}
				ps := up(probs, tensor.F32, c.n, c.e)
				sl, err := backend.FromInt32(be, sel, c.n, k)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { be.Free(sl) })
				w := make([]float32, c.n*k)
				for n := range c.n {
					d := float32(0)
					for j := range k {
						d += probs[n*c.e+int(sel[n*k+j])]
					}
					for j := range k {
						x := sel[n*k+j]
						w[n*k+j] = probs[n*c.e+int(x)] / d * scale[x]
					}
				}
				dz, ds := mk(tensor.F32, c.n, c.e), mk(tensor.F32, c.e)
				if err := o.MoERouteBackward(backend.MoERouteBackwardArgs{MoERouting: c.r, Probs: ps, Sel: sl, Weights: up(w, tensor.F32, c.n, k),
					DWeights: up(dw, tensor.F32, c.n, k), DLogits: dz, ExpertScale: st, DExpertScale: ds}); err != nil {
					t.Fatalf("%s: %v", be.Name(), err)
				}
				r.dlogits, r.dscale = get(dz), get(ds)
				return r
			}
			want := run(ref, nil, nil)
			got := run(g, want.probs, want.sel)
			close := 0
			for n := range c.n {
				if nearTie(logits[n*c.e:(n+1)*c.e], want.probs[n*c.e:(n+1)*c.e], nil, want.sel[n*k:(n+1)*k], c.r) {
					close++
					continue
				}
				for j := range k {
					q := n*k + j
					if got.sel[q] != want.sel[q] {
						t.Fatalf("token %d: sel %v, CPU %v", n, got.sel[n*k:(n+1)*k], want.sel[n*k:(n+1)*k])
					}
					if !within(float64(got.weights[q]), float64(want.weights[q]), 1e-6, 2e-5) {
						t.Fatalf("token %d: weight %d = %g, CPU %g", n, j, got.weights[q], want.weights[q])
					}
				}
			}
			if close > c.n/10 {
				t.Fatalf("%d of %d tokens have near-tied choices: the case does not test the selection", close, c.n)
			}
			for name, v := range map[string][2][]float32{"dlogits": {got.dlogits, want.dlogits}, "dExpertScale": {got.dscale, want.dscale}} {
				rms := 0.0
				for _, x := range v[1] {
					rms += float64(x) * float64(x)
				}
				rms = math.Sqrt(rms / float64(len(v[1])))
				for i := range v[1] {
					if !within(float64(v[0][i]), float64(v[1][i]), 1e-5*rms, 1e-4) {
						t.Fatalf("%s[%d] = %g on the GPU, %g on the CPU (rms %g)", name, i, v[0][i], v[1][i], rms)
					}
				}
			}
		})
	}
}
