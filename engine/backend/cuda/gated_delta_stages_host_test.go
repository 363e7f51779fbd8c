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

// gatedDeltaStagesCase is one prep and one gated norm: documents of the given lengths, KH key
// heads of KD, VH value heads of VD, L taps; the norm over the N·VH rows of VD; rows tokens (or
// norm rows) per partial of the host emulation's reductions (the device launcher uses
// gatedDeltaStagesRows); the float operands in dt.
type gatedDeltaStagesCase struct {
	lens              []int
	kh, vh, kd, vd, l int
	rows              int
	dt                tensor.DType
}

func (sc gatedDeltaStagesCase) String() string {
	return fmt.Sprintf("docs %v, heads %d/%d of %d/%d, %d taps, %s", sc.lens, sc.kh, sc.vh, sc.kd, sc.vd, sc.l, sc.dt)
}

func (sc gatedDeltaStagesCase) convDim() int { return 2*sc.kh*sc.kd + sc.vh*sc.vd }

// gatedDeltaStagesData are a case's operands by name (exact in their dtypes), with cu.
type gatedDeltaStagesData struct {
	n  int
	cu []int32
	v  map[string][]float32
}

// gatedDeltaStagesF32 are the operands and outputs the contract fixes to F32.
var gatedDeltaStagesF32 = map[string]bool{"q": true, "k": true, "v": true, "beta": true, "g": true, "dq": true,
	"dk": true, "dbeta": true, "dg": true, "rstd": true}

// gatedDeltaStagesInputs are the operands in the order the host emulation reads them, with
// their sizes.
func (sc gatedDeltaStagesCase) inputs(n int) []struct {
	name string
	size int
} {
	d, kd, vd := sc.convDim(), sc.kh*sc.kd, sc.vh*sc.vd
	return []struct {
		name string
		size int
	}{{"mixed", n * d}, {"b", n * sc.vh}, {"a", n * sc.vh}, {"conv", d * sc.l}, {"dtbias", sc.vh}, {"alog", sc.vh},
		{"dq", n * kd}, {"dk", n * kd}, {"dv", n * vd}, {"dbeta", n * sc.vh}, {"dg", n * sc.vh},
		{"gconv", d * sc.l}, {"gdt", sc.vh}, {"galog", sc.vh},
		{"x", n * vd}, {"z", n * vd}, {"w", sc.vd}, {"dout", n * vd}, {"gw", sc.vd}}
}

func (sc gatedDeltaStagesCase) data() gatedDeltaStagesData {
	d := gatedDeltaStagesData{cu: []int32{0}, v: map[string][]float32{}}
	for _, l := range sc.lens {
		d.n += l
		d.cu = append(d.cu, int32(d.n))
	}
	for i, in := range sc.inputs(d.n) {
		round := func(v float64) float32 {
			if sc.dt == tensor.BF16 && !gatedDeltaStagesF32[in.name] {
				return tensor.BF16ToF32(tensor.F32ToBF16(float32(v)))
			}
			return float32(v)
		}
		// Amplitudes that reach both sides of the sigmoids and, for a + dt_bias, past softplus's
		// threshold and past where exp overflows fp32 (a's amplitude 100), and log decays A_log
		// around 0.
		amp := map[string]float64{"mixed": 1.5, "a": 100, "conv": 0.7, "alog": 0.5, "x": 2, "z": 3}[in.name]
		if amp == 0 {
			amp = 1
		}
		s := make([]float32, in.size)
		for j := range s {
			s[j] = round(amp * math.Sin(float64(j)*0.731+1.37*float64(i)+0.1))
		}
		d.v[in.name] = s
	}
	return d
}

var gatedDeltaStagesOutputs = []string{"q", "k", "v", "beta", "g", "dmixed", "db", "da", "gconv", "gdt", "galog",
	"out", "rstd", "dx", "dz", "gw"}

