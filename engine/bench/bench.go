// Package bench measures training throughput, memory and model FLOP utilisation of the real
// trainer (engine/train, the code `halo-shell launch` runs) on one device or, with
// Options.Devices, on several devices in a parallel layout (dp, fsdp, tp, cp, ep, etp; the
// trainer's own plan, with NCCL between GPUs): it loads a Hugging Face checkpoint, reads pre-tokenized rows ({"input_ids": [...]} JSONL, in file order, one
// row per sequence, no packing), runs a number of optimizer steps and reports per-step loss
// and time, the median tokens/s after warmup, peak device memory (per device on a layout),
// MFU and, from one extra profiled step, where the time goes by op class and collective kind
// (on a mixture-of-experts layout, the share of the step in the dispatch and combine
// all-to-alls).
//
// It is meant to run beside a reference implementation on the same weights and the same
// rows (scripts/gpu/bench.sh runs stock PyTorch + transformers first), so that speed and
// memory are compared as ratios measured in one run on one GPU and the loss curves can be
// laid side by side. Step i trains rows i*batch .. i*batch+batch-1, as a plain PyTorch loop
// over the same file does.
//
// MeasureOp (ops.go) times single backend ops instead (GEMM, copy, an op's issue cost, the
// fused residual add and RMSNorm against its two-op fallback, attention) with the work each
// does, for the session's Measure RPC and the lectures built on it. MeasureCollective
// (collective.go) times a collective over several simulated CPU devices or GPUs with the bytes
// a ring sends per rank; MeasureRounding and MeasureRoPE (numerics.go) are experiments whose
// findings are values: how much of a small AdamW update bf16 weights keep under each rounding,
// and which RoPE positions merge at reduced precision.
//
// It is not a training driver (no checkpoints, no schedules beyond a constant learning rate,
// no evaluation) and it does not compare anything itself: it reports figures.
package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/train"
)

// H200PeakTFLOPS is the dense bf16 peak of an H100/H200 SXM (TFLOP/s) that MFU is quoted
// against.
const H200PeakTFLOPS = 989.0

// FLOPsFormula says how FLOPsPerToken counts; it is written into every report.
const FLOPsFormula = "flops_per_token = 6*N + 6*L*T*NH*HD: N the parameters a token uses (a tied embedding counted once, " +
	"so the LM head matmul is counted and the embedding lookup is not; for a mixture of experts the active parameters: " +
	"attention, norms, embeddings, routers and the top-k routed experts of each MoE layer, not the experts a token skips), L layers, T tokens per sequence, " +
	"NH*HD the query width; 6*L*T*NH*HD is causal attention (QK^T and AV, forward and backward, half " +
	"of the full T x T); mfu = flops_per_token * tokens_per_s / (devices * peak_tflops * 1e12), tokens_per_s over all devices, devices 1 on one device"

