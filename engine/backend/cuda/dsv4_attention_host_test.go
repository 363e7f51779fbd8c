package cuda

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// sinkAttnCase is one DeepSeek-V4 sink attention: N queries of H heads of D over their own
// keys within a window (0: none) and C compressed entries of rate rows each, with a mask of
// the given kind ("": none, "pattern": rows of every kind, "zero": every entry hidden). warps
// and keyWarps are the emulation's block sizes (0: the launcher's); big marks a layer-sized
// case (the GPU test's).
type sinkAttnCase struct {
	n, c, h, d, window, rate int
	mask                     string
	noGSinks, big            bool
	dt                       tensor.DType
	warps, keyWarps          int
}

func (sc sinkAttnCase) String() string {
	return fmt.Sprintf("N %d, C %d (rate %d, mask %q), H %d, D %d, window %d, %s", sc.n, sc.c, sc.rate, sc.mask, sc.h,
		sc.d, sc.window, sc.dt)
}

func (sc sinkAttnCase) scale() float32 { return float32(1 / math.Sqrt(float64(sc.d))) }

// sinkAttnData are a case's inputs, exact in its dtype; dq, dkv and gs are the gradients'
// values before the backward.
type sinkAttnData struct {
	q, kv, sinks, dout, dq, dkv, gs []float32
	mask                            []int32
}

func (sc sinkAttnCase) data() sinkAttnData {
	round := func(v float64) float32 {
		if sc.dt == tensor.BF16 {
			return tensor.BF16ToF32(tensor.F32ToBF16(float32(v)))
		}
		return float32(v)
	}
	r := rand.New(rand.NewPCG(uint64(sc.n*131+sc.c*17+sc.h), uint64(sc.d)))
	fill := func(n int, std float64) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = round(std * r.NormFloat64())
		}
		return s
	}
	s := sc.n + sc.c
	// Scores Scale·q·kv of about 2 (q and kv of 1.2 each), sinks on their scale.
	d := sinkAttnData{
		q: fill(sc.n*sc.h*sc.d, 1.2), kv: fill(s*sc.d, 1.2), sinks: fill(sc.h, 2),
		dout: fill(sc.n*sc.h*sc.d, 1), dq: fill(sc.n*sc.h*sc.d, 1), dkv: fill(s*sc.d, 1), gs: fill(sc.h, 1),
	}
	d.mask = testIndexerMask(sc.mask, sc.n, sc.c)
	return d
}

// testIndexerMask is an indexer mask [n, c] of the kind the sink tests name: "pattern" (row 1
// sees no entry, the last row every one, the others a pattern of nonzero values), "zero"
// (every entry hidden), or none (nil) for anything else.
func testIndexerMask(kind string, n, c int) []int32 {
	switch kind {
	case "pattern":
		m := make([]int32, n*c)
		for i := range m {
			t, w := i/c, i%c
			switch {
			case t == 1:
			case t == n-1:
				m[i] = 1
			case (t*7+w*3)%5 < 2:
				m[i] = int32(1 + (t+w)%3)
			}
		}
		return m
	case "zero":
		return make([]int32, n*c)
	}
	return nil
}

// sinkAttnOps are the members of backend.DSV4Ops that these tests run, as the CPU and CUDA
// backends both have them.
type sinkAttnOps interface {
	backend.Backend
	SinkAttention(backend.SinkAttentionArgs) error
	SinkAttentionBackward(backend.SinkAttentionBackwardArgs) error
}

var sinkAttnOutputs = []string{"out", "lse", "dq", "dkv", "gsinks"}

