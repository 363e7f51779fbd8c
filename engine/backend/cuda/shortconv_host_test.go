package cuda

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// shortConvCase is one short convolution: documents of the given lengths packed into N rows
// (positions restart at 0 in each; the first document's start at first, as in a chunk cut
// from a longer sequence), C channels, L taps.
type shortConvCase struct {
	lens  []int
	first int // position of row 0 (a document cut before this chunk)
	c, l  int
	bias  bool
	dt    tensor.DType
}

func (sc shortConvCase) String() string {
	return fmt.Sprintf("docs %v from %d, C %d, L %d, bias %v, %s", sc.lens, sc.first, sc.c, sc.l, sc.bias, sc.dt)
}

// shortConvData are a case's inputs, exact in its dtype.
type shortConvData struct {
	n                           int
	bcx, w, bias, dg, gw, gbias []float32
	pos                         []int32
}

func (sc shortConvCase) data() shortConvData {
	var d shortConvData
	for i, n := range sc.lens {
		for p := 0; p < n; p++ {
			if i == 0 {
				d.pos = append(d.pos, int32(sc.first+p))
			} else {
				d.pos = append(d.pos, int32(p))
			}
		}
	}
	d.n = len(d.pos)
	round := func(v float64) float32 {
		if sc.dt == tensor.BF16 {
			return tensor.BF16ToF32(tensor.F32ToBF16(float32(v)))
		}
		return float32(v)
	}
	fill := func(n int, seed float64) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = round(math.Sin(float64(i)*0.731+seed) * 1.5)
		}
		return s
	}
	d.bcx, d.w, d.dg = fill(3*d.n*sc.c, 0.1), fill(sc.c*sc.l, 1.3), fill(d.n*sc.c, 2.7)
	d.gw, d.gbias = fill(sc.c*sc.l, 3.1), fill(sc.c, 4.2)
	if sc.bias {
		d.bias = fill(sc.c, 5.9)
	}
	return d
}

