package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// sinkSoftmaxCase is one DeepSeek-V4 sink softmax: N queries of H heads over their own keys
// within a window (0: none) and C compressed entries of rate rows each, with a mask of the
// given kind ("": none, "pattern": rows of every kind, "zero": every entry hidden); dt is the
// dtype of P, DS, Sinks and GSinks. big marks a layer-sized case, run with DS = P only.
type sinkSoftmaxCase struct {
	n, c, h, window, rate int
	mask                  string
	noGSinks, big         bool
	dt                    tensor.DType
}

func (sc sinkSoftmaxCase) String() string {
	return fmt.Sprintf("[N·H %d, S %d]: N %d, H %d, C %d (rate %d, mask %q), window %d, %s", sc.n*sc.h, sc.n+sc.c,
		sc.n, sc.h, sc.c, sc.rate, sc.mask, sc.window, sc.dt)
}

// sinkSoftmaxData are a case's inputs, exact in their dtypes: the scores x and dp [N·H, S],
// lse [N,H] for the forward with UseLSE, gs the GSinks before the backward.
type sinkSoftmaxData struct {
	x, dp, sinks, lse, gs []float32
	mask                  []int32
}

// data draws the inputs from a fast deterministic generator (the big cases hold hundreds of
// millions of scores): scores of about 2, sinks on their scale.
func (sc sinkSoftmaxCase) data() sinkSoftmaxData {
	state := uint64(sc.n*131+sc.c*17+sc.h*7+sc.window) | 1
	uniform := func() float64 { // splitmix64 in [-1, 1)
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		return float64(z>>11)/float64(1<<52) - 1
	}
	round := func(v float64) float32 {
		if sc.dt == tensor.BF16 {
			return tensor.BF16ToF32(tensor.F32ToBF16(float32(v)))
		}
		return float32(v)
	}
	s, R := sc.n+sc.c, sc.n*sc.h
	d := sinkSoftmaxData{x: make([]float32, R*s), dp: make([]float32, R*s), sinks: make([]float32, sc.h),
		lse: make([]float32, R), gs: make([]float32, sc.h)}
	for i := range d.x {
		d.x[i] = float32(3.4 * uniform())
		d.dp[i] = float32(1.7 * uniform())
	}
	for i := range d.sinks {
		d.sinks[i] = round(2 * uniform())
		d.gs[i] = round(uniform())
	}
	for i := range d.lse {
		d.lse[i] = float32(4 + uniform())
	}
	d.mask = testIndexerMask(sc.mask, sc.n, sc.c)
	return d
}

// sinkSoftmaxOps are the members of backend.DSV4Ops that these tests run.
type sinkSoftmaxOps interface {
	backend.Backend
	SinkSoftmax(backend.SinkSoftmaxArgs) error
	SinkSoftmaxBackward(backend.SinkSoftmaxBackwardArgs) error
}

// runSinkSoftmax runs be on the case: the forward writing LSE ("p", "lse"), the forward
// reading d.lse ("p_uselse"), the backward from the first forward into a DS of its own with
// GSinks ("ds", "gsinks") and into P itself ("ds_alias"). A big case runs the first forward and
// the backward into P only.
func runSinkSoftmax(be sinkSoftmaxOps, sc sinkSoftmaxCase, d sinkSoftmaxData) (map[string][]float32, error) {
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
	s, R := sc.n+sc.c, sc.n*sc.h
	a := backend.SinkSoftmaxArgs{
		X: keep(backend.FromFloat32(be, d.x, tensor.F32, R, s)), Sinks: keep(backend.FromFloat32(be, d.sinks, sc.dt, sc.h)),
		Heads: sc.h, Window: sc.window, Rate: sc.rate,
		P: keep(be.Alloc(sc.dt, R, s)), LSE: keep(be.Alloc(tensor.F32, sc.n, sc.h)),
	}
	if d.mask != nil {
		a.Mask = keep(backend.FromInt32(be, d.mask, sc.n, sc.c))
	}
	ba := backend.SinkSoftmaxBackwardArgs{P: a.P, DP: keep(backend.FromFloat32(be, d.dp, tensor.F32, R, s)),
		Sinks: a.Sinks, LSE: a.LSE, Heads: sc.h}
	if !sc.noGSinks {
		ba.GSinks = keep(backend.FromFloat32(be, d.gs, sc.dt, sc.h))
	}
	if err != nil {
		return nil, err
	}
	res := map[string][]float32{}
	get := func(name string, t backend.T) {
		if err == nil && !t.IsNil() {
			res[name], err = backend.ToFloat32(be, t)
		}
	}
	if err := be.SinkSoftmax(a); err != nil {
		return nil, err
	}
	get("p", a.P)
	get("lse", a.LSE)
	if !sc.big {
		au := a
		au.UseLSE = true
		au.P = keep(be.Alloc(sc.dt, R, s))
		au.LSE = keep(backend.FromFloat32(be, d.lse, tensor.F32, sc.n, sc.h))
		if err != nil {
			return nil, err
		}
		if err := be.SinkSoftmax(au); err != nil {
			return nil, err
		}
		get("p_uselse", au.P)
		bs := ba
		bs.DS = keep(be.Alloc(sc.dt, R, s))
		if err != nil {
			return nil, err
		}
		if err := be.SinkSoftmaxBackward(bs); err != nil {
			return nil, err
		}
		get("ds", bs.DS)
		get("gsinks", bs.GSinks)
		ba.GSinks = backend.T{}
	}
	ba.DS = a.P
	if err := be.SinkSoftmaxBackward(ba); err != nil {
		return nil, err
	}
	get("ds_alias", ba.DS)
	if sc.big {
		get("gsinks", ba.GSinks)
	}
	return res, err
}

