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

// dsv4PoolOps are the ops of kernels/dsv4_pool.cu, as both the CPU backend and this one have
// them (Optional.DSV4 is handed out only once every DeepSeek-V4 op is there).
type dsv4PoolOps interface {
	backend.Backend
	WindowPool(a backend.WindowPoolArgs) error
	WindowPoolBackward(a backend.WindowPoolBackwardArgs) error
	IndexScores(a backend.IndexScoresArgs) error
}

// windowPoolCase is one window pooling of N rows of W channels, Rate at a time.
type windowPoolCase struct {
	n, w, rate int
	overlap    bool
	dt         tensor.DType
}

func (c windowPoolCase) String() string {
	return fmt.Sprintf("pool N %d W %d rate %d overlap %v %s", c.n, c.w, c.rate, c.overlap, c.dt)
}

func (c windowPoolCase) d() int {
	if c.overlap {
		return c.w / 2
	}
	return c.w
}

// dsv4Fill returns n values of scale·N(0,1) from seed, exact in dt.
func dsv4Fill(n int, seed uint64, scale float64, dt tensor.DType) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
		if dt == tensor.BF16 {
			v[i] = tensor.BF16ToF32(tensor.F32ToBF16(v[i]))
		}
	}
	return v
}

// windowPoolData are a case's inputs: the forward's, the output gradient and the gradients'
// values before the backward adds to them.
type windowPoolData struct{ kv, gate, ape, dout, dkv, dgate, gape []float32 }

func (c windowPoolCase) data() windowPoolData {
	nw, m := c.n/c.rate, c.rate
	return windowPoolData{
		kv: dsv4Fill(c.n*c.w, 1, 1, c.dt), gate: dsv4Fill(c.n*c.w, 2, 1.5, c.dt), ape: dsv4Fill(m*c.w, 3, 0.7, c.dt),
		dout: dsv4Fill(nw*c.d(), 4, 1, c.dt), dkv: dsv4Fill(c.n*c.w, 5, 0.3, c.dt),
		dgate: dsv4Fill(c.n*c.w, 6, 0.3, c.dt), gape: dsv4Fill(m*c.w, 7, 0.3, c.dt),
	}
}

// dsv4Tensors uploads and frees the tensors of one run.
type dsv4Tensors struct {
	be backend.Backend
	ts []backend.T
}

func (u *dsv4Tensors) up(v []float32, dt tensor.DType, shape ...int) backend.T {
	t, err := backend.FromFloat32(u.be, v, dt, shape...)
	if err != nil {
		panic(err)
	}
	u.ts = append(u.ts, t)
	return t
}

func (u *dsv4Tensors) alloc(dt tensor.DType, shape ...int) backend.T {
	t, err := u.be.Alloc(dt, shape...)
	if err != nil {
		panic(err)
	}
	u.ts = append(u.ts, t)
	return t
}

func (u *dsv4Tensors) free() {
	for _, t := range u.ts {
		_ = u.be.Free(t)
	}
}

