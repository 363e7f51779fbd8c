package halo

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/halo-shell/halo-shell/session"
)

// Measurement is one op timed on the session's device (the Measure functions). Times are per
// op: the median over the samples, each sample a batch of ops run back to back and then
// synchronised, so that the clock and the sync are a small part of it.
type Measurement struct {
	Op      string  // gemm, copy, launch, add_rmsnorm, add_then_rmsnorm, attention, info (memory: MeasureMemory)
	Device  string  // the device that ran it: cpu, cuda:0, ...
	Sizes   []int64 // the op's sizes, as asked
	DType   string  // f32 or bf16
	Seconds float64 // median seconds per op
	// Samples are the seconds per op of each sample; OpsPerSample the ops in each.
	Samples      []float64
	OpsPerSample int
	// Fastest is the fastest sample's seconds per op: what the device can do when other work
	// on the machine slows some samples down (the median includes them).
	Fastest float64
	// DeviceFastest is the fastest seconds per op the device itself took, timed between
	// device marks with the op queued behind other work, so the host's cost of issuing it is
	// hidden; 0 where the device has no timer (the CPU, whose ops run as they are issued, so
	// Fastest is already the device's time).
	DeviceFastest float64
	// FLOPs and Bytes are the work of one op: floating-point operations, and the least bytes
	// it reads and writes in device memory (each operand once).
	FLOPs, Bytes float64
	TFLOPS       float64 // FLOPs / Seconds / 1e12
	GBps         float64 // Bytes / Seconds / 1e9
	// Intensity is FLOPs per byte, the x axis of a roofline (0 for ops without arithmetic).
	Intensity    float64
	DeviceMemory int64 // the device's capacity in bytes, 0 when unknown
	HostThreads  int   // the session's CPU worker threads (GOMAXPROCS)
	// Values are what a collective or a numerics experiment found, by name (see the
	// Measure functions that return them).
	Values map[string]float64
}

func (m Measurement) String() string {
	s := fmt.Sprintf("%s %v %s on %s: %s", m.Op, m.Sizes, m.DType, m.Device, FormatSeconds(m.Seconds))
	if m.FLOPs > 0 && m.Op != "launch" {
		s += fmt.Sprintf(", %.4g TFLOP/s", m.TFLOPS)
	}
	if m.Bytes > 0 && m.Op != "launch" {
		s += fmt.Sprintf(", %.4g GB/s", m.GBps)
	}
	return s
}

// FastTFLOPS is FLOPs per Fastest, in TFLOP/s (0 without samples).
func (m Measurement) FastTFLOPS() float64 {
	if m.Fastest <= 0 {
		return 0
	}
	return m.FLOPs / m.Fastest / 1e12
}

// FastGBps is Bytes per Fastest, in GB/s (0 without samples).
func (m Measurement) FastGBps() float64 {
	if m.Fastest <= 0 {
		return 0
	}
	return m.Bytes / m.Fastest / 1e9
}

// DeviceGBps is Bytes per DeviceFastest, in GB/s: the bandwidth inside a stream of work, where
// an op shorter than its launch is not held back by it. Without a device time it is FastGBps.
func (m Measurement) DeviceGBps() float64 {
	if m.DeviceFastest <= 0 {
		return m.FastGBps()
	}
	return m.Bytes / m.DeviceFastest / 1e9
}

// Measure times op on the session's device at the given sizes (see Measurement.Op for the
// ops; the named Measure functions below say what each size is). dtype "" means f32. Measure
// is a control call: it occupies the device, at a step boundary when a run is going.
func Measure(op, dtype string, sizes ...int64) Measurement {
	return measure("halo.Measure", op, dtype, sizes...)
}

func measure(name, op, dtype string, sizes ...int64) Measurement {
	return measurementOf(measureRaw(name, op, dtype, sizes...))
}

func measureRaw(name, op, dtype string, sizes ...int64) *session.MeasureResponse {
	return measureReq(name, &session.MeasureRequest{Op: op, Dtype: dtype, Sizes: sizes})
}

func measureReq(name string, req *session.MeasureRequest) *session.MeasureResponse {
	c, ctx, _ := client(name)
	r, err := c.Measure(ctx, req)
	if err != nil {
		fail(name, err)
	}
	return r
}

