package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/bench"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/engine/train"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// Measure times one op (engine/bench.MeasureOp) on the engine goroutine, so that it never
// overlaps a step on the same device.
func (h *handler) Measure(ctx context.Context, r *halov1.MeasureRequest) (*halov1.MeasureResponse, error) {
	op := strings.TrimSpace(strings.ToLower(r.Op))
	if op == bench.OpRoPEAngles {
		// Its dtype may be tf32, which no tensor has.
		return control[*halov1.MeasureResponse](h, ctx, func(c *command) (any, error) {
			return h.s.eng.cmdRoPE(c.ctx, r)
		})
	}
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
	return bench.OpRequest{Op: strings.TrimSpace(strings.ToLower(r.Op)), Sizes: r.Sizes, DType: dt, Repeats: int(r.Repeats), Args: r.Args}, nil
}

// cmdMeasure runs a measurement on the loaded model's device when device is empty and a
// model is loaded, else on a backend opened for device ("auto" when empty) and kept for the
// next measurement on the same device.
func (e *engine) cmdMeasure(ctx context.Context, device string, req bench.OpRequest) (any, error) {
	switch {
	case req.Op == opMemory:
		return e.measureMemory(req)
	case bench.IsCollective(req.Op):
		return e.measureCollective(ctx, device, req)
	case req.Op == bench.OpAdamWRounding:
		return e.measureRounding(ctx, device, req)
	}
	b, err := e.measureBackend(device)
	if err != nil {
		return nil, err
	}
	res, err := bench.MeasureOp(ctx, b, req)
	if err != nil {
		return nil, measureError(err)
	}
	out := &halov1.MeasureResponse{Device: res.Device, Op: res.Op, Sizes: res.Sizes, Dtype: res.DType.String(),
		OpsPerSample: int32(res.OpsPerSample), Flops: res.FLOPs, Bytes: res.Bytes,
		MedianS: res.Median.Seconds(), TflopS: res.TFLOPS(), GbS: res.GBPerS(),
		DeviceMemory: res.DeviceMemory, HostThreads: int32(res.HostThreads)}
	for _, s := range res.Samples {
		out.SampleS = append(out.SampleS, s.Seconds())
	}
	out.Values = map[string]float64{}
	if res.DeviceFastest > 0 {
		out.Values["device_fastest_s"] = res.DeviceFastest.Seconds()
	}
	if req.Op == bench.OpInfo {
		out.Values["gpus"] = float64(cuda.DeviceCount())
		out.Values["units"] = float64(res.Props.Units)
		out.Values["cache_bytes"] = float64(res.Props.CacheBytes)
	}
	return out, nil
}

// measureError gives a measurement's error its RPC code.
func measureError(err error) error {
	switch {
	case errors.Is(err, bench.ErrBadOp):
		return connect.Errorf(connect.CodeInvalidArgument, "session: measure: %v", err)
	case errors.Is(err, bench.ErrNoFusedOp):
		return connect.Errorf(connect.CodeFailedPrecondition, "session: measure: %v", err)
	}
	return fmt.Errorf("session: measure: %w", err)
}

// measureCollective times a collective over sizes [bytes ranks] devices: device cpu
// (simulated devices), cuda (GPUs through NCCL), or "" for GPUs when the session's device is
// one and there are enough of them, else simulated devices.
func (e *engine) measureCollective(ctx context.Context, device string, req bench.OpRequest) (any, error) {
	if len(req.Sizes) != 2 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: op %s takes bytes ranks, got %d sizes %v", req.Op, len(req.Sizes), req.Sizes)
	}
	ranks := req.Sizes[1]
	if ranks < 2 || ranks > 64 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: op %s: ranks %d: want 2 .. 64 devices", req.Op, ranks)
	}
	kind := strings.TrimSpace(strings.ToLower(device))
	if kind == "" {
		kind = "cpu"
		if e.onGPU() && cuda.DeviceCount() >= int(ranks) {
			kind = "cuda"
		}
	}
	res, err := bench.MeasureCollective(ctx, bench.CollectiveRequest{Op: req.Op, Bytes: req.Sizes[0], Ranks: int(ranks),
		Device: kind, DType: req.DType, Repeats: req.Repeats})
	if err != nil {
		return nil, measureError(err)
	}
	out := &halov1.MeasureResponse{Device: res.Devices, Op: res.Op, Sizes: []int64{res.Bytes, int64(res.Ranks)},
		Dtype: res.DType.String(), OpsPerSample: int32(res.OpsPerSample), Bytes: float64(res.Bytes),
		MedianS: res.Median.Seconds(), GbS: res.AlgGBps(), HostThreads: int32(runtime.GOMAXPROCS(0)),
		Values: map[string]float64{"wire_bytes": res.WireBytes, "bus_gbps": res.BusGBps(), "alg_gbps": res.AlgGBps(),
			"bus_factor": bench.BusFactor(res.Op, res.Ranks), "ranks": float64(res.Ranks)}}
	for _, s := range res.Samples {
		out.SampleS = append(out.SampleS, s.Seconds())
	}
	return out, nil
}