// runSinkAttn runs the forward and the backward of be on the case and returns out, lse, dq,
// dkv and gsinks (nil without).
func runSinkAttn(be sinkAttnOps, sc sinkAttnCase, d sinkAttnData) (map[string][]float32, error) {
	var ts []backend.T
	defer func() {
		for _, t := range ts {
			_ = be.Free(t)
		}
	}()
	var err error
	keep := func(t backend.T, e error) backend.T {
		if e != nil && err == nil {
			err = e
		}
		ts = append(ts, t)
		return t
	}
	up := func(v []float32, shape ...int) backend.T { return keep(backend.FromFloat32(be, v, sc.dt, shape...)) }
	n, s, hd := sc.n, sc.n+sc.c, sc.h*sc.d
	a := backend.SinkAttentionArgs{
		Q: up(d.q, n, hd), KV: up(d.kv, s, sc.d), Sinks: up(d.sinks, sc.h),
		Heads: sc.h, Window: sc.window, Rate: sc.rate, Scale: sc.scale(),
		Out: keep(be.Alloc(sc.dt, n, hd)), LSE: keep(be.Alloc(tensor.F32, n, sc.h)),
	}
	if d.mask != nil {
		a.Mask = keep(backend.FromInt32(be, d.mask, n, sc.c))
	}
	ba := backend.SinkAttentionBackwardArgs{SinkAttentionArgs: a, DOut: up(d.dout, n, hd), DQ: up(d.dq, n, hd),
		DKV: up(d.dkv, s, sc.d)}
	if !sc.noGSinks {
		ba.GSinks = up(d.gs, sc.h)
	}
	if err != nil {
		return nil, err
	}
	if err := be.SinkAttention(a); err != nil {
		return nil, err
	}
	if err := be.SinkAttentionBackward(ba); err != nil {
		return nil, err
	}
	res := map[string][]float32{}
	for name, t := range map[string]backend.T{"out": a.Out, "lse": a.LSE, "dq": ba.DQ, "dkv": ba.DKV, "gsinks": ba.GSinks} {
		if t.IsNil() {
			continue
		}
		if res[name], err = backend.ToFloat32(be, t); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// tol bounds max |err| / rms(ref) per output: in f32 the kernels' fp32 sums against the
// CPU's float64 differ by up to 2e-6 on the host-emulation cases, more on layer-sized ones
// (a compressed entry's gradient sums over thousands of queries and heads: big raises the
// bound to 1e-4); in bf16 an output may land a bf16 step (2^-8 of its magnitude) away, a few
// 2^-8 of the rms (1.2e-2 measured). A wrong key, mask or gradient term is of order 1.
func (sc sinkAttnCase) tol() float64 {
	switch {
	case sc.dt == tensor.BF16:
		return 3e-2
	case sc.big:
		return 1e-4
	}
	return 2e-5
}

// compareSinkAttn reports each output's max |err| / rms(want).
func compareSinkAttn(t *testing.T, sc sinkAttnCase, got, want map[string][]float32, who string) {
	t.Helper()
	compareOutputs(t, sc, sinkAttnOutputs, got, want, who, func(string, []float32) float64 { return sc.tol() })
}

// sinkAttnCases cover one query, own keys only (no window, a window shorter than N, a window
// of 1), compressed entries without a mask, with one (rows seeing none, some, every one) and
// with every entry hidden, queries before the first entry is complete, candidates over several
// tiles, head dims that are odd, not a multiple of 32 and 512, one head and several (head
// groups with idle warps, heads over several dkv warps), without GSinks, in f32 and bf16.
var sinkAttnCases = []sinkAttnCase{
	{n: 1, h: 1, d: 3, dt: tensor.F32},
	{n: 1, c: 0, h: 3, d: 5, window: 2, dt: tensor.BF16, warps: 2},
	{n: 7, h: 2, d: 33, dt: tensor.F32},
	{n: 9, h: 3, d: 4, window: 3, dt: tensor.F32, warps: 2, keyWarps: 2},
	{n: 5, h: 2, d: 7, window: 1, dt: tensor.BF16},
	{n: 9, c: 4, h: 3, d: 17, window: 4, rate: 2, dt: tensor.F32, keyWarps: 3},
	{n: 10, c: 3, h: 2, d: 64, rate: 3, mask: "pattern", dt: tensor.F32},
	{n: 12, c: 6, h: 4, d: 9, window: 3, rate: 2, mask: "pattern", dt: tensor.BF16, warps: 3},
	{n: 6, c: 3, h: 1, d: 130, window: 2, rate: 2, mask: "zero", dt: tensor.F32},
	{n: 3, c: 1, h: 2, d: 3, window: 2, rate: 4, dt: tensor.F32},
	{n: 8, c: 2, h: 1, d: 11, window: 5, rate: 4, noGSinks: true, dt: tensor.BF16},
	{n: 40, c: 10, h: 2, d: 31, rate: 4, mask: "pattern", dt: tensor.F32, keyWarps: 4},
	{n: 6, c: 2, h: 2, d: 512, window: 4, rate: 3, mask: "pattern", dt: tensor.F32},
	{n: 6, c: 2, h: 2, d: 512, window: 4, rate: 3, dt: tensor.BF16},
}

// TestSinkAttentionKernelsOnHost runs kernels/dsv4_attention.cu as host C++ (testdata/hostemu:
// a block's threads as fibers) on sinkAttnCases and compares every output with the CPU
// backend's SinkAttention and SinkAttentionBackward. It needs a C++17 compiler and skips
// without one (fails under CI).
func TestSinkAttentionKernelsOnHost(t *testing.T) {
	src, err := kernelSource(sinkAttnFile)
	if err != nil {
		t.Fatal(err)
	}
	const dyn = "extern __shared__ float sa_sm[];"
	if n := strings.Count(src, dyn); n != 3 {
		t.Fatalf("%s declares its dynamic shared memory %d times; the harness expects 3", sinkAttnFile, n)
	}
	src = strings.ReplaceAll(src, dyn, "float* sa_sm = emu_smem;")
	src = strings.ReplaceAll(src, "__shared__ ", "static ")
	bin := buildHostEmu(t, "sink-attention", "dsv4_attention_check", src, "-O1")
	c := cpu.New(cpu.Options{Workers: 1})
	defer c.Close()
	var in bytes.Buffer
	var wants []map[string][]float32
	for _, sc := range sinkAttnCases {
		d := sc.data()
		want, err := runSinkAttn(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		wants = append(wants, want)
		warps, keyWarps := sc.warps, sc.keyWarps
		if warps == 0 {
			warps = min(sc.h, sinkAttnHeads)
		}
		if keyWarps == 0 {
			keyWarps = sinkAttnKeyWarps
		}
		hasMask := 0
		if d.mask != nil {
			hasMask = 1
		}
		fmt.Fprintf(&in, "%d %d %d %d %d %d %d %d %d %d %.9g\n", sc.n, sc.c, sc.h, sc.d, sc.window, sc.rate, hasMask,
			int(sc.dt), warps, keyWarps, sc.scale())
		writeFloats(&in, d.q)
		writeFloats(&in, d.kv)
		writeFloats(&in, d.sinks)
		for _, m := range d.mask {
			fmt.Fprintf(&in, "%d ", m)
		}
		for _, v := range [][]float32{d.dout, d.dq, d.dkv, d.gs} {
			writeFloats(&in, v)
		}
	}
	gots := runHostEmu(t, bin, &in, len(sinkAttnOutputs), len(sinkAttnCases))
	for ci, sc := range sinkAttnCases {
		if sc.noGSinks {
			delete(gots[ci], "gsinks") // the harness runs the kernel anyway; the op skips it
		}
		compareSinkAttn(t, sc, gots[ci], wants[ci], "the host-emulated kernel")
	}
}
