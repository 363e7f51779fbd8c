package server

import (
	"testing"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/session"
)

func TestMeasureRunsOnTheSessionDevice(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "measurer")
	ctx := ctxT(t)
	// No model: the measurement opens the auto device, the CPU here.
	r, err := c.Measure(ctx, &session.MeasureRequest{Op: "gemm", Sizes: []int64{64, 32, 16}, Repeats: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.Device != "cpu" || r.Op != "gemm" || r.Dtype != "f32" || len(r.SampleS) == 0 || r.MedianS <= 0 {
		t.Fatalf("gemm: %v", r)
	}
	if r.Flops != 2*64*32*16 || r.TflopS <= 0 || r.HostThreads < 1 {
		t.Errorf("gemm figures: flops %v tflop/s %v threads %d", r.Flops, r.TflopS, r.HostThreads)
	}
	if want := r.Flops / r.MedianS / 1e12; r.TflopS != want {
		t.Errorf("tflop/s %v, want flops/median %v", r.TflopS, want)
	}
	// A model loaded: its device is used, and stepping still works after.
	if _, err := c.Load(ctx, tinyConfig, "sft"); err != nil {
		t.Fatal(err)
	}
	r, err = c.Measure(ctx, &session.MeasureRequest{Op: "add_rmsnorm", Sizes: []int64{8, 64}, Dtype: "bf16", Repeats: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Device != "cpu" || r.Dtype != "bf16" || r.Bytes <= 0 || r.GbS <= 0 {
		t.Errorf("add_rmsnorm: %v", r)
	}
	if _, err := c.Step(ctx, 1); err != nil {
		t.Fatalf("step after a measurement: %v", err)
	}
}

func TestMeasureRefusals(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "measurer")
	ctx := ctxT(t)
	for _, tc := range []struct {
		name  string
		req   *session.MeasureRequest
		code  connect.Code
		parts []string
	}{
		{"unknown op", &session.MeasureRequest{Op: "conv"}, connect.CodeInvalidArgument, []string{`"conv"`, "gemm"}},
		{"wrong sizes", &session.MeasureRequest{Op: "gemm", Sizes: []int64{4}}, connect.CodeInvalidArgument, []string{"M N K"}},
		{"dtype", &session.MeasureRequest{Op: "copy", Sizes: []int64{64}, Dtype: "i32"}, connect.CodeInvalidArgument, []string{"f32 or bf16"}},
		{"device", &session.MeasureRequest{Op: "info", Device: "tpu"}, connect.CodeInvalidArgument, []string{"tpu"}},
		{"collective sizes", &session.MeasureRequest{Op: "all_reduce", Sizes: []int64{64}}, connect.CodeInvalidArgument, []string{"bytes ranks"}},
		{"collective ranks", &session.MeasureRequest{Op: "all_gather", Sizes: []int64{64, 1}}, connect.CodeInvalidArgument, []string{"ranks 1", "2 .. 64"}},
		{"rounding args", &session.MeasureRequest{Op: "adamw_rounding", Sizes: []int64{64, 2}}, connect.CodeInvalidArgument, []string{"mode lr w0"}},
		{"rounding mode", &session.MeasureRequest{Op: "adamw_rounding", Sizes: []int64{64, 2}, Args: []float64{1.5, 1e-3, 1}}, connect.CodeInvalidArgument, []string{"mode 1.5"}},
		{"rope precision", &session.MeasureRequest{Op: "rope_angles", Sizes: []int64{64, 16}, Dtype: "f16"}, connect.CodeInvalidArgument, []string{"f32, bf16 or tf32"}},
	} {
		_, err := c.Measure(ctx, tc.req)
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want code %v", tc.name, err, tc.code)
			continue
		}
		mustContain(t, err, tc.parts...)
	}
	// Another client controls the session: an observer may not occupy the device.
	other := dial(t, s.Socket(), "observer")
	if _, err := other.Measure(ctx, &session.MeasureRequest{Op: "launch"}); !session.IsNotController(err) {
		t.Errorf("measure by a non-controller: %v", err)
	}
}

func TestMeasureMemoryEstimatesTheLoadedRun(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "measurer")
	ctx := ctxT(t)
	_, err := c.Measure(ctx, &session.MeasureRequest{Op: "memory"})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("memory before a load: %v", err)
	}
	mustContain(t, err, "no model is loaded")
	if _, err := c.Load(ctx, tinyConfig, "sft"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r, err := c.Measure(ctx, &session.MeasureRequest{Op: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	b := r.MemoryBytes
	if b["params"] <= 0 || b["grads"] <= 0 || b["activations"] <= 0 || b["peak"] <= 0 || b["allocated"] <= 0 {
		t.Fatalf("memory: %v", b)
	}
	if sum := b["params"] + b["grads"] + b["optimizer"] + b["activations"] + b["logits"] + b["scratch"]; b["total"] != sum {
		t.Errorf("total %d, want the sum of the parts %d", b["total"], sum)
	}
	if _, err := c.Measure(ctx, &session.MeasureRequest{Op: "memory", Sizes: []int64{1}}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("memory with sizes: %v", err)
	}
}