func measurementOf(r *session.MeasureResponse) Measurement {
	m := Measurement{Op: r.Op, Device: r.Device, Sizes: r.Sizes, DType: r.Dtype, Seconds: r.MedianS,
		Samples: r.SampleS, OpsPerSample: int(r.OpsPerSample), FLOPs: r.Flops, Bytes: r.Bytes,
		TFLOPS: r.TflopS, GBps: r.GbS, DeviceMemory: r.DeviceMemory, HostThreads: int(r.HostThreads), Values: r.Values}
	if m.Bytes > 0 && m.Op != "launch" && m.Op != "copy" {
		m.Intensity = m.FLOPs / m.Bytes
	}
	for i, s := range m.Samples {
		if i == 0 || s < m.Fastest {
			m.Fastest = s
		}
	}
	m.DeviceFastest = r.Values["device_fastest_s"]
	return m
}

// MeasureGEMM times C[m,n] = A[m,k] @ B[k,n] in dtype (f32 or bf16; "" is f32).
func MeasureGEMM(m, n, k int, dtype string) Measurement {
	return measure("halo.MeasureGEMM", "gemm", dtype, int64(m), int64(n), int64(k))
}

// MeasureCopy times a device-to-device copy of bytes bytes; GBps counts the bytes read and
// the bytes written (2*bytes per copy), as a bandwidth benchmark does.
func MeasureCopy(bytes int64) Measurement {
	return measure("halo.MeasureCopy", "copy", "", bytes)
}

// MeasureLaunch times the smallest op (a scale of one element): what issuing one op costs,
// with no work behind it.
func MeasureLaunch() Measurement { return measure("halo.MeasureLaunch", "launch", "") }

// MeasureAddRMSNorm times the residual add followed by RMSNorm over [n,c] in dtype: fused
// (the backend's AddRMSNorm, one pass) or not (Add, then RMSNorm: the sum is written and read
// back). A backend without the fused op refuses fused.
func MeasureAddRMSNorm(n, c int, dtype string, fused bool) Measurement {
	op := "add_then_rmsnorm"
	if fused {
		op = "add_rmsnorm"
	}
	return measure("halo.MeasureAddRMSNorm", op, dtype, int64(n), int64(c))
}

// MeasureAttention times causal attention forward over one sequence of t tokens with heads
// heads of headDim (as many key/value heads as query heads).
func MeasureAttention(t, heads, headDim int, dtype string) Measurement {
	return measure("halo.MeasureAttention", "attention", dtype, int64(t), int64(heads), int64(headDim))
}

// MemoryEstimate is the loaded run's memory estimate for one device (what `halo-shell launch
// --dry-run` prints), beside what its device holds now. Bytes.
type MemoryEstimate struct {
	Device                                string
	Params, Grads, Optimizer, Activations int64
	Logits, Scratch, Total                int64
	// Allocated and Peak are measured on the device: live now, and the high-water mark since
	// the last step ended (the session starts each step's peak afresh; a step's own peak is
	// in its StepMetrics.Memory).
	Allocated, Peak int64
	DeviceMemory    int64 // the device's capacity, 0 when unknown
	// Layout is the per-device estimate of the parallel layout in force (what `launch
	// --dry-run` prints for it), nil on one device; RankAllocated and RankPeak are each
	// rank's device, measured as Allocated and Peak are.
	Layout                  *LayoutMemory
	RankAllocated, RankPeak []int64
}

// LayoutMemory is the memory estimate of one device of a parallel layout, in bytes.
type LayoutMemory struct {
	Params, Grads, Optimizer, Activations int64
	Comm                                  int64 // collective staging and persistent FSDP buffers
	Total                                 int64
}

func (m MemoryEstimate) String() string {
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	return fmt.Sprintf("estimate on %s: params %s, grads %s, optimizer %s, activations %s, logits %s, scratch %s, total %s; measured: allocated %s, peak %s",
		m.Device, mib(m.Params), mib(m.Grads), mib(m.Optimizer), mib(m.Activations), mib(m.Logits), mib(m.Scratch), mib(m.Total),
		mib(m.Allocated), mib(m.Peak))
}

