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

// gatedDeltaCase is one gated delta rule: documents of the given lengths, KH key heads of KD,
// VH value heads of VD, states kept every chunk tokens, the float inputs in dt.
type gatedDeltaCase struct {
	lens               []int
	kh, vh, kd, vd, ch int
	dt                 tensor.DType
}

func (gc gatedDeltaCase) String() string {
	return fmt.Sprintf("docs %v, heads %d/%d of %d/%d, chunk %d, %s", gc.lens, gc.kh, gc.vh, gc.kd, gc.vd, gc.ch, gc.dt)
}

// gatedDeltaData are a case's inputs, exact in its dtype: q and k of unit norm per head (as
// the layer normalises them), write strengths in (0.05, 0.95), log decays in (-1.5, 0).
type gatedDeltaData struct {
	n                      int
	cu                     []int32
	q, k, v, beta, g, dout []float32
}

func (gc gatedDeltaCase) data() gatedDeltaData {
	d := gatedDeltaData{cu: []int32{0}}
	for _, l := range gc.lens {
		d.n += l
		d.cu = append(d.cu, int32(d.n))
	}
	round := func(v float64) float32 {
		if gc.dt == tensor.BF16 {
			return tensor.BF16ToF32(tensor.F32ToBF16(float32(v)))
		}
		return float32(v)
	}
	wave := func(n int, seed float64) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = math.Sin(float64(i)*0.917 + seed)
		}
		return s
	}
	unit := func(seed float64) []float32 {
		raw := wave(d.n*gc.kh*gc.kd, seed)
		out := make([]float32, len(raw))
		for r := 0; r < d.n*gc.kh; r++ {
			ss := 0.0
			for _, x := range raw[r*gc.kd : (r+1)*gc.kd] {
				ss += x * x
			}
			for i := range gc.kd {
				out[r*gc.kd+i] = round(raw[r*gc.kd+i] / math.Sqrt(ss+1e-6))
			}
		}
		return out
	}
	d.q, d.k = unit(0.3), unit(1.7)
	for _, x := range wave(d.n*gc.vh*gc.vd, 2.9) {
		d.v = append(d.v, round(x))
	}
	for _, x := range wave(d.n*gc.vh*gc.vd, 4.1) {
		d.dout = append(d.dout, round(x))
	}
	for _, x := range wave(d.n*gc.vh, 5.3) {
		d.beta = append(d.beta, round(0.5+0.45*x))
	}
	for _, x := range wave(d.n*gc.vh, 6.7) {
		d.g = append(d.g, round(-0.75+0.75*x))
	}
	return d
}

// runGatedDelta runs Optional.GatedDelta and GatedDeltaBackward of be on the case and returns
// out, states, dq, dk, dv, dbeta and dg.
func runGatedDelta(be backend.Backend, gc gatedDeltaCase, d gatedDeltaData) (map[string][]float32, error) {
	o := be.Optional()
	if o.GatedDelta == nil || o.GatedDeltaBackward == nil {
		return nil, fmt.Errorf("%s has no GatedDelta", be.Name())
	}
	var ts []backend.T
	defer func() {
		for _, t := range ts {
			_ = be.Free(t)
		}
	}()
	var err error
	up := func(v []float32, shape ...int) backend.T {
		t, e := backend.FromFloat32(be, v, gc.dt, shape...)
		if e != nil && err == nil {
			err = e
		}
		ts = append(ts, t)
		return t
	}
	alloc := func(dt tensor.DType, shape ...int) backend.T {
		t, e := be.Alloc(dt, shape...)
		if e != nil && err == nil {
			err = e
		}
		ts = append(ts, t)
		return t
	}
	n := d.n
	q, k, v := up(d.q, n, gc.kh, gc.kd), up(d.k, n, gc.kh, gc.kd), up(d.v, n, gc.vh, gc.vd)
	beta, g, dout := up(d.beta, n, gc.vh), up(d.g, n, gc.vh), up(d.dout, n, gc.vh, gc.vd)
	out, dv := alloc(gc.dt, n, gc.vh, gc.vd), alloc(gc.dt, n, gc.vh, gc.vd)
	states := alloc(tensor.F32, (n+gc.ch-1)/gc.ch, gc.vh, gc.kd, gc.vd)
	dq, dk := alloc(tensor.F32, n, gc.kh, gc.kd), alloc(tensor.F32, n, gc.kh, gc.kd)
	db, dg := alloc(tensor.F32, n, gc.vh), alloc(tensor.F32, n, gc.vh)
	cu, e := backend.FromInt32(be, d.cu, len(d.cu))
	if e != nil {
		return nil, e
	}
	ts = append(ts, cu)
	if err != nil {
		return nil, err
	}
	if err := o.GatedDelta(backend.GatedDeltaArgs{Q: q, K: k, V: v, Beta: beta, G: g, CuSeqlens: cu, Out: out,
		States: states, Chunk: gc.ch, KH: gc.kh, VH: gc.vh, KD: gc.kd, VD: gc.vd}); err != nil {
		return nil, err
	}
	if err := o.GatedDeltaBackward(backend.GatedDeltaBackwardArgs{Q: q, K: k, V: v, Beta: beta, G: g, CuSeqlens: cu,
		States: states, DOut: dout, DQ: dq, DK: dk, DV: dv, DBeta: db, DG: dg,
		Chunk: gc.ch, KH: gc.kh, VH: gc.vh, KD: gc.kd, VD: gc.vd}); err != nil {
		return nil, err
	}
	res := map[string][]float32{}
	for name, t := range map[string]backend.T{"out": out, "states": states, "dq": dq, "dk": dk, "dv": dv, "dbeta": db, "dg": dg} {
		if res[name], err = backend.ToFloat32(be, t); err != nil {
			return nil, err
		}
	}
	return res, nil
}