// onGPU reports whether measurements without a device run on a GPU.
func (e *engine) onGPU() bool {
	if e.t != nil {
		return strings.HasPrefix(e.t.Backend().Name(), "cuda")
	}
	return e.measureDev != nil && strings.HasPrefix(e.measureDev.Name(), "cuda")
}

// measureRounding runs the AdamW rounding experiment: sizes [N steps], args [mode lr w0].
func (e *engine) measureRounding(ctx context.Context, device string, req bench.OpRequest) (any, error) {
	if len(req.Sizes) != 2 || len(req.Args) != 3 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: op %s takes sizes N steps and args mode lr w0, got sizes %v and args %v", req.Op, req.Sizes, req.Args)
	}
	mode := req.Args[0]
	if mode != float64(int(mode)) {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: op %s: mode %v: want 0 (adamw), 1 (adamw_bf16) or 2 (adamw_bf16_nearest)", req.Op, mode)
	}
	b, err := e.measureBackend(device)
	if err != nil {
		return nil, err
	}
	res, err := bench.MeasureRounding(ctx, b, bench.RoundingRequest{Mode: bench.RoundingMode(int(mode)), N: int(min(req.Sizes[0], 1<<31)),
		Steps: int(min(req.Sizes[1], 1<<31)), LR: req.Args[1], W0: req.Args[2]})
	if err != nil {
		return nil, measureError(err)
	}
	out := &halov1.MeasureResponse{Device: res.Device, Op: req.Op, Sizes: req.Sizes, Dtype: "bf16", OpsPerSample: 1,
		Bytes: res.StepBytes, MedianS: res.StepSeconds, DeviceMemory: b.MemStats().Total, HostThreads: int32(runtime.GOMAXPROCS(0)),
		Values: map[string]float64{"ulp": res.ULP, "stale_fraction": res.StaleFraction, "mean_change": res.MeanChange,
			"expected_change": res.ExpectedChange, "weight_bytes": float64(res.WeightBytes), "grad_bytes": float64(res.GradBytes),
			"state_bytes": float64(res.StateBytes), "w0": res.W0, "step_device_s": res.StepDeviceSeconds}}
	if res.StepSeconds > 0 {
		out.GbS = res.StepBytes / res.StepSeconds / 1e9
	}
	return out, nil
}

// cmdRoPE runs the RoPE precision experiment: sizes [T R], dtype f32, bf16 or tf32, args
// [theta] optional.
func (e *engine) cmdRoPE(ctx context.Context, r *halov1.MeasureRequest) (any, error) {
	if len(r.Sizes) != 2 || len(r.Args) > 1 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: measure: op rope_angles takes sizes T R and at most one arg (rope_theta), got sizes %v and args %v", r.Sizes, r.Args)
	}
	var theta float64
	if len(r.Args) == 1 {
		theta = r.Args[0]
	}
	b, err := e.measureBackend(r.Device)
	if err != nil {
		return nil, err
	}
	res, err := bench.MeasureRoPE(ctx, b, bench.RoPERequest{T: int(min(r.Sizes[0], 1<<31)), R: int(min(r.Sizes[1], 1<<31)), Theta: theta,
		Precision: bench.RoPEPrecision(strings.TrimSpace(strings.ToLower(r.Dtype)))})
	if err != nil {
		return nil, measureError(err)
	}
	return &halov1.MeasureResponse{Device: res.Device, Op: bench.OpRoPEAngles, Sizes: r.Sizes, Dtype: string(res.Precision),
		DeviceMemory: b.MemStats().Total, HostThreads: int32(runtime.GOMAXPROCS(0)),
		Values: map[string]float64{"table_merged": float64(res.TableMerged), "table_first_merged": float64(res.TableFirstMerged),
			"engine_merged": float64(res.EngineMerged), "engine_first_merged": float64(res.EngineFirstMerged)}}, nil
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
	out := &halov1.MeasureResponse{Device: b.Name(), Op: opMemory, DeviceMemory: ms.Total, HostThreads: int32(runtime.GOMAXPROCS(0)),
		MemoryBytes: map[string]int64{
			"params": est.ParamBytes, "grads": est.GradBytes, "optimizer": est.OptimBytes, "activations": est.ActBytes,
			"logits": est.LogitsBytes, "scratch": est.ScratchBytes, "total": est.Total(),
			"allocated": ms.Allocated, "peak": ms.Peak,
		}}
	// On a parallel layout: the per-device estimate of the layout in force (what --dry-run
	// prints for it) and each rank's device.
	if p := e.t.Plan(); p != nil {
		le := mesh.Estimate(p.Mesh.Layout, e.t.Arch().Shape, e.t.Cfg.Workload())
		for k, v := range map[string]int64{"layout_params": le.Params, "layout_grads": le.Grads, "layout_optimizer": le.Optimizer,
			"layout_activations": le.Activations, "layout_comm": le.Comm, "layout_total": le.Total()} {
			out.MemoryBytes[k] = v
		}
		for r, d := range e.t.RankDevices() {
			rs := d.MemStats()
			out.MemoryBytes[fmt.Sprintf("rank%d_allocated", r)] = rs.Allocated
			out.MemoryBytes[fmt.Sprintf("rank%d_peak", r)] = rs.Peak
		}
	}
	return out, nil
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