// MeasureMemory returns the loaded run's memory estimate and its device's measured use now.
// Compare the estimate with a real step's peak: StepMetrics.Memory of the step. It needs a
// loaded model.
func MeasureMemory() MemoryEstimate {
	m := measureRaw("halo.MeasureMemory", "memory", "")
	b := m.MemoryBytes
	out := MemoryEstimate{Device: m.Device, Params: b["params"], Grads: b["grads"], Optimizer: b["optimizer"],
		Activations: b["activations"], Logits: b["logits"], Scratch: b["scratch"], Total: b["total"],
		Allocated: b["allocated"], Peak: b["peak"], DeviceMemory: m.DeviceMemory}
	if _, ok := b["layout_total"]; ok {
		out.Layout = &LayoutMemory{Params: b["layout_params"], Grads: b["layout_grads"], Optimizer: b["layout_optimizer"],
			Activations: b["layout_activations"], Comm: b["layout_comm"], Total: b["layout_total"]}
	}
	for r := 0; ; r++ {
		p, ok := b[fmt.Sprintf("rank%d_peak", r)]
		if !ok {
			break
		}
		out.RankPeak = append(out.RankPeak, p)
		out.RankAllocated = append(out.RankAllocated, b[fmt.Sprintf("rank%d_allocated", r)])
	}
	return out
}

// DeviceInfo describes the device measurements run on.
type DeviceInfo struct {
	Name        string // cpu, cuda:0, ...
	GPU         bool   // a CUDA device
	Memory      int64  // capacity in bytes, 0 when unknown
	HostThreads int    // the session's CPU worker threads
	GPUs        int    // the CUDA devices the session's machine has (0 without a usable driver)
	// Units are the workers ops are spread over: the SMs of a GPU, the CPU backend's worker
	// threads (0 when the backend does not say).
	Units int
	// CacheBytes is the last-level cache: a GPU's L2, the CPU's largest cache level (0 when
	// unknown). An experiment that is to stay in cache sizes its operands from it.
	CacheBytes int64
}

func (d DeviceInfo) String() string {
	s := d.Name
	if d.Memory > 0 {
		s += fmt.Sprintf(", %.1f GiB", float64(d.Memory)/(1<<30))
	}
	return s + fmt.Sprintf(", %d host threads", d.HostThreads)
}

// Device returns the device that measurements run on (nothing is timed).
func Device() DeviceInfo {
	m := measure("halo.Device", "info", "")
	return DeviceInfo{Name: m.Device, GPU: strings.HasPrefix(m.Device, "cuda"), Memory: m.DeviceMemory, HostThreads: m.HostThreads,
		GPUs: int(m.Values["gpus"]), Units: int(m.Values["units"]), CacheBytes: int64(m.Values["cache_bytes"])}
}

// Collective is a collective timed over several devices (MeasureCollective).
type Collective struct {
	Measurement // Op, Device (e.g. "cpu:4 (simulated)", "cuda:0-1"), Seconds per call, Bytes = S
	Ranks       int
	// WireBytes is what each rank sends through its link per call in a bandwidth-optimal
	// (ring) implementation: BusFactor(Op, Ranks) · S.
	WireBytes float64
	// AlgGBps is S per call time; BusGBps WireBytes per call time (the nccl-tests figure),
	// both GB/s over the median time.
	AlgGBps, BusGBps float64
}

func (c Collective) String() string {
	return fmt.Sprintf("%s of %.4g MB over %s: %s, algbw %.4g GB/s, busbw %.4g GB/s", c.Op, c.Bytes/1e6, c.Device,
		FormatSeconds(c.Seconds), c.AlgGBps, c.BusGBps)
}

// BusFactor is the bytes each rank sends per byte of the buffer in a ring: 2(n-1)/n for
// all_reduce (a reduce-scatter, then an all-gather), (n-1)/n for reduce_scatter, all_gather
// and all_to_all.
func BusFactor(op string, ranks int) float64 {
	if ranks <= 1 {
		return 0
	}
	f := float64(ranks-1) / float64(ranks)
	if op == "all_reduce" {
		return 2 * f
	}
	return f
}