// Options configure a benchmark. Zero values take the defaults in the comments.
type Options struct {
	// Model is a Hugging Face checkpoint directory (config.json + safetensors). Required.
	Model string
	// Data is a JSONL file of {"input_ids": [...]} rows, each at most SeqLen ids. Required;
	// it must hold at least Steps*BatchSize rows (no row is trained twice in the timed steps).
	Data string
	// Device is cpu, cuda, cuda:N or auto. Default auto. With Devices it must be empty, auto
	// or Devices' kind.
	Device string
	// Devices, when set, is a device list (cpu:2 simulated devices, cuda:0-1, cuda:0,2) the
	// run is laid out over with the degrees below, as launch's devices key does; the model's
	// host view stays in host memory for GPUs. One device and no degrees is the one-device run.
	Devices string
	// TP, CP, EP and ETP are the tensor, context, expert and expert-tensor parallel degrees
	// (0 or 1: none); FSDP shards over the data ranks. The data-parallel degree is what the
	// devices leave: devices / (TP*CP).
	TP, CP, EP, ETP int
	FSDP            bool
	// GradAccum is the number of micro-batches each data rank runs per step. Default 1.
	// BatchSize stays the rows of the whole step: each micro-batch holds
	// BatchSize / (DP*GradAccum) rows, which must divide evenly.
	GradAccum int
	// Steps is the number of timed optimizer steps. Default 20.
	Steps int
	// Warmup is the number of leading steps left out of the medians. Default 3, negative for
	// none; capped at Steps-1.
	Warmup int
	// BatchSize is the number of rows per optimizer step, over every data rank and
	// micro-batch (on one device with GradAccum 1, one micro-batch). Default 4.
	BatchSize int
	// SeqLen is the longest row in tokens (max_length). Default 4096.
	SeqLen int
	// Optim is adamw_bf16_nearest (bf16 weights and moments rounded to nearest, the rule of
	// torch.optim.AdamW on bf16 parameters; default), adamw_bf16 (the same with stochastic
	// rounding) or adamw_torch (fp32 master weights and moments).
	Optim string
	// FP32 trains fp32 weights instead of bf16 (with adamw_torch only).
	FP32 bool
	// LR is the constant learning rate. Default 1e-4 (at 3e-4 the Llama-3.2-1B shape from
	// random init spikes within 20 steps, with PyTorch as with halo-shell).
	LR float64
	// Beta1, Beta2 and Eps are AdamW's; defaults 0.9, 0.95 and 1e-8. WeightDecay defaults to 0.
	Beta1, Beta2, Eps, WeightDecay float64
	// MaxGradNorm clips the global gradient norm; nil means 1.0, 0 disables clipping.
	MaxGradNorm *float64
	// Seed fixes stochastic rounding. Default 42.
	Seed int64
	// NoProfile skips the extra profiled step (and the profile wrapper around the device).
	NoProfile bool
	// Trace, when set, writes the profiled step's ops as a Chrome/Perfetto trace to this file.
	Trace string
	// PeakTFLOPS is the device's dense bf16 peak for MFU. Default H200PeakTFLOPS.
	PeakTFLOPS float64
	// Progress, when set, is called after every step (the profiled one too).
	Progress func(StepResult)

	// LoRARank, when positive, trains LoRA adapters of that rank over a frozen base instead of
	// the whole model (use_peft), with LoRAAlpha (default 2x the rank), no dropout, on
	// LoRATargets (default all-linear). LoadIn4bit stores the base's linears in NF4 with double
	// quantisation (QLoRA; needs LoRARank).
	LoRARank    int
	LoRAAlpha   float64
	LoRATargets []string
	LoadIn4bit  bool
	// GradientCheckpointing recomputes each layer's activations in backward.
	GradientCheckpointing bool
	// MaxDeviceMemoryGiB caps the device's allocator (max_device_memory_gib; 0: no cap).
	MaxDeviceMemoryGiB float64
}

func (o *Options) defaults() {
	if o.Device == "" {
		o.Device = "auto"
	}
	if o.Steps == 0 {
		o.Steps = 20
	}
	switch {
	case o.Warmup == 0:
		o.Warmup = 3
	case o.Warmup < 0:
		o.Warmup = 0
	}
	if o.Warmup >= o.Steps {
		o.Warmup = max(0, o.Steps-1)
	}
	if o.BatchSize == 0 {
		o.BatchSize = 4
	}
	if o.GradAccum == 0 {
		o.GradAccum = 1
	}
	if o.SeqLen == 0 {
		o.SeqLen = 4096
	}
	if o.Optim == "" {
		o.Optim = "adamw_bf16_nearest"
	}
	if o.LR == 0 {
		o.LR = 1e-4
	}
	if o.Beta1 == 0 {
		o.Beta1 = 0.9
	}
	if o.Beta2 == 0 {
		o.Beta2 = 0.95
	}
	if o.Eps == 0 {
		o.Eps = 1e-8
	}
	if o.MaxGradNorm == nil {
		one := 1.0
		o.MaxGradNorm = &one
	}
	if o.Seed == 0 {
		o.Seed = 42
	}
	if o.PeakTFLOPS == 0 {
		o.PeakTFLOPS = H200PeakTFLOPS
	}
}

