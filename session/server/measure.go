package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/bench"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/engine/train"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// Measure times one op (engine/bench.MeasureOp) on the engine goroutine, so that it never
// overlaps a step on the same device.
func (h *handler) Measure(ctx context.Context, r *halov1.MeasureRequest) (*halov1.MeasureResponse, error) {
	req, err := measureRequest(r)
	if err != nil {
		return nil, err
	}
	return control[*halov1.MeasureResponse](h, ctx, func(c *command) (any, error) {
		return h.s.eng.cmdMeasure(c.ctx, r.Device, req)
	})
}

// measureRequest checks what can be checked before the engine is involved.
func measureRequest(r *halov1.MeasureRequest) (bench.OpRequest, error) {
	dt := tensor.F32
	if r.Dtype != "" {
		d, err := tensor.ParseDType(r.Dtype)
		if err != nil || (d != tensor.F32 && d != tensor.BF16) {
			return bench.OpRequest{}, connect.Errorf(connect.CodeInvalidArgument, "session: measure: dtype %q: want f32 or bf16", r.Dtype)
		}
		dt = d
	}
	if r.Repeats < 0 {
		return bench.OpRequest{}, connect.Errorf(connect.CodeInvalidArgument, "session: measure: repeats %d: want 0 (the default) or more", r.Repeats)
	}
	return bench.OpRequest{Op: strings.TrimSpace(strings.ToLower(r.Op)), Sizes: r.Sizes, DType: dt, Repeats: int(r.Repeats)}, nil
}

// cmdMeasure runs a measurement on the loaded model's device when device is empty and a
// model is loaded, else on a backend opened for device ("auto" when empty) and kept for the
// next measurement on the same device.
func (e *engine) cmdMeasure(ctx context.Context, device string, req bench.OpRequest) (any, error) {
	if req.Op == opMemory {
		return e.measureMemory(req)
	}
	b, err := e.measureBackend(device)
	if err != nil {
		return nil, err
	}
	res, err := bench.MeasureOp(ctx, b, req)
	switch {
	case errors.Is(err, bench.ErrBadOp):
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: %v", err)
	case errors.Is(err, bench.ErrNoFusedOp):
		return nil, connect.Errorf(connect.CodeFailedPrecondition, "session: measure: %v", err)
	case err != nil:
		return nil, fmt.Errorf("session: measure: %w", err)
	}
	out := &halov1.MeasureResponse{Device: res.Device, Op: res.Op, Sizes: res.Sizes, Dtype: res.DType.String(),
		OpsPerSample: int32(res.OpsPerSample), Flops: res.FLOPs, Bytes: res.Bytes,
		MedianS: res.Median.Seconds(), TflopS: res.TFLOPS(), GbS: res.GBPerS(),
		DeviceMemory: res.DeviceMemory, HostThreads: int32(res.HostThreads)}
	for _, s := range res.Samples {
		out.SampleS = append(out.SampleS, s.Seconds())
	}
	return out, nil
}

// opMemory is the Measure op that reports the loaded model's memory estimate; it times
// nothing, so it lives here rather than in engine/bench.
const opMemory = "memory"

// measureMemory returns the one-device memory estimate of the loaded run (train.EstimateMemory,
// what `launch --dry-run` prints) with its device's measured use.
func (e *engine) measureMemory(req bench.OpRequest) (any, error) {
	if len(req.Sizes) != 0 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: op memory takes no sizes, got %v", req.Sizes)
	}
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	mc, err := train.ModelConfigFor(e.t.Cfg)
	if err != nil {
		return nil, fmt.Errorf("session: measure: memory: %w", err)
	}
	est, err := train.EstimateMemory(e.t.Cfg, mc)
	if err != nil {
		return nil, fmt.Errorf("session: measure: memory: %w", err)
	}
	b := e.t.Backend()
	ms := b.MemStats()
	return &halov1.MeasureResponse{Device: b.Name(), Op: opMemory, DeviceMemory: ms.Total, HostThreads: int32(runtime.GOMAXPROCS(0)),
		MemoryBytes: map[string]int64{
			"params": est.ParamBytes, "grads": est.GradBytes, "optimizer": est.OptimBytes, "activations": est.ActBytes,
			"logits": est.LogitsBytes, "scratch": est.ScratchBytes, "total": est.Total(),
			"allocated": ms.Allocated, "peak": ms.Peak,
		}}, nil
}

// measureBackend picks the backend a measurement runs on.
func (e *engine) measureBackend(device string) (backend.Backend, error) {
	device = strings.TrimSpace(strings.ToLower(device))
	if device == "" && e.t != nil {
		return e.t.Backend(), nil
	}
	if device == "" {
		device = "auto"
	}
	if e.measureDev != nil && e.measureName == device {
		return e.measureDev, nil
	}
	e.closeMeasure()
	b, err := backend.Open(device)
	if err != nil {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: %v", err)
	}
	e.measureDev, e.measureName = b, device
	return b, nil
}

// closeMeasure closes the backend kept for measurements, if any.
func (e *engine) closeMeasure() {
	if e.measureDev == nil {
		return
	}
	if err := e.measureDev.Close(); err != nil {
		e.log.Warn("closing the measurement device", "device", e.measureName, "err", err)
	}
	e.measureDev, e.measureName = nil, ""
}