// MeasureCollective times op (all_reduce, reduce_scatter, all_gather, all_to_all) over ranks
// devices with a buffer of bytes (S, as nccl-tests counts it: the all-reduce operand, the
// reduce-scatter input and all-gather output, each rank's all-to-all send buffer) in dtype
// ("" is f32): on GPUs through NCCL when the session runs on a GPU and the machine has ranks
// of them, else on ranks simulated CPU devices in the session process.
func MeasureCollective(op string, bytes int64, ranks int, dtype string) Collective {
	return MeasureCollectiveOn("", op, bytes, ranks, dtype)
}

// MeasureCollectiveOn is MeasureCollective on the devices named: "cpu" (simulated devices),
// "cuda" (GPUs 0 .. ranks-1) or "" (as MeasureCollective chooses).
func MeasureCollectiveOn(device, op string, bytes int64, ranks int, dtype string) Collective {
	r := measureReq("halo.MeasureCollective", &session.MeasureRequest{Op: op, Dtype: dtype, Device: device,
		Sizes: []int64{bytes, int64(ranks)}})
	m := measurementOf(r)
	return Collective{Measurement: m, Ranks: int(m.Values["ranks"]), WireBytes: m.Values["wire_bytes"],
		AlgGBps: m.Values["alg_gbps"], BusGBps: m.Values["bus_gbps"]}
}

// Rounding is what an AdamW rounding experiment found (MeasureAdamW).
type Rounding struct {
	Mode   string // adamw, adamw_bf16 or adamw_bf16_nearest
	Device string
	N      int
	Steps  int
	LR, W0 float64
	ULP    float64 // spacing of bf16 numbers just below W0
	// StaleFraction is the fraction of bf16 weights the first step left unchanged.
	StaleFraction float64
	// MeanChange is the mean over weights of w - W0 after Steps steps (bf16 weights read
	// back); ExpectedChange is -Steps·LR, exact arithmetic's answer.
	MeanChange, ExpectedChange float64
	// WeightBytes, GradBytes and StateBytes are measured on the device's allocator: the bf16
	// weights, their bf16 gradients, and what the optimizer allocated.
	WeightBytes, GradBytes, StateBytes int64
	// StepSeconds is the median time of one optimizer step; StepBytes the least bytes it
	// moves; GBps their ratio.
	StepSeconds, StepBytes, GBps float64
	// StepDeviceSeconds is the median time of one step on the device, between device marks
	// (0 where the device has no timer, as on the CPU): the step's kernels without the host's
	// cost of issuing them and waiting for them.
	StepDeviceSeconds float64
}

// DeviceStep is StepDeviceSeconds where the device timed the step, else StepSeconds.
func (r Rounding) DeviceStep() float64 {
	if r.StepDeviceSeconds > 0 {
		return r.StepDeviceSeconds
	}
	return r.StepSeconds
}

// BytesPerParam is the weights, gradients and optimizer state per parameter.
func (r Rounding) BytesPerParam() float64 {
	return float64(r.WeightBytes+r.GradBytes+r.StateBytes) / float64(r.N)
}

func (r Rounding) String() string {
	return fmt.Sprintf("%s on %s: %d weights at %g, lr %g x %d steps: stale after step 1 %.1f%%, mean change %.4g (exact %.4g); %.3g bytes/param, step %s",
		r.Mode, r.Device, r.N, r.W0, r.LR, r.Steps, 100*r.StaleFraction, r.MeanChange, r.ExpectedChange, r.BytesPerParam(), FormatSeconds(r.StepSeconds))
}

// roundingModes are MeasureAdamW's modes, in the order the Measure RPC numbers them.
var roundingModes = []string{"adamw", "adamw_bf16", "adamw_bf16_nearest"}