// runShortConv runs Optional.ShortConv and ShortConvBackward of be on the case and returns
// conv, gated, dbcx, gw and gbias.
func runShortConv(be backend.Backend, sc shortConvCase, d shortConvData) (map[string][]float32, error) {
	o := be.Optional()
	if o.ShortConv == nil || o.ShortConvBackward == nil {
		return nil, fmt.Errorf("%s has no ShortConv", be.Name())
	}
	var ts []backend.T
	defer func() {
		for _, t := range ts {
			_ = be.Free(t)
		}
	}()
	up := func(v []float32, shape ...int) backend.T {
		t, err := backend.FromFloat32(be, v, sc.dt, shape...)
		if err != nil {
			panic(err)
		}
		ts = append(ts, t)
		return t
	}
	alloc := func(shape ...int) backend.T {
		t, err := be.Alloc(sc.dt, shape...)
		if err != nil {
			panic(err)
		}
		ts = append(ts, t)
		return t
	}
	n, c, l := d.n, sc.c, sc.l
	bcx, w, dg, gw, gb := up(d.bcx, n, 3*c), up(d.w, c, 1, l), up(d.dg, n, c), up(d.gw, c, 1, l), up(d.gbias, c)
	var bias backend.T
	if sc.bias {
		bias = up(d.bias, c)
	}
	pos, err := backend.FromInt32(be, d.pos, n)
	if err != nil {
		return nil, err
	}
	ts = append(ts, pos)
	conv, gated, dbcx := alloc(n, c), alloc(n, c), alloc(n, 3*c)
	if err := o.ShortConv(backend.ShortConvArgs{BCX: bcx, W: w, Bias: bias, Positions: pos, Conv: conv, Gated: gated}); err != nil {
		return nil, err
	}
	if err := o.ShortConvBackward(backend.ShortConvBackwardArgs{DGated: dg, BCX: bcx, W: w, Positions: pos, Conv: conv,
		DBCX: dbcx, GW: gw, GBias: gb}); err != nil {
		return nil, err
	}
	out := map[string][]float32{}
	for name, t := range map[string]backend.T{"conv": conv, "gated": gated, "dbcx": dbcx, "gw": gw, "gbias": gb} {
		if out[name], err = backend.ToFloat32(be, t); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// shortConvCases cover documents of 1 token and longer than the filter, a chunk that starts
// mid-document, 2 to 4 taps, channel counts that do not divide the emulated grid, with and
// without a bias, in f32 and bf16.
var shortConvCases = []shortConvCase{
	{lens: []int{1, 5, 9}, c: 7, l: 3, bias: true, dt: tensor.F32},
	{lens: []int{4, 1, 2, 12}, first: 2, c: 5, l: 4, dt: tensor.F32},
	{lens: []int{30}, c: 16, l: 2, bias: true, dt: tensor.F32},
	{lens: []int{3, 17}, first: 1, c: 9, l: 3, bias: true, dt: tensor.BF16},
}

// shortConvTol is the bound on max |err| / rms(ref) per output: the f32 kernels sum in the CPU's
// order but the filter gradient (fp32 against the CPU's float64) and a contracted multiply-add
// differ by rounding, about 1e-7; in bf16 an output may land one bf16 step (2^-8 of its
// magnitude) away, which is up to a few 2^-8 of the rms. A wrong tap, document boundary or
// gradient is of order 1.
func shortConvTol(dt tensor.DType) float64 {
	if dt == tensor.BF16 {
		return 3e-2
	}
	return 1e-5
}

// compareShortConv reports each output's max |err| / rms(want).
func compareShortConv(t *testing.T, sc shortConvCase, got, want map[string][]float32, who string) {
	t.Helper()
	for _, name := range []string{"conv", "gated", "dbcx", "gw", "gbias"} {
		g, w := got[name], want[name]
		if len(g) != len(w) {
			t.Errorf("%v: %s: %s has %d values, the CPU %d", sc, name, who, len(g), len(w))
			continue
		}
		e := maxErrOverRMS(g, w)
		if !(e <= shortConvTol(sc.dt)) {
			t.Errorf("%v: %s: %s max |err|/rms = %.3g against the CPU, above %.1e", sc, name, who, e, shortConvTol(sc.dt))
		}
	}
}

// TestShortConvKernelsOnHost runs kernels/shortconv.cu as host C++ (testdata/hostemu) on the
// cases of shortConvCases and compares every output with the CPU backend's ShortConv and
// ShortConvBackward. It needs a C++17 compiler and skips without one (fails under CI).
func TestShortConvKernelsOnHost(t *testing.T) {
	src, err := kernelSource(shortConvFile)
	if err != nil {
		t.Fatal(err)
	}
	bin := buildHostEmu(t, "short-convolution", "shortconv_check", src, "-O1")
	c := cpu.New(cpu.Options{Workers: 1})
	defer c.Close()
	var in bytes.Buffer
	var wants []map[string][]float32
	for _, sc := range shortConvCases {
		d := sc.data()
		want, err := runShortConv(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		wants = append(wants, want)
		hb := 0
		if sc.bias {
			hb = 1
		}
		fmt.Fprintf(&in, "%d %d %d %d %d\n", d.n, sc.c, sc.l, hb, int(sc.dt))
		for _, v := range [][]float32{d.bcx, d.w, d.bias} {
			writeFloats(&in, v)
		}
		for _, p := range d.pos {
			fmt.Fprintf(&in, "%d ", p)
		}
		for _, v := range [][]float32{d.dg, d.gw, d.gbias} {
			writeFloats(&in, v)
		}
	}
	gots := runHostEmu(t, bin, &in, 5, len(shortConvCases))
	for ci, c := range shortConvCases {
		compareShortConv(t, c, gots[ci], wants[ci], "the host-emulated kernel")
	}
}