// runGatedDeltaStages runs the four stage ops of be on the case and returns every output of
// gatedDeltaStagesOutputs.
func runGatedDeltaStages(be backend.Backend, sc gatedDeltaStagesCase, d gatedDeltaStagesData) (map[string][]float32, error) {
	o := be.Optional()
	if o.GatedDeltaPrep == nil || o.GatedDeltaPrepBackward == nil || o.GatedRMSNorm == nil || o.GatedRMSNormBackward == nil {
		return nil, fmt.Errorf("%s has no gated delta-net stage ops", be.Name())
	}
	var ts []backend.T
	defer func() {
		for _, t := range ts {
			_ = be.Free(t)
		}
	}()
	dtOf := func(name string) tensor.DType {
		if gatedDeltaStagesF32[name] {
			return tensor.F32
		}
		return sc.dt
	}
	var err error
	keep := func(t backend.T, e error) backend.T {
		if e != nil && err == nil {
			err = e
		}
		ts = append(ts, t)
		return t
	}
	n := d.n
	in := map[string]backend.T{}
	for _, x := range sc.inputs(n) {
		in[x.name] = keep(backend.FromFloat32(be, d.v[x.name], dtOf(x.name), x.size))
	}
	out := map[string]backend.T{}
	for _, x := range []struct {
		name string
		size int
	}{{"q", n * sc.kh * sc.kd}, {"k", n * sc.kh * sc.kd}, {"v", n * sc.vh * sc.vd}, {"beta", n * sc.vh},
		{"g", n * sc.vh}, {"dmixed", n * sc.convDim()}, {"db", n * sc.vh}, {"da", n * sc.vh},
		{"out", n * sc.vh * sc.vd}, {"rstd", n * sc.vh}, {"dx", n * sc.vh * sc.vd}, {"dz", n * sc.vh * sc.vd}} {
		out[x.name] = keep(be.Empty(dtOf(x.name), x.size))
	}
	cu := keep(backend.FromInt32(be, d.cu, len(d.cu)))
	if err != nil {
		return nil, err
	}
	if err := o.GatedDeltaPrep(backend.GatedDeltaPrepArgs{Mixed: in["mixed"], B: in["b"], A: in["a"], Conv: in["conv"],
		DtBias: in["dtbias"], ALog: in["alog"], CuSeqlens: cu, Q: out["q"], K: out["k"], V: out["v"],
		Beta: out["beta"], G: out["g"], KH: sc.kh, VH: sc.vh, KD: sc.kd, VD: sc.vd}); err != nil {
		return nil, err
	}
	if err := o.GatedDeltaPrepBackward(backend.GatedDeltaPrepBackwardArgs{Mixed: in["mixed"], B: in["b"], A: in["a"],
		Conv: in["conv"], DtBias: in["dtbias"], ALog: in["alog"], CuSeqlens: cu, DQ: in["dq"], DK: in["dk"],
		DV: in["dv"], DBeta: in["dbeta"], DG: in["dg"], DMixed: out["dmixed"], DB: out["db"], DA: out["da"],
		GConv: in["gconv"], GDtBias: in["gdt"], GALog: in["galog"], KH: sc.kh, VH: sc.vh, KD: sc.kd, VD: sc.vd}); err != nil {
		return nil, err
	}
	if err := o.GatedRMSNorm(backend.GatedRMSNormArgs{X: in["x"], Z: in["z"], Weight: in["w"], Out: out["out"],
		RStd: out["rstd"], Eps: 1e-6}); err != nil {
		return nil, err
	}
	if err := o.GatedRMSNormBackward(backend.GatedRMSNormBackwardArgs{DOut: in["dout"], X: in["x"], Z: in["z"],
		Weight: in["w"], RStd: out["rstd"], DX: out["dx"], DZ: out["dz"], GWeight: in["gw"]}); err != nil {
		return nil, err
	}
	for _, g := range []string{"gconv", "gdt", "galog", "gw"} {
		out[g] = in[g]
	}
	res := map[string][]float32{}
	for _, name := range gatedDeltaStagesOutputs {
		if res[name], err = backend.ToFloat32(be, out[name]); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// gatedDeltaStagesCases cover single-token documents and ones shorter than the filter, value
// heads sharing key heads, partials of a few rows (the emulation's rows), head dims that are not
// a multiple of the warp, in f32 and bf16.
var gatedDeltaStagesCases = []gatedDeltaStagesCase{
	{lens: []int{1, 9, 2, 14}, kh: 2, vh: 4, kd: 8, vd: 6, l: 4, rows: 5, dt: tensor.F32},
	{lens: []int{5, 1, 3}, kh: 1, vh: 2, kd: 16, vd: 33, l: 3, rows: 4, dt: tensor.F32},
	{lens: []int{11, 2, 1, 7}, kh: 2, vh: 2, kd: 5, vd: 4, l: 4, rows: 3, dt: tensor.BF16},
}

// gatedDeltaStagesTol bounds max |err| / rms(ref) per output: the f32 kernels against the CPU's
// float64 differ by fp32 rounding in sums of a few dozen terms, about 1e-6; in bf16 the outputs
// of the activation dtype round to 2^-8. A wrong tap, boundary, gate or gradient term is of
// order 1.
func gatedDeltaStagesTol(dt tensor.DType) float64 {
	if dt == tensor.BF16 {
		return 3e-2
	}
	return 2e-5
}

func compareGatedDeltaStages(t *testing.T, sc gatedDeltaStagesCase, got, want map[string][]float32, who string) {
	t.Helper()
	compareOutputs(t, sc, gatedDeltaStagesOutputs, got, want, who, func(name string, _ []float32) float64 {
		if gatedDeltaStagesF32[name] {
			return gatedDeltaStagesTol(tensor.F32)
		}
		return gatedDeltaStagesTol(sc.dt)
	})
}

// TestGatedDeltaStagesKernelsOnHost runs kernels/gated_delta_stages.cu as host C++
// (testdata/hostemu) on gatedDeltaStagesCases and compares every output with the CPU backend's
// GatedDeltaPrep, GatedDeltaPrepBackward, GatedRMSNorm and GatedRMSNormBackward. It needs a
// C++17 compiler and skips without one (fails under CI).
func TestGatedDeltaStagesKernelsOnHost(t *testing.T) {
	src, err := kernelSource(gatedDeltaStagesFile)
	if err != nil {
		t.Fatal(err)
	}
	bin := buildHostEmu(t, "gated delta-net stage", "gated_delta_stages_check", src, "-O1")
	c := cpu.New(cpu.Options{Workers: 1})
	defer c.Close()
	var in bytes.Buffer
	var wants []map[string][]float32
	for _, sc := range gatedDeltaStagesCases {
		d := sc.data()
		want, err := runGatedDeltaStages(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		wants = append(wants, want)
		fmt.Fprintf(&in, "%d %d %d %d %d %d %d %d %d %d %d\n", d.n, sc.kh, sc.vh, sc.kd, sc.vd, sc.l, len(sc.lens),
			d.n*sc.vh, sc.vd, sc.rows, int(sc.dt))
		for _, x := range d.cu {
			fmt.Fprintf(&in, "%d ", x)
		}
		for _, x := range sc.inputs(d.n) {
			writeFloats(&in, d.v[x.name])
		}
	}
	gots := runHostEmu(t, bin, &in, len(gatedDeltaStagesOutputs), len(gatedDeltaStagesCases))
	for ci, sc := range gatedDeltaStagesCases {
		compareGatedDeltaStages(t, sc, gots[ci], wants[ci], "the host-emulated kernel")
	}
}