// MeasureAdamW trains n bf16 weights, all w0, for steps AdamW steps with learning rate lr and
// the gradient 1 everywhere, on the session's device, and reports how much of the update the
// weights kept. With a constant gradient Adam's update is lr per step, so exact arithmetic
// moves every weight by -steps·lr. mode is adamw (an fp32 master copy and fp32 moments, what
// optim adamw_torch keeps for bf16 weights), adamw_bf16 (bf16 weights and moments, stochastic
// rounding) or adamw_bf16_nearest (the same, rounded to nearest, as torch.optim.AdamW does
// with bf16 parameters).
func MeasureAdamW(mode string, n, steps int, lr, w0 float64) Rounding {
	idx := -1
	for i, m := range roundingModes {
		if m == mode {
			idx = i
		}
	}
	if idx < 0 {
		fail("halo.MeasureAdamW", fmt.Errorf("mode %q: want %s", mode, strings.Join(roundingModes, ", ")))
	}
	r := measureReq("halo.MeasureAdamW", &session.MeasureRequest{Op: "adamw_rounding", Sizes: []int64{int64(n), int64(steps)},
		Args: []float64{float64(idx), lr, w0}})
	v := r.Values
	return Rounding{Mode: mode, Device: r.Device, N: n, Steps: steps, LR: lr, W0: v["w0"], ULP: v["ulp"],
		StaleFraction: v["stale_fraction"], MeanChange: v["mean_change"], ExpectedChange: v["expected_change"],
		WeightBytes: int64(v["weight_bytes"]), GradBytes: int64(v["grad_bytes"]), StateBytes: int64(v["state_bytes"]),
		StepSeconds: r.MedianS, StepBytes: r.Bytes, GBps: r.GbS, StepDeviceSeconds: v["step_device_s"]}
}

// RoPEMerge is what a RoPE precision experiment found (MeasureRoPE). A position merges when
// all its angles equal those of the position before: attention cannot tell the two apart.
type RoPEMerge struct {
	Device    string
	T, R      int
	Precision string // f32, bf16 or tf32
	// TableMerged counts the positions whose angle table pos·inv_freq, computed as the Hugging
	// Face rotary embedding does (an outer product through a GEMM on the device, inputs in
	// Precision), merges with the one before; TableFirst is the first (-1: none).
	TableMerged, TableFirst int
	// EngineMerged and EngineFirst are the same for the engine's own RoPE op.
	EngineMerged, EngineFirst int
}

func (m RoPEMerge) String() string {
	return fmt.Sprintf("rope over %d positions, %d dims, %s on %s: angle table merges %d positions (first %d); engine RoPE merges %d (first %d)",
		m.T, m.R, m.Precision, m.Device, m.TableMerged, m.TableFirst, m.EngineMerged, m.EngineFirst)
}

// MeasureRoPE computes RoPE angles for positions 0 .. t-1 of r rotated dims (rope_theta
// 10000) at precision f32, bf16 or tf32 (the tensor cores' rounding of fp32 inputs, applied
// to the GEMM's inputs) on the session's device, and counts the positions that merge.
func MeasureRoPE(t, r int, precision string) RoPEMerge {
	resp := measureReq("halo.MeasureRoPE", &session.MeasureRequest{Op: "rope_angles", Dtype: precision, Sizes: []int64{int64(t), int64(r)}})
	v := resp.Values
	return RoPEMerge{Device: resp.Device, T: t, R: r, Precision: resp.Dtype, TableMerged: int(v["table_merged"]),
		TableFirst: int(v["table_first_merged"]), EngineMerged: int(v["engine_merged"]), EngineFirst: int(v["engine_first_merged"])}
}

// Spec is a GPU's published peak figures, from its datasheet (dense, without sparsity).
type Spec struct {
	Name       string
	BF16TFLOPS float64 // dense BF16 tensor-core peak, TFLOP/s
	TF32TFLOPS float64 // dense TF32 tensor-core peak
	FP32TFLOPS float64 // FP32 on the CUDA cores (no tensor cores)
	HBMTBps    float64 // memory bandwidth, TB/s (1e12 bytes)
	NVLinkGBps float64 // NVLink bandwidth per GPU, both directions together, GB/s
	MemoryGB   float64
	SMs        int
	Source     string
}

// Ridge is the arithmetic intensity (FLOP per byte) above which a BF16 kernel can be compute
// bound: peak FLOP/s over memory bandwidth.
func (s Spec) Ridge() float64 { return s.BF16TFLOPS / s.HBMTBps }

