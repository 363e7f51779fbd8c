package halo

import (
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/session"
)

func TestLineFit(t *testing.T) {
	for _, tc := range []struct {
		name          string
		x, y          []float64
		log           bool
		slope, interc float64
	}{
		{"line", []float64{1, 2, 3}, []float64{3, 5, 7}, false, 2, 1},
		{"square law", []float64{1, 2, 4, 8}, []float64{3, 12, 48, 192}, true, 2, math.Log(3)},
		{"skips NaN and non-positive on log", []float64{1, 2, -1, 4}, []float64{1, 2, 5, math.NaN()}, true, 1, 0},
	} {
		f := LineFit(tc.x, tc.y, tc.log)
		if math.Abs(f.Slope-tc.slope) > 1e-9 || math.Abs(f.Intercept-tc.interc) > 1e-9 || math.Abs(f.R2-1) > 1e-9 {
			t.Errorf("%s: %+v, want slope %v intercept %v r2 1", tc.name, f, tc.slope, tc.interc)
		}
	}
	if f := LineFit([]float64{1}, []float64{1}, false); !math.IsNaN(f.Slope) {
		t.Errorf("one point fitted: %+v", f)
	}
	if f := LineFit([]float64{1, 2, 3, 4}, []float64{1, 3, 2, 4}, false); f.R2 <= 0 || f.R2 >= 1 {
		t.Errorf("noisy points: r2 %v, want in (0, 1)", f.R2)
	}
}

func TestVerdictLines(t *testing.T) {
	if got := Verdict("GEMM is compute bound", true, "12 GFLOP/s"); got != "verdict: holds here: GEMM is compute bound (12 GFLOP/s)" {
		t.Errorf("holds: %q", got)
	}
	if got := Verdict("fusion is faster", false, "the fused op took 1.2x longer"); got != "verdict: differs here, because the fused op took 1.2x longer (claim: fusion is faster)" {
		t.Errorf("differs: %q", got)
	}
	if got := Unknown("x", "no samples"); !strings.HasPrefix(got, VerdictUnknownMarker) {
		t.Errorf("unknown: %q", got)
	}
}

func TestMeasurementOf(t *testing.T) {
	m := measurementOf(&session.MeasureResponse{Device: "cpu", Op: "gemm", Sizes: []int64{2, 2, 2}, Dtype: "f32",
		MedianS: 2e-6, SampleS: []float64{3e-6, 1e-6, 2e-6}, Flops: 16, Bytes: 48, TflopS: 8e-6, GbS: 0.024})
	if m.Intensity != 16.0/48 || m.Seconds != 2e-6 || m.Fastest != 1e-6 || m.FastTFLOPS() != 16e-12/1e-6 || m.FastGBps() != 48e-9/1e-6 {
		t.Errorf("gemm: %+v", m)
	}
	if s := m.String(); !strings.Contains(s, "gemm [2 2 2] f32 on cpu: 2 µs") || !strings.Contains(s, "TFLOP/s") {
		t.Errorf("String: %q", s)
	}
	if c := measurementOf(&session.MeasureResponse{Op: "copy", Bytes: 8}); c.Intensity != 0 {
		t.Errorf("a copy has no arithmetic intensity: %v", c.Intensity)
	}
	if m.DeviceFastest != 0 || m.DeviceGBps() != m.FastGBps() {
		t.Errorf("without a device time DeviceGBps is FastGBps: %v, %v", m.DeviceGBps(), m.FastGBps())
	}
	c := measurementOf(&session.MeasureResponse{Op: "copy", Bytes: 4e6, SampleS: []float64{8e-6}, Values: map[string]float64{"device_fastest_s": 2e-6}})
	if c.DeviceFastest != 2e-6 || c.DeviceGBps() != 2000 || c.FastGBps() != 500 {
		t.Errorf("copy with a device time: DeviceFastest %v, DeviceGBps %v, FastGBps %v", c.DeviceFastest, c.DeviceGBps(), c.FastGBps())
	}
}

func TestFormatSeconds(t *testing.T) {
	for in, want := range map[float64]string{0: "0 s", 5e-9: "5 ns", 2.5e-6: "2.5 µs", 0.0123: "12.3 ms", 3: "3 s"} {
		if got := FormatSeconds(in); got != want {
			t.Errorf("FormatSeconds(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestDatasheet(t *testing.T) {
	h := Datasheet("H200")
	if h.HBMTBps != 4.8 || h.BF16TFLOPS != 989.4 || h.Source == "" {
		t.Errorf("h200: %+v", h)
	}
	if r := h.Ridge(); math.Abs(r-989.4/4.8) > 1e-9 {
		t.Errorf("ridge %v", r)
	}
	defer func() {
		if e, ok := recover().(*Error); !ok || !strings.Contains(e.Error(), "h100, h200") {
			t.Errorf("unknown GPU: %v", e)
		}
	}()
	Datasheet("a100")
}