var gatedDeltaOutputs = []string{"out", "states", "dq", "dk", "dv", "dbeta", "dg"}

// gatedDeltaCases cover a single-token document, documents that start inside a stretch and
// span several, value heads sharing key heads, head dims that are not a multiple of the warp,
// in f32 and bf16.
var gatedDeltaCases = []gatedDeltaCase{
	{lens: []int{1, 9, 14}, kh: 2, vh: 4, kd: 8, vd: 6, ch: 4, dt: tensor.F32},
	{lens: []int{5, 3}, kh: 1, vh: 2, kd: 16, vd: 33, ch: 64, dt: tensor.F32},
	{lens: []int{11, 2, 7}, kh: 2, vh: 2, kd: 5, vd: 4, ch: 3, dt: tensor.BF16},
}

// gatedDeltaTol bounds max |err| / rms(ref) per output: the f32 kernels against the CPU's
// float64 recurrence differ by fp32 rounding over a few dozen steps, about 1e-6; in bf16 the
// outputs (out, dv) round to 2^-8. A wrong gate, boundary or gradient term is of order 1.
func gatedDeltaTol(dt tensor.DType) float64 {
	if dt == tensor.BF16 {
		return 3e-2
	}
	return 1e-4
}

func compareGatedDelta(t *testing.T, gc gatedDeltaCase, got, want map[string][]float32, who string) {
	t.Helper()
	for _, name := range gatedDeltaOutputs {
		g, w := got[name], want[name]
		if len(g) != len(w) {
			t.Errorf("%v: %s: %s has %d values, the CPU %d", gc, name, who, len(g), len(w))
			continue
		}
		e := maxErrOverRMS(g, w)
		if !(e <= gatedDeltaTol(gc.dt)) {
			t.Errorf("%v: %s: %s max |err|/rms = %.3g against the CPU, above %.1e", gc, name, who, e, gatedDeltaTol(gc.dt))
		}
	}
}

// TestGatedDeltaKernelsOnHost runs kernels/gated_delta.cu as host C++ (testdata/hostemu) on
// gatedDeltaCases and compares every output with the CPU backend's GatedDelta and
// GatedDeltaBackward. It needs a C++17 compiler and skips without one (fails under CI).
func TestGatedDeltaKernelsOnHost(t *testing.T) {
	src, err := kernelSource(gatedDeltaFile)
	if err != nil {
		t.Fatal(err)
	}
	bin := buildHostEmu(t, "gated delta", "gated_delta_check", src, "-O1")
	c := cpu.New(cpu.Options{Workers: 1})
	defer c.Close()
	var in bytes.Buffer
	var wants []map[string][]float32
	for _, gc := range gatedDeltaCases {
		d := gc.data()
		want, err := runGatedDelta(c, gc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", gc, err)
		}
		wants = append(wants, want)
		fmt.Fprintf(&in, "%d %d %d %d %d %d %d %d\n", d.n, gc.kh, gc.vh, gc.kd, gc.vd, gc.ch, len(gc.lens), int(gc.dt))
		for _, x := range d.cu {
			fmt.Fprintf(&in, "%d ", x)
		}
		for _, v := range [][]float32{d.q, d.k, d.v, d.beta, d.g, d.dout} {
			writeFloats(&in, v)
		}
	}
	gots := runHostEmu(t, bin, &in, len(gatedDeltaOutputs), len(gatedDeltaCases))
	for ci, c := range gatedDeltaCases {
		compareGatedDelta(t, c, gots[ci], wants[ci], "the host-emulated kernel")
	}
}