func (u *dsv4Tensors) down(ts map[string]backend.T) (map[string][]float32, error) {
	out := map[string][]float32{}
	for name, t := range ts {
		v, err := backend.ToFloat32(u.be, t)
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// runWindowPool runs WindowPool and WindowPoolBackward of be on the case and returns out, dkv,
// dgate and gape.
func runWindowPool(be dsv4PoolOps, c windowPoolCase, d windowPoolData) (map[string][]float32, error) {
	u := &dsv4Tensors{be: be}
	defer u.free()
	nw, D := c.n/c.rate, c.d()
	fa := backend.WindowPoolArgs{
		KV: u.up(d.kv, c.dt, c.n, c.w), Gate: u.up(d.gate, c.dt, c.n, c.w), APE: u.up(d.ape, c.dt, c.rate, c.w),
		Rate: c.rate, Overlap: c.overlap, Out: u.alloc(c.dt, nw, D),
	}
	if err := be.WindowPool(fa); err != nil {
		return nil, err
	}
	ba := backend.WindowPoolBackwardArgs{
		WindowPoolArgs: fa, DOut: u.up(d.dout, c.dt, nw, D),
		DKV: u.up(d.dkv, c.dt, c.n, c.w), DGate: u.up(d.dgate, c.dt, c.n, c.w), GAPE: u.up(d.gape, c.dt, c.rate, c.w),
	}
	if err := be.WindowPoolBackward(ba); err != nil {
		return nil, err
	}
	return u.down(map[string]backend.T{"out": fa.Out, "dkv": ba.DKV, "dgate": ba.DGate, "gape": ba.GAPE})
}

// windowPoolCases cover a trailing partial window, fewer rows than a window (no windows), rate
// 1, overlap and not, odd widths, more windows than one chunk of GAPE's partial sums, f32 and
// bf16.
var windowPoolCases = []windowPoolCase{
	{n: 16, w: 6, rate: 4, dt: tensor.F32},
	{n: 18, w: 5, rate: 4, dt: tensor.F32},
	{n: 18, w: 10, rate: 4, overlap: true, dt: tensor.F32},
	{n: 29, w: 14, rate: 3, overlap: true, dt: tensor.F32},
	{n: 9, w: 3, rate: 1, dt: tensor.F32},
	{n: 9, w: 6, rate: 1, overlap: true, dt: tensor.F32},
	{n: 3, w: 4, rate: 4, overlap: true, dt: tensor.F32},
	{n: 2, w: 3, rate: 4, dt: tensor.F32},
	{n: 40, w: 9, rate: 8, dt: tensor.BF16},
	{n: 27, w: 18, rate: 2, overlap: true, dt: tensor.BF16},
}

// indexScoresCase is one scoring of N queries of Hi heads of Di against n keys.
type indexScoresCase struct {
	n, keys, hi, di, rate int
	dt                    tensor.DType
}

func (c indexScoresCase) String() string {
	return fmt.Sprintf("index N %d n %d Hi %d Di %d rate %d %s", c.n, c.keys, c.hi, c.di, c.rate, c.dt)
}

// tol bounds max |err| / rms(ref) of the scores: the kernel's fp32 dot products and head sum
// against the CPU's float64 differ by rounding that grows with the square root of the Hi·Di
// terms of a score (about 1e-6 of the rms at 32 terms); a wrong key, head or mask is of order 1.
func (c indexScoresCase) tol() float64 {
	return 1e-5 * max(1, math.Sqrt(float64(c.hi*c.di)/32))
}

type indexScoresData struct{ q, keys, wts []float32 }

func (c indexScoresCase) data() indexScoresData {
	return indexScoresData{
		q: dsv4Fill(c.n*c.hi*c.di, 11, 1, c.dt), keys: dsv4Fill(c.keys*c.di, 12, 1, c.dt),
		wts: dsv4Fill(c.n*c.hi, 13, 1, c.dt),
	}
}

// runIndexScores runs IndexScores of be on the case (Out starting as NaN, so that an entry
// left unwritten shows) and returns the scores.
func runIndexScores(be dsv4PoolOps, c indexScoresCase, d indexScoresData) ([]float32, error) {
	u := &dsv4Tensors{be: be}
	defer u.free()
	nan := make([]float32, c.n*c.keys)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	a := backend.IndexScoresArgs{
		Q: u.up(d.q, c.dt, c.n, c.hi*c.di), Keys: u.up(d.keys, c.dt, c.keys, c.di), Weights: u.up(d.wts, c.dt, c.n, c.hi),
		Heads: c.hi, Rate: c.rate, Out: u.up(nan, tensor.F32, c.n, c.keys),
	}
	if err := be.IndexScores(a); err != nil {
		return nil, err
	}
	return backend.ToFloat32(be, a.Out)
}

// indexScoresCases cover one head and several, head dims not a multiple of the staged chunk,
// rate 1, more keys than any query sees, tiles partly past N and n, and tiles that no query of
// theirs sees (written -Inf without computing).
var indexScoresCases = []indexScoresCase{
	{n: 17, keys: 4, hi: 1, di: 8, rate: 4, dt: tensor.F32},
	{n: 70, keys: 17, hi: 3, di: 21, rate: 4, dt: tensor.F32},
	{n: 130, keys: 130, hi: 2, di: 16, rate: 1, dt: tensor.F32},
	{n: 65, keys: 70, hi: 2, di: 16, rate: 1, dt: tensor.F32}, // the last query alone sees the second key tile
	{n: 12, keys: 7, hi: 2, di: 3, rate: 2, dt: tensor.F32},
	{n: 130, keys: 66, hi: 4, di: 40, rate: 2, dt: tensor.BF16},
}

// dsv4PoolTol bounds max |err| / rms(ref): in f32 the kernels' fp32 sums and expf against the
// CPU's float64 differ by rounding (about 1e-7 of the rms); in bf16 an output may land one
// bf16 step away. A wrong slot, APE entry, mask or sum is of order 1.
func dsv4PoolTol(dt tensor.DType) float64 {
	if dt == tensor.BF16 {
		return 3e-2
	}
	return 1e-5
}

func compareWindowPool(t *testing.T, c windowPoolCase, got, want map[string][]float32, who string) {
	t.Helper()
	compareOutputs(t, c, []string{"out", "dkv", "dgate", "gape"}, got, want, who, func(_ string, w []float32) float64 {
		tol := dsv4PoolTol(c.dt)
		if c.dt == tensor.BF16 {
			// A bf16 result rounded once on each side can differ by one unit in the last place
			// of its largest elements: 2^-8 of the largest magnitude, several times the rms
			// in a gradient where a few slots take most of a window's weight (measured on the
			// H200: 0.042 of the rms for DKV at 4096 x 1024).
			tol += 2 * math.Pow(2, -8) * maxAbs(w) / rmsOf(w)
		}
		return tol
	})
}

// compareIndexScores checks that got is -Inf exactly where want is and within the tolerance
// elsewhere.
func compareIndexScores(t *testing.T, c indexScoresCase, got, want []float32, who string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%v: %s has %d scores, the CPU %d", c, who, len(got), len(want))
		return
	}
	var g, w []float32
	for i := range want {
		gi, wi := math.IsInf(float64(got[i]), -1), math.IsInf(float64(want[i]), -1)
		if gi != wi {
			t.Errorf("%v: %s: scores[%d,%d] = %v, the CPU %v", c, who, i/c.keys, i%c.keys, got[i], want[i])
			return
		}
		if !wi {
			g, w = append(g, got[i]), append(w, want[i])
		}
	}
	if len(w) == 0 {
		return
	}
	if e, tol := maxErrOverRMS(g, w), c.tol(); !(e <= tol) {
		t.Errorf("%v: %s max |err|/rms = %.3g against the CPU, above %.1e", c, who, e, tol)
	}
}

// TestDSV4PoolKernelsOnHost runs kernels/dsv4_pool.cu as host C++ (testdata/hostemu) on the
// cases of windowPoolCases and indexScoresCases and compares every output with the CPU
// backend's. GAPE's partial sums cover 3 windows each here (WP_CHUNK rewritten) so that the
// cases span several chunks and a partial last one. It needs a C++17 compiler and skips
// without one (fails under CI).
func TestDSV4PoolKernelsOnHost(t *testing.T) {
	src, err := kernelSource(dsv4PoolFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, def := range []string{fmt.Sprintf("#define WP_CHUNK %d\n", wpChunk), fmt.Sprintf("#define IS_T %d\n", isTile)} {
		if !strings.Contains(src, def) {
			t.Fatalf("%s does not have %q, which the launchers assume", dsv4PoolFile, strings.TrimSpace(def))
		}
	}
	src = strings.Replace(src, fmt.Sprintf("#define WP_CHUNK %d\n", wpChunk), "#define WP_CHUNK 3\n", 1)
	src = strings.ReplaceAll(src, "__shared__ ", "static ")
	bin := buildHostEmu(t, "DeepSeek-V4 pooling", "dsv4_pool_check", src, "-O1")
	c := cpu.New(cpu.Options{Workers: 1})
	defer c.Close()

	var in bytes.Buffer
	var wants []map[string][]float32
	for _, pc := range windowPoolCases {
		d := pc.data()
		want, err := runWindowPool(c, pc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", pc, err)
		}
		wants = append(wants, want)
		ov := 0
		if pc.overlap {
			ov = 1
		}
		fmt.Fprintf(&in, "pool %d %d %d %d %d\n", pc.n, pc.w, pc.rate, ov, int(pc.dt))
		for _, v := range [][]float32{d.kv, d.gate, d.ape, d.dout, d.dkv, d.dgate, d.gape} {
			writeFloats(&in, v)
		}
	}
	gots := runHostEmu(t, bin, &in, 4, len(windowPoolCases))
	for i, pc := range windowPoolCases {
		compareWindowPool(t, pc, gots[i], wants[i], "the host-emulated kernel")
	}

	in.Reset()
	var iwants [][]float32
	for _, ic := range indexScoresCases {
		d := ic.data()
		want, err := runIndexScores(c, ic, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", ic, err)
		}
		iwants = append(iwants, want)
		fmt.Fprintf(&in, "index %d %d %d %d %d %d\n", ic.n, ic.keys, ic.hi, ic.di, ic.rate, int(ic.dt))
		for _, v := range [][]float32{d.q, d.keys, d.wts} {
			writeFloats(&in, v)
		}
	}
	gots = runHostEmu(t, bin, &in, 1, len(indexScoresCases))
	for i, ic := range indexScoresCases {
		compareIndexScores(t, ic, gots[i]["scores"], iwants[i], "the host-emulated kernel")
	}
}

// maxAbs is the largest magnitude of v.
func maxAbs(v []float32) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(float64(x)))
	}
	return m
}

// rmsOf is the root mean square of v (never 0).
func rmsOf(v []float32) float64 {
	ss := 0.0
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	return math.Sqrt(ss/float64(max(len(v), 1)) + 1e-30)
}