func (o *Options) validate() error {
	switch {
	case o.Model == "":
		return errors.New("bench: name the checkpoint directory (--model)")
	case o.Data == "":
		return errors.New("bench: name the token file (--data: JSONL of {\"input_ids\": [...]})")
	case o.Steps < 1 || o.Steps > 1_000_000:
		return fmt.Errorf("bench: steps %d must be in [1, 1000000]", o.Steps)
	case !(o.PeakTFLOPS > 0) || math.IsInf(o.PeakTFLOPS, 0):
		return fmt.Errorf("bench: peak TFLOP/s %v must be a positive number", o.PeakTFLOPS)
	case o.FP32 && o.Optim != "adamw_torch":
		return fmt.Errorf("bench: %s keeps bf16 weights: drop fp32, or use adamw_torch", o.Optim)
	case o.BatchSize < 1 || o.BatchSize > 1<<16:
		return fmt.Errorf("bench: batch %d rows must be in [1, 65536]", o.BatchSize)
	case o.GradAccum < 1 || o.GradAccum > 1<<16:
		return fmt.Errorf("bench: gradient accumulation %d micro-batches per data rank must be in [1, 65536]", o.GradAccum)
	}
	return nil
}

// Config is the training configuration the benchmark runs, as `halo-shell launch pretrain`
// would read it from YAML: pre-tokenized data in file order, no packing, a constant learning
// rate, DP*GradAccum micro-batches of BatchSize/(DP*GradAccum) rows per step. With Devices it
// reads the checkpoint's config.json (no weights) and checks the layout against it, so that a
// layout the trainer refuses is reported before anything loads.
func (o Options) Config() (*train.Config, error) {
	o.defaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	lay, err := o.layout()
	if err != nil {
		return nil, err
	}
	micro := lay.DP * o.GradAccum
	if o.BatchSize%micro != 0 {
		return nil, fmt.Errorf("bench: batch %d rows per step cannot be dealt as %d data ranks x %d micro-batches of equal rows: use a batch that is a multiple of %d",
			o.BatchSize, lay.DP, o.GradAccum, micro)
	}
	no, zero, seed := false, 0, o.Seed
	gn := *o.MaxGradNorm
	cfg := &train.Config{
		Method: train.MethodPretrain,
		Model:  train.ModelConfig{ModelNameOrPath: o.Model},
		Dataset: train.DatasetConfig{Path: train.StringList{o.Data}, Format: string(data.FormatTokens),
			Shuffle: &no},
		Batch: train.BatchConfig{MaxLength: o.SeqLen, Packing: &no, PerDeviceTrainBatchSize: o.BatchSize / micro,
			GradientAccumulationSteps: micro},
		Optim: train.OptimConfig{Optim: o.Optim, LearningRate: o.LR, WeightDecay: o.WeightDecay,
			AdamBeta1: o.Beta1, AdamBeta2: o.Beta2, AdamEpsilon: o.Eps, MaxGradNorm: &gn},
		Sched: train.ScheduleConfig{LRSchedulerType: "constant", MaxSteps: o.Steps},
		// The trainer writes nothing by itself; output_dir is only required by the config.
		Run: train.RunConfig{Seed: &seed, OutputDir: filepath.Join(os.TempDir(), "halo-shell-bench"),
			SaveSteps: &zero, BF16: !o.FP32, Device: o.Device},
	}
	cfg.Run.GradientCheckpointing = o.GradientCheckpointing
	cfg.Run.MaxDeviceMemoryGiB = o.MaxDeviceMemoryGiB
	if o.LoRARank > 0 {
		dropout := 0.0
		alpha := o.LoRAAlpha
		if alpha == 0 {
			alpha = 2 * float64(o.LoRARank)
		}
		targets := o.LoRATargets
		if len(targets) == 0 {
			targets = []string{"all-linear"}
		}
		cfg.PEFT = train.PEFTConfig{UsePEFT: true, LoRAR: o.LoRARank, LoRAAlpha: alpha, LoRADropout: &dropout,
			LoRATargetModules: train.StringList(targets)}
	} else if o.LoadIn4bit {
		return nil, fmt.Errorf("bench: a 4-bit base (--load-in-4bit) trains adapters only: set --lora-r")
	}
	if o.LoadIn4bit {
		cfg.Quant = train.QuantConfig{LoadIn4bit: true, QuantType: "nf4", NestedQuant: true}
	}
	if lay.parallel {
		cfg.Run.Device = lay.devices.Kind
		cfg.Parallel = mesh.Config{Devices: o.Devices, FSDP: o.FSDP, TensorParallelSize: o.TP,
			ContextParallelSize: o.CP, ExpertParallelSize: o.EP, ExpertTensorParallelSize: o.ETP}
	} else {
		// The config names the kind; Run opens the numbered device itself (oneDevice).
		cfg.Run.Device = deviceKind(lay.oneDevice(o.Device))
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return cfg, nil
}

// StepResult is one optimizer step.
type StepResult struct {
	Step       int     `json:"step"`
	Loss       float64 `json:"loss"`
	GradNorm   float64 `json:"grad_norm"`
	LR         float64 `json:"lr"`
	Tokens     int     `json:"tokens"`
	StepTimeS  float64 `json:"step_time_s"`
	TokensPerS float64 `json:"tokens_per_s"`
	// Profiled marks the extra step run with the profiler on (not among the timed steps);
	// ProfiledOnDevice says its ops were timed on the device rather than synchronised one by one.
	Profiled         bool `json:"profiled,omitempty"`
	ProfiledOnDevice bool `json:"profiled_on_device,omitempty"`
}

// ModelInfo describes the benchmarked model.
type ModelInfo struct {
	Dir       string `json:"dir"`
	ModelType string `json:"model_type"`
	Params    int64  `json:"params"`
	// ActiveParams is what one token uses (Params for dense models; see FLOPsFormula).
	ActiveParams int64 `json:"active_params"`
	// Experts, TopK, MoELayers and ExpertMLP describe a mixture of experts (0 when dense).
	Experts   int    `json:"experts,omitempty"`
	TopK      int    `json:"top_k,omitempty"`
	MoELayers int    `json:"moe_layers,omitempty"`
	ExpertMLP int    `json:"expert_mlp,omitempty"`
	Layers    int    `json:"layers"`
	Hidden    int    `json:"hidden"`
	Heads     int    `json:"heads"`
	KVHeads   int    `json:"kv_heads"`
	HeadDim   int    `json:"head_dim"`
	MLP       int    `json:"mlp"`
	Vocab     int    `json:"vocab"`
	Tied      bool   `json:"tied"`
	DType     string `json:"dtype"`
}

// Memory is the device memory of the run, in bytes and GiB. On a parallel layout the
// top-level figures are the largest over the devices (Aggregate says so) and PerDevice has
// each device's.
type Memory struct {
	// PeakAllocated is the high-water mark of live tensors over the whole run (load included).
	PeakAllocated    int64   `json:"peak_allocated_bytes"`
	PeakAllocatedGiB float64 `json:"peak_allocated_gib"`
	// Reserved is what the allocator holds from the device at the end of the timed steps.
	Reserved    int64   `json:"reserved_bytes"`
	ReservedGiB float64 `json:"reserved_gib"`
	// Total is the device's capacity when known.
	Total int64 `json:"total_bytes,omitempty"`
	// Aggregate says how the figures above combine several devices ("" on one device).
	Aggregate string `json:"aggregate,omitempty"`
	// PerDevice is each device of a parallel layout, by rank.
	PerDevice []DeviceMemory `json:"per_device,omitempty"`
	// HostPeakAllocated is the peak of the host view of a parallel run (the single model the
	// trainer keeps in host memory, or on the cpu backend for simulated devices).
	HostPeakAllocated int64 `json:"host_peak_allocated_bytes,omitempty"`
}

// DeviceMemory is one device of a parallel layout.
type DeviceMemory struct {
	Rank             int     `json:"rank"`
	Device           string  `json:"device"`
	PeakAllocated    int64   `json:"peak_allocated_bytes"`
	PeakAllocatedGiB float64 `json:"peak_allocated_gib"`
	Reserved         int64   `json:"reserved_bytes"`
	ReservedGiB      float64 `json:"reserved_gib"`
	Total            int64   `json:"total_bytes,omitempty"`
}

// Breakdown is the time of the profiled step by op class. On one GPU each op is timed on the
// device between events (Timing "device"): no op waits, and each class's time is the device
// time of its ops. Elsewhere (the CPU, parallel layouts) each op is followed by a
// synchronisation and timed on the host (Timing "host"), so the step is slower than a timed one
// and the fractions are what the breakdown is for. On a parallel layout every figure is the mean
// over the devices (the session's Profile view of a parallel step) and Comm details the
// collectives.
type Breakdown struct {
	Step int `json:"step"`
	// Timing is "device" (events around each op) or "host" (the host clock after a sync per op).
	Timing   string             `json:"timing"`
	WallS    float64            `json:"wall_s"`
	ByClassS map[string]float64 `json:"by_class_s"`
	Fraction map[string]float64 `json:"fraction"`
	HostS    float64            `json:"host_s"`
	Ops      int                `json:"ops"`
	// Syncs is the host's waits for the device in the step (profile.Step.Syncs: the device's
	// own count on a GPU), summed over devices like Ops.
	Syncs int64 `json:"syncs"`
	// CountedGFLOP is the work the profiler counts per op (attention is not counted).
	CountedGFLOP float64 `json:"counted_gflop"`
	// Comm is the collectives of the profiled step on a parallel layout (nil on one device).
	Comm *CommBreakdown `json:"comm,omitempty"`
	// TopOps are the ops of the profiled step (of the first device) with the most time, by
	// name within class, most first: what each class's time is made of (from the spans the
	// recorder keeps, all of them below profile.MaxSpans a step).
	TopOps []OpTime `json:"top_ops,omitempty"`
}

// OpTime is the time of one op name in the profiled step.
type OpTime struct {
	Name  string  `json:"name"`
	Class string  `json:"class"`
	S     float64 `json:"s"`
	Calls int     `json:"calls"`
	// GFLOP is the work the profiler counted for these calls (0 where it counts none).
	GFLOP float64 `json:"gflop,omitempty"`
}

// topOpsKept is how many ops Breakdown.TopOps lists.
const topOpsKept = 20

// topOps sums the spans of a step by op name and class (collectives apart) and returns the n
// with the most time, most first (ties by name).
func topOps(spans []profile.Span, n int) []OpTime {
	type key struct{ name, class string }
	sum := map[key]*OpTime{}
	for _, sp := range spans {
		if sp.Comm {
			continue
		}
		k := key{sp.Name, sp.Class}
		o := sum[k]
		if o == nil {
			o = &OpTime{Name: sp.Name, Class: sp.Class}
			sum[k] = o
		}
		o.S += sp.Dur.Seconds()
		o.Calls++
		o.GFLOP += float64(sp.FLOPs) / 1e9
	}
	out := make([]OpTime, 0, len(sum))
	for _, o := range sum {
		out = append(out, *o)
	}
	slices.SortFunc(out, func(a, b OpTime) int {
		if a.S != b.S {
			return cmp.Compare(b.S, a.S)
		}
		return cmp.Compare(a.Name+"/"+a.Class, b.Name+"/"+b.Class)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// Report is the result of Run. Its JSON form is what `halo-shell run bench-train` prints.
type Report struct {
	Engine  string `json:"engine"`
	Version string `json:"version"`
	// Device is the one device, or the device list of a parallel layout ("cuda:0-1").
	Device string `json:"device"`
	// Layout is the trainer's layout ("dp=2 tp=1 cp=1 ep=2 etp=1"; dp=1 ... on one device).
	Layout string `json:"layout"`
	// DeviceNote says why device auto chose the device it did ("" when nothing to say).
	DeviceNote string       `json:"device_note,omitempty"`
	Model      ModelInfo    `json:"model"`
	Settings   Settings     `json:"settings"`
	LoadS      float64      `json:"load_s"`
	Steps      []StepResult `json:"steps"`
	Losses     []float64    `json:"losses"`
	// TokensPerS is the median tokens/s of the steps after warmup; StepTimeS their median
	// step time.
	TokensPerS     float64 `json:"tokens_per_s"`
	TokensPerSMean float64 `json:"tokens_per_s_mean"`
	StepTimeS      float64 `json:"step_time_s"`
	Memory         Memory  `json:"memory"`
	FLOPsPerToken  float64 `json:"flops_per_token"`
	FLOPsFormula   string  `json:"flops_formula"`
	PeakTFLOPS     float64 `json:"peak_tflops"`
	AchievedTFLOPS float64 `json:"achieved_tflops"`
	MFU            float64 `json:"mfu"`
	// Breakdown is nil with NoProfile.
	Breakdown *Breakdown `json:"breakdown,omitempty"`
}

// Settings are the options the run used, after defaults.
type Settings struct {
	Steps     int `json:"steps"`
	Warmup    int `json:"warmup"`
	BatchSize int `json:"batch_size"`
	SeqLen    int `json:"seq_len"`
	// DataRanks x MicroBatchesPerRank micro-batches of RowsPerMicroBatch rows make BatchSize;
	// BatchSplit says it in words.
	DataRanks           int    `json:"data_ranks"`
	MicroBatchesPerRank int    `json:"micro_batches_per_rank"`
	RowsPerMicroBatch   int    `json:"rows_per_micro_batch"`
	BatchSplit          string `json:"batch_split"`
	// Devices and the degrees of a parallel layout (absent on one device).
	Devices     string  `json:"devices,omitempty"`
	TP          int     `json:"tp,omitempty"`
	CP          int     `json:"cp,omitempty"`
	EP          int     `json:"ep,omitempty"`
	ETP         int     `json:"etp,omitempty"`
	FSDP        bool    `json:"fsdp,omitempty"`
	DataRows    int     `json:"data_rows"`
	Data        string  `json:"data"`
	Optim       string  `json:"optim"`
	LR          float64 `json:"lr"`
	Beta1       float64 `json:"beta1"`
	Beta2       float64 `json:"beta2"`
	Eps         float64 `json:"eps"`
	WeightDecay float64 `json:"weight_decay"`
	MaxGradNorm float64 `json:"max_grad_norm"`
	Seed        int64   `json:"seed"`
}

// FLOPsPerToken is 6*N + 6*L*T*NH*HD (see FLOPsFormula): backend.TrainingFLOPsPerToken, built
// from the cost table's per-product counts that the profiler and the GPU benchmarks use too.
func FLOPsPerToken(params int64, layers, seqLen, heads, headDim int) float64 {
	return backend.TrainingFLOPsPerToken(params, layers, seqLen, heads, headDim)
}

// Run loads the model and data, runs the timed steps and, unless NoProfile, one profiled
// step, and returns the report. ctx is checked between steps. With a parallel layout
// (Devices) the trainer builds its plan as `halo-shell launch` does (train.New: one backend
// per device, each wrapped for profiling, NCCL between GPUs, the host view in host memory).
func Run(ctx context.Context, o Options) (*Report, error) {
	cfg, err := o.Config()
	if err != nil {
		return nil, err
	}
	o.defaults()
	start := time.Now()
	var tr *train.Trainer
	var note string
	recs := []*profile.Recorder(nil)
	if cfg.Parallel.Devices != "" {
		if tr, err = train.New(cfg); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		recs = tr.RankRecorders()
	} else {
		lay, err := o.layout()
		if err != nil {
			return nil, err
		}
		dev := lay.oneDevice(o.Device)
		b, n, err := backend.Resolve(dev)
		if err != nil {
			return nil, fmt.Errorf("bench: device %s: %w", dev, err)
		}
		note = n
		if o.MaxDeviceMemoryGiB > 0 {
			// train.New caps the devices it opens; this one is opened here.
			if err := backend.LimitMemory(b, o.MaxDeviceMemoryGiB, "--max-device-memory-gib"); err != nil {
				_ = b.Close()
				return nil, fmt.Errorf("bench: %w", err)
			}
		}
		if !o.NoProfile {
			// The profile wrapper is what a session puts around every device; while off it
			// costs one atomic load per op.
			rec := profile.NewRecorder()
			if t := b.Optional().Timer; t != nil {
				rec.TimeOnDevice(t) // each op timed on the GPU, none waited for
			}
			b = profile.Wrap(b, rec)
			recs = []*profile.Recorder{rec}
		}
		if tr, err = train.NewOn(cfg, b); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	defer tr.Close()
	if need := o.Steps * o.BatchSize; tr.Stats.Documents < need {
		return nil, fmt.Errorf("bench: %s has %d rows; %d steps of %d rows need %d (no row is trained twice): write more rows or run fewer steps",
			o.Data, tr.Stats.Documents, o.Steps, o.BatchSize, need)
	}
	if tr.Stats.Truncated > 0 {
		return nil, fmt.Errorf("bench: %s: %d rows are longer than the sequence length %d: write rows of at most %d ids or raise the sequence length",
			o.Data, tr.Stats.Truncated, o.SeqLen, o.SeqLen)
	}
	devs := tr.RankDevices()
	for _, b := range append([]backend.Backend{tr.Backend()}, devs...) {
		if err := b.Sync(); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", b.Name(), err)
		}
	}
	host, err := tr.HostModel() // no step has run: nothing is gathered
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	shape := parallel.ShapeOf(host)
	a := tr.Arch()
	li := tr.Layout()
	device := tr.Backend().Name()
	if li.Parallel {
		device = li.Devices
	}
	dp := cfg.Batch.GradientAccumulationSteps / o.GradAccum
	r := &Report{
		Engine: "halo-shell", Version: version(), Device: device, DeviceNote: note, Layout: li.Layout,
		Model: ModelInfo{Dir: o.Model, ModelType: a.ModelType, Params: int64(tr.NumParams()),
			ActiveParams: shape.ActiveParameters(), Experts: shape.Experts, TopK: shape.TopK,
			MoELayers: shape.MoELayers, ExpertMLP: shape.ExpertIntermediate,
			Layers: a.Layers, Hidden: a.Hidden, Heads: a.Heads, KVHeads: a.KVHeads,
			HeadDim: a.HeadDim, MLP: a.Intermediate, Vocab: a.Vocab, Tied: a.Tied,
			DType: tr.ModelDType().String()},
		Settings: Settings{Steps: o.Steps, Warmup: o.Warmup, BatchSize: o.BatchSize, SeqLen: o.SeqLen,
			DataRanks: dp, MicroBatchesPerRank: o.GradAccum, RowsPerMicroBatch: cfg.Batch.PerDeviceTrainBatchSize,
			BatchSplit: fmt.Sprintf("%d rows per step = %d data ranks x %d micro-batches per rank x %d rows per micro-batch, in file order; the loss is the mean over every target token of the step",
				o.BatchSize, dp, o.GradAccum, cfg.Batch.PerDeviceTrainBatchSize),
			DataRows: tr.Stats.Documents, Data: o.Data, Optim: o.Optim, LR: o.LR, Beta1: o.Beta1,
			Beta2: o.Beta2, Eps: o.Eps, WeightDecay: o.WeightDecay, MaxGradNorm: *o.MaxGradNorm, Seed: o.Seed},
		LoadS:        time.Since(start).Seconds(),
		FLOPsFormula: FLOPsFormula, PeakTFLOPS: o.PeakTFLOPS,
	}
	if li.Parallel {
		r.Settings.Devices = li.Devices
		r.Settings.TP, r.Settings.CP, r.Settings.EP, r.Settings.ETP, r.Settings.FSDP = o.TP, o.CP, o.EP, o.ETP, o.FSDP
	}
	r.FLOPsPerToken = FLOPsPerToken(r.Model.ActiveParams, a.Layers, o.SeqLen, a.Heads, a.HeadDim)
	for range o.Steps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sm, err := tr.Step(ctx)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		s := stepResult(sm)
		r.Steps = append(r.Steps, s)
		r.Losses = append(r.Losses, s.Loss)
		if o.Progress != nil {
			o.Progress(s)
		}
	}
	r.Memory = memoryOf(tr.Backend(), devs)
	timed := r.Steps[o.Warmup:]
	tps := make([]float64, len(timed))
	times := make([]float64, len(timed))
	for i, s := range timed {
		tps[i], times[i] = s.TokensPerS, s.StepTimeS
		r.TokensPerSMean += s.TokensPerS / float64(len(timed))
	}
	r.TokensPerS, r.StepTimeS = median(tps), median(times)
	r.AchievedTFLOPS = r.FLOPsPerToken * r.TokensPerS / 1e12
	r.MFU = r.AchievedTFLOPS / o.PeakTFLOPS
	if len(devs) > 0 {
		r.MFU /= float64(len(devs)) // the peak of every device of the run
	}
	if !o.NoProfile && len(recs) > 0 {
		if r.Breakdown, err = profiledStep(ctx, tr, recs, devs, o.Progress, o.Trace); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// memoryOf is the memory of the run: of the one device, or of each device of a plan (the
// top-level figures then being the largest over the devices, the host view reported apart).
func memoryOf(b backend.Backend, devs []backend.Backend) Memory {
	ms := b.MemStats()
	m := Memory{PeakAllocated: ms.Peak, Reserved: ms.Reserved, Total: ms.Total}
	if len(devs) > 0 {
		m = Memory{HostPeakAllocated: ms.Peak, Aggregate: "max over devices"}
		for rank, d := range devs {
			ms := d.MemStats()
			m.PerDevice = append(m.PerDevice, DeviceMemory{Rank: rank, Device: d.Name(), PeakAllocated: ms.Peak,
				PeakAllocatedGiB: gib(ms.Peak), Reserved: ms.Reserved, ReservedGiB: gib(ms.Reserved), Total: ms.Total})
			m.PeakAllocated = max(m.PeakAllocated, ms.Peak)
			m.Reserved = max(m.Reserved, ms.Reserved)
			m.Total = max(m.Total, ms.Total)
		}
	}
	m.PeakAllocatedGiB, m.ReservedGiB = gib(m.PeakAllocated), gib(m.Reserved)
	return m
}

// writeTrace writes the profiled step of each device (one after another) as a Chrome trace.
func writeTrace(path string, steps []profile.Step) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: trace: %w", err)
	}
	if err := profile.WriteTrace(f, steps); err != nil {
		f.Close()
		return fmt.Errorf("bench: trace %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: trace %s: %w", path, err)
	}
	return nil
}

// profiledStep runs one more step with every op recorded (timed on the GPU, or synchronised) on every device
// and returns its split by op class and collective kind: on a plan, the mean over the devices
// of each part, as the session's Profile reports a parallel step.
func profiledStep(ctx context.Context, tr *train.Trainer, recs []*profile.Recorder, devs []backend.Backend, progress func(StepResult), trace string) (*Breakdown, error) {
	n := tr.Steps() + 1
	for _, rec := range recs {
		// Spans are kept for the trace and for the breakdown's top ops.
		rec.Enable(true, true)
		defer rec.Enable(false, false)
	}
	var before []comm.Stats
	if p := tr.Plan(); p != nil {
		before = p.CommStats()
	}
	for _, rec := range recs {
		rec.BeginStep(n)
	}
	sm, err := tr.Step(ctx)
	if err != nil {
		for _, rec := range recs {
			rec.AbortStep()
		}
		return nil, fmt.Errorf("bench: profiled step: %w", err)
	}
	onDevice := len(recs) > 0 // every device's ops timed on the device
	for _, rec := range recs {
		onDevice = onDevice && rec.DeviceTimed()
	}
	steps := make([]profile.Step, 0, len(recs))
	for _, rec := range recs {
		ps, ok := rec.EndStep()
		if !ok {
			return nil, errors.New("bench: profiled step: a recorder kept no step")
		}
		steps = append(steps, ps)
	}
	if progress != nil {
		s := stepResult(sm)
		s.Profiled, s.ProfiledOnDevice = true, onDevice
		progress(s)
	}
	if trace != "" {
		if err := writeTrace(trace, steps); err != nil {
			return nil, err
		}
	}
	ps := profile.MeanSteps(steps)
	timing := "host"
	if onDevice {
		timing = "device"
	}
	bd := &Breakdown{Step: n, Timing: timing, WallS: ps.Wall.Seconds(), ByClassS: map[string]float64{}, Fraction: map[string]float64{},
		HostS: ps.Host.Seconds(), Ops: ps.Ops, Syncs: ps.Syncs, CountedGFLOP: float64(ps.FLOPs) / 1e9}
	for k, d := range ps.Compute {
		bd.ByClassS[k] = d.Seconds()
	}
	for k, d := range ps.Comm {
		bd.ByClassS["comm."+k] = d.Seconds()
	}
	total := ps.Sum().Seconds()
	if total > 0 {
		for k, v := range bd.ByClassS {
			bd.Fraction[k] = v / total
		}
		bd.Fraction["host"] = bd.HostS / total
	}
	if len(devs) > 0 {
		bd.Comm = commBreakdown(steps, ps, before, tr.Plan().CommStats(), devs)
	}
	bd.TopOps = topOps(steps[0].Spans, topOpsKept)
	return bd, nil
}

func stepResult(m train.StepMetrics) StepResult {
	return StepResult{Step: m.Step, Loss: m.Loss, GradNorm: m.GradNorm, LR: m.LR, Tokens: m.Tokens,
		StepTimeS: m.StepTimeS, TokensPerS: m.TokensPerS}
}

func gib(n int64) float64 { return float64(n) / (1 << 30) }

// median of xs (the mean of the middle two for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// version is the binary's VCS revision (with "+dirty" for a modified tree) and Go version.
func version() string {
	rev, dirty := "unknown", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if dirty {
		rev += "+dirty"
	}
	return rev + " " + runtime.Version()
}