// sinkSoftmaxOutputs are runSinkSoftmax's results.
var sinkSoftmaxOutputs = []string{"p", "lse", "p_uselse", "ds", "ds_alias", "gsinks"}

// tol bounds each output elementwise: |err| <= rel·|want| + abs·max|want|. In f32 the
// kernels' expf and fp32 sums against the CPU's float64 differ by a few 1e-6 of a value; in
// bf16 a value may land on the neighbouring bf16 step (up to 2^-7 of it), and DS on a step
// of the neighbouring P's. A hidden column that is not 0, a wrong mask or sum is of order 1.
func (sc sinkSoftmaxCase) tol(name string) (rel, abs float64) {
	switch {
	case name == "lse":
		return 3e-6, 1e-6
	case name == "gsinks" && sc.dt == tensor.F32:
		return 1e-4, 1e-4
	case name == "gsinks":
		return 2e-2, 1e-2
	case sc.dt == tensor.F32:
		return 3e-5, 1e-5
	}
	return 2e-2, 1e-3
}

// compareSinkSoftmax checks every output against the CPU's, and that P is exactly 0 where
// the CPU's is.
func compareSinkSoftmax(t *testing.T, sc sinkSoftmaxCase, got, want map[string][]float32, who string) {
	t.Helper()
	for _, name := range sinkSoftmaxOutputs {
		g, w := got[name], want[name]
		if len(g) != len(w) {
			t.Errorf("%v: %s: %s has %d values, the CPU %d", sc, name, who, len(g), len(w))
			continue
		}
		rel, abs := sc.tol(name)
		var top float64
		for _, v := range w {
			top = max(top, math.Abs(float64(v)))
		}
		for i := range w {
			e := math.Abs(float64(g[i]) - float64(w[i]))
			if !(e <= rel*math.Abs(float64(w[i]))+abs*top) || (w[i] == 0 && g[i] != 0 && name[0] == 'p') {
				t.Errorf("%v: %s[%d] = %.8g from %s, the CPU %.8g (bound %.1e relative + %.1e of max %.3g)", sc, name,
					i, g[i], who, w[i], rel, abs, top)
				break
			}
		}
	}
}

// sinkSoftmaxCases cover one query, own keys only (no window, a window shorter than N, a
// window of 1), compressed entries without a mask, with one (rows seeing none, some, every one)
// and with every entry hidden, queries before the first entry is complete, rows of several
// block strides, S a multiple of 4 (the 4-column kernels) and not, without GSinks, in f32 and
// bf16.
var sinkSoftmaxCases = []sinkSoftmaxCase{
	{n: 1, h: 1, dt: tensor.F32},
	{n: 1, h: 3, window: 2, dt: tensor.BF16},
	{n: 7, h: 2, dt: tensor.F32},
	{n: 8, h: 2, dt: tensor.BF16},
	{n: 9, h: 3, window: 3, dt: tensor.F32},
	{n: 5, h: 2, window: 1, dt: tensor.BF16},
	{n: 9, c: 3, h: 3, window: 4, rate: 2, dt: tensor.F32},
	{n: 10, c: 2, h: 2, rate: 3, mask: "pattern", dt: tensor.F32},
	{n: 12, c: 6, h: 4, window: 3, rate: 2, mask: "pattern", dt: tensor.BF16},
	{n: 6, c: 3, h: 1, window: 2, rate: 2, mask: "zero", dt: tensor.F32},
	{n: 3, c: 1, h: 2, window: 2, rate: 4, dt: tensor.F32},
	{n: 8, c: 2, h: 1, window: 5, rate: 4, noGSinks: true, dt: tensor.BF16},
	{n: 300, c: 75, h: 2, window: 64, rate: 4, mask: "pattern", dt: tensor.F32},
	{n: 300, c: 76, h: 2, window: 64, rate: 4, mask: "pattern", dt: tensor.BF16},
	{n: 1100, c: 9, h: 1, rate: 128, dt: tensor.F32},
	{n: 1101, c: 8, h: 1, window: 700, rate: 128, mask: "pattern", dt: tensor.BF16},
}