var specs = map[string]Spec{
	"h100": {Name: "H100 SXM", BF16TFLOPS: 989.4, TF32TFLOPS: 494.7, FP32TFLOPS: 66.9, HBMTBps: 3.35, NVLinkGBps: 900, MemoryGB: 80, SMs: 132,
		Source: "NVIDIA H100 Tensor Core GPU datasheet (SXM column; its tensor-core figures are with sparsity, dense is half)"},
	"h200": {Name: "H200 SXM", BF16TFLOPS: 989.4, TF32TFLOPS: 494.7, FP32TFLOPS: 66.9, HBMTBps: 4.8, NVLinkGBps: 900, MemoryGB: 141, SMs: 132,
		Source: "NVIDIA H200 Tensor Core GPU datasheet (SXM column; its tensor-core figures are with sparsity, dense is half)"},
}

// Datasheet returns the published figures of a GPU: "h100" or "h200" (SXM parts).
func Datasheet(name string) Spec {
	s, ok := specs[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		fail("halo.Datasheet", fmt.Errorf("no datasheet for %q (known: h100, h200)", name))
	}
	return s
}

// VerdictUnknownMarker starts the line Unknown prints: a claim this machine could not check.
// The lecture notebooks' test fails on it.
const VerdictUnknownMarker = "verdict: unknown"

// Verdict returns the line that states whether a lecture's claim holds on this machine:
// "verdict: holds here: CLAIM (EVIDENCE)", or "verdict: differs here, because EVIDENCE
// (claim: CLAIM)". evidence should carry the measured numbers.
func Verdict(claim string, holds bool, evidence string) string {
	if holds {
		return "verdict: holds here: " + claim + " (" + evidence + ")"
	}
	return "verdict: differs here, because " + evidence + " (claim: " + claim + ")"
}

// Unknown returns the verdict line of a claim that could not be checked here, and why
// ("verdict: unknown: CLAIM (WHY)").
func Unknown(claim, why string) string {
	return VerdictUnknownMarker + ": " + claim + " (" + why + ")"
}

// FormatSeconds writes a duration in the unit that suits it (ns, µs, ms or s).
func FormatSeconds(s float64) string {
	switch a := math.Abs(s); {
	case a == 0:
		return "0 s"
	case a < 1e-6:
		return fmt.Sprintf("%.3g ns", s*1e9)
	case a < 1e-3:
		return fmt.Sprintf("%.3g µs", s*1e6)
	case a < 1:
		return fmt.Sprintf("%.3g ms", s*1e3)
	}
	return fmt.Sprintf("%.3g s", s)
}

// Fit is a least-squares line through points: y = Slope*x + Intercept.
type Fit struct {
	Slope, Intercept float64
	R2               float64 // coefficient of determination, 1 for a perfect line
}

// LineFit fits y = a*x + b by least squares; with log set it fits log(y) = a*log(x) + b, so
// that Slope is the exponent of a power law (2 for time that grows with the square of x).
// Points with NaN (or, with log, non-positive) values are left out; fewer than two points
// give a NaN fit.
func LineFit(x, y []float64, log bool) Fit {
	var xs, ys []float64
	for i := range min(len(x), len(y)) {
		a, b := x[i], y[i]
		if math.IsNaN(a) || math.IsNaN(b) || (log && (a <= 0 || b <= 0)) {
			continue
		}
		if log {
			a, b = math.Log(a), math.Log(b)
		}
		xs, ys = append(xs, a), append(ys, b)
	}
	n := float64(len(xs))
	if n < 2 {
		return Fit{Slope: math.NaN(), Intercept: math.NaN(), R2: math.NaN()}
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return Fit{Slope: math.NaN(), Intercept: math.NaN(), R2: math.NaN()}
	}
	f := Fit{Slope: (n*sxy - sx*sy) / den}
	f.Intercept = (sy - f.Slope*sx) / n
	var ssRes, ssTot float64
	mean := sy / n
	for i := range xs {
		e := ys[i] - (f.Slope*xs[i] + f.Intercept)
		ssRes += e * e
		ssTot += (ys[i] - mean) * (ys[i] - mean)
	}
	f.R2 = 1
	if ssTot > 0 {
		f.R2 = 1 - ssRes/ssTot
	}
	return f
}

// Median returns the median of xs (NaN for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