// TestGPUSinkSoftmax compares kernels/dsv4_softmax.cu with the CPU backend's SinkSoftmax and
// SinkSoftmaxBackward: the small cases, then layer-sized ones (DeepSeek-V4's [N·H, S] =
// [131072, 2560] in bf16: 2048 tokens of 64 heads, 512 compressed entries at rate 4, a window
// of 128 and the indexer's mask; a smaller f32 one; 8192 keys), and times the big bf16 one.
// The backward is also run twice on one input and must give the same bits.
func TestGPUSinkSoftmax(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	big := sinkSoftmaxCase{n: 2048, c: 512, h: 64, window: 128, rate: 4, mask: "pattern", dt: tensor.BF16, big: true}
	cases := append(append([]sinkSoftmaxCase{}, sinkSoftmaxCases...),
		sinkSoftmaxCase{n: 512, c: 128, h: 16, window: 128, rate: 4, mask: "pattern", dt: tensor.F32, big: true},
		sinkSoftmaxCase{n: 6144, c: 2048, h: 2, rate: 3, dt: tensor.BF16, big: true},
		big)
	for _, sc := range cases {
		d := sc.data()
		want, err := runSinkSoftmax(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		got, err := runSinkSoftmax(g, sc, d)
		if err != nil {
			t.Fatalf("%v: GPU: %v", sc, err)
		}
		compareSinkSoftmax(t, sc, got, want, "the GPU")
	}
	sc := sinkSoftmaxCases[len(sinkSoftmaxCases)-3]
	d := sc.data()
	first, err := runSinkSoftmax(g, sc, d)
	if err != nil {
		t.Fatal(err)
	}
	again, err := runSinkSoftmax(g, sc, d)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sinkSoftmaxOutputs {
		for i := range first[name] {
			if math.Float32bits(first[name][i]) != math.Float32bits(again[name][i]) {
				t.Fatalf("%v: %s[%d] = %g, then %g: the kernels are not deterministic", sc, name, i, first[name][i], again[name][i])
			}
		}
	}
	report.addCheck("sink-softmax kernels match the CPU", !t.Failed(), "f32 and bf16, up to [131072, 2560] and 8192 keys")
	timeSinkSoftmax(t, g, big)
}

// timeSinkSoftmax reports the forward's and the backward's (DS = P, with GSinks) times on a
// case and their bandwidth counting every byte of the rows once (X read and P written; P and
// DP read and DS written).
func timeSinkSoftmax(t *testing.T, g *Backend, sc sinkSoftmaxCase) {
	d := sc.data()
	s, R := sc.n+sc.c, sc.n*sc.h
	var ts []T
	up := func(v []float32, dt tensor.DType, shape ...int) T {
		x, err := backend.FromFloat32(g, v, dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, x)
		return x
	}
	defer func() {
		for _, x := range ts {
			_ = g.Free(x)
		}
	}()
	a := backend.SinkSoftmaxArgs{X: up(d.x, tensor.F32, R, s), Sinks: up(d.sinks, sc.dt, sc.h), Heads: sc.h,
		Window: sc.window, Rate: sc.rate, P: up(make([]float32, R*s), sc.dt, R, s), LSE: up(d.lse, tensor.F32, sc.n, sc.h)}
	if d.mask != nil {
		m, err := backend.FromInt32(g, d.mask, sc.n, sc.c)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, m)
		a.Mask = m
	}
	ba := backend.SinkSoftmaxBackwardArgs{P: a.P, DP: up(d.dp, tensor.F32, R, s), Sinks: a.Sinks, LSE: a.LSE,
		Heads: sc.h, DS: a.P, GSinks: up(d.gs, sc.dt, sc.h)}
	fwd := timeIt(t, g, 3, func() error { return g.SinkSoftmax(a) })
	bwd := timeIt(t, g, 3, func() error { return g.SinkSoftmaxBackward(ba) })
	el := float64(R) * float64(s)
	ps := float64(2)
	if sc.dt == tensor.F32 {
		ps = 4
	}
	report.addBench(benchmark{Name: fmt.Sprintf("dsv4_sink_softmax_%dx%d_%s", R, s, sc.dt), Values: map[string]float64{
		"fwd_ms": fwd, "bwd_ms": bwd, "fwd_GBps": el * (4 + ps) / fwd / 1e6, "bwd_GBps": el * (4 + 2*ps) / bwd / 1e6,
	}, Note: "median of 5 timed repetitions of 3 calls with CUDA events; bandwidth counts every element of the rows once (the kernels skip the hidden columns' reads)"})
}
