package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	_ "github.com/halo-shell/halo-shell/engine/backend/cpu"  // registers the cpu device
	_ "github.com/halo-shell/halo-shell/engine/backend/cuda" // registers the cuda device
	"github.com/halo-shell/halo-shell/engine/bench"
)

func init() {
	var o bench.Options
	var out string
	var gradNorm float64
	cmd := &cobra.Command{
		Use:   "bench-train",
		Short: "Measure training speed, memory and MFU on pre-tokenized rows from a checkpoint",
		Long: `Loads a Hugging Face checkpoint, reads --data (JSONL, one {"input_ids": [...]} row per line, at
most --seq-len ids each) and trains --steps optimizer steps of --batch rows in file order (step i
trains rows i*batch onwards) with the trainer that launch runs: constant learning rate, AdamW,
gradient clipping, bf16 weights. It then runs one extra step with the profiler on for the time
split by op class, and prints a JSON report: per-step loss and time, median tokens/s after
--warmup steps, peak and reserved device memory, MFU (the formula is in the report) and the
breakdown. Progress goes to stderr.

--devices lays the run out over several devices as launch's devices key does (cpu:2 simulated
devices, cuda:0-1), with --tp, --cp, --ep, --etp and --fsdp (the keys tensor_parallel_size,
context_parallel_size, expert_parallel_size, expert_tensor_parallel_size and fsdp; dp is what
the devices leave). --batch stays the rows of the whole step, dealt as dp data ranks x
--grad-accum micro-batches of batch/(dp*grad-accum) rows. The report then has the layout,
memory per device, the collectives of the profiled step by kind and, with --ep, the share of
the step in the dispatch and combine all-to-alls. A layout the trainer refuses is reported
before any weight is read.

scripts/gpu/bench.sh runs it beside stock PyTorch + transformers on the same weights and rows.`,
		Example: `  halo-shell run bench-train --model /tmp/bench/qwen3/init --data /tmp/bench/qwen3/tokens.jsonl --device cuda --out report.json
  halo-shell run bench-train --model DIR --data FILE --device cpu --steps 3 --batch 1 --seq-len 64
  halo-shell run bench-train --model MOE_DIR --data FILE --devices cuda:0-1 --ep 2 --batch 4 --seq-len 2048`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g := gradNorm
			o.MaxGradNorm = &g
			if o.Warmup == 0 {
				o.Warmup = -1 // the library's zero means its default
			}
			errw := cmd.ErrOrStderr()
			o.Progress = func(s bench.StepResult) {
				tag := ""
				switch {
				case s.ProfiledOnDevice:
					tag = " (profiled: every op timed on the device)"
				case s.Profiled:
					tag = " (profiled: every op synchronised)"
				}
				fmt.Fprintf(errw, "step %d loss %.4f grad_norm %.3f %.3f s %.0f tok/s%s\n", s.Step, s.Loss, s.GradNorm, s.StepTimeS, s.TokensPerS, tag)
			}
			r, err := bench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(errw, "%s on %s (%s): %.0f tok/s (median after %d warmup steps), peak %.2f GiB, MFU %.1f%%\n",
				r.Model.ModelType, r.Device, r.Layout, r.TokensPerS, r.Settings.Warmup, r.Memory.PeakAllocatedGiB, 100*r.MFU)
			for _, d := range r.Memory.PerDevice {
				fmt.Fprintf(errw, "  rank %d %s: peak %.2f GiB, reserved %.2f GiB\n", d.Rank, d.Device, d.PeakAllocatedGiB, d.ReservedGiB)
			}
			if bd := r.Breakdown; bd != nil && bd.Comm != nil {
				fmt.Fprintf(errw, "  profiled step: all-to-all dispatch %.1f%%, combine %.1f%%, all collectives %.1f%% of %.3f s\n",
					100*bd.Comm.DispatchFraction, 100*bd.Comm.CombineFraction, 100*bd.Comm.CommFraction, bd.Comm.WallS)
			}
			raw, err := json.MarshalIndent(r, "", "  ")
			if err != nil {
				return err
			}
			raw = append(raw, '\n')
			if out == "" || out == "-" {
				_, err = cmd.OutOrStdout().Write(raw)
				return err
			}
			if err := os.WriteFile(out, raw, 0o644); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Model, "model", "", "checkpoint directory (config.json + safetensors)")
	f.StringVar(&o.Data, "data", "", `token rows: JSONL of {"input_ids": [...]}`)
	f.StringVar(&o.Device, "device", "auto", "device: cpu, cuda, cuda:N or auto")
	f.StringVar(&o.Devices, "devices", "", "lay the run out over these devices: cpu:N (simulated), cuda:0-7, cuda:0,2")
	f.IntVar(&o.TP, "tp", 1, "tensor-parallel degree (tensor_parallel_size), with --devices")
	f.IntVar(&o.CP, "cp", 1, "context-parallel degree (context_parallel_size), with --devices")
	f.IntVar(&o.EP, "ep", 1, "expert-parallel degree (expert_parallel_size), with --devices")
	f.IntVar(&o.ETP, "etp", 1, "expert-tensor-parallel degree (expert_tensor_parallel_size), with --devices")
	f.BoolVar(&o.FSDP, "fsdp", false, "shard parameters, gradients and optimizer state over the data ranks, with --devices")
	f.IntVar(&o.GradAccum, "grad-accum", 1, "micro-batches per data rank per step (--batch is split over data ranks x micro-batches)")
	f.IntVar(&o.Steps, "steps", 20, "timed optimizer steps")
	f.IntVar(&o.Warmup, "warmup", 3, "leading steps left out of the medians")
	f.IntVar(&o.BatchSize, "batch", 4, "rows per optimizer step, over every data rank and micro-batch")
	f.IntVar(&o.SeqLen, "seq-len", 4096, "longest row in tokens")
	f.StringVar(&o.Optim, "optim", "adamw_bf16_nearest", "adamw_bf16_nearest (bf16 weights and moments rounded to nearest, as torch.optim.AdamW on bf16 parameters), adamw_bf16 (stochastic rounding) or adamw_torch (fp32 master weights and moments)")
	f.BoolVar(&o.FP32, "fp32", false, "train fp32 weights (with --optim adamw_torch)")
	f.Float64Var(&o.LR, "lr", 1e-4, "constant learning rate")
	f.Float64Var(&o.Beta1, "beta1", 0.9, "AdamW beta1")
	f.Float64Var(&o.Beta2, "beta2", 0.95, "AdamW beta2")
	f.Float64Var(&o.Eps, "eps", 1e-8, "AdamW epsilon")
	f.Float64Var(&o.WeightDecay, "weight-decay", 0, "AdamW decoupled weight decay (matrices only)")
	f.Float64Var(&gradNorm, "max-grad-norm", 1.0, "clip the global gradient norm to this (0: no clipping)")
	f.Int64Var(&o.Seed, "seed", 42, "seed of stochastic rounding")
	f.BoolVar(&o.NoProfile, "no-profile", false, "skip the extra profiled step and the profile wrapper")
	f.StringVar(&o.Trace, "trace", "", "write the profiled step's ops as a Chrome/Perfetto trace to this file")
	f.Float64Var(&o.PeakTFLOPS, "peak-tflops", bench.H200PeakTFLOPS, "device peak dense bf16 TFLOP/s for MFU")
	f.StringVar(&out, "out", "", "write the JSON report here (default stdout)")
	f.IntVar(&o.LoRARank, "lora-r", 0, "train LoRA adapters of this rank over a frozen base (use_peft); 0 trains the whole model")
	f.Float64Var(&o.LoRAAlpha, "lora-alpha", 0, "lora_alpha (default 2 x --lora-r)")
	f.StringSliceVar(&o.LoRATargets, "lora-targets", nil, "lora_target_modules (default all-linear)")
	f.BoolVar(&o.LoadIn4bit, "load-in-4bit", false, "store the base's linear layers in NF4 with double quantisation (QLoRA; with --lora-r)")
	f.BoolVar(&o.GradientCheckpointing, "gradient-checkpointing", false, "recompute each layer's activations in backward")
	f.Float64Var(&o.MaxDeviceMemoryGiB, "max-device-memory-gib", 0, "cap the device's memory at this many GiB (0: no cap)")
	_ = cmd.MarkFlagRequired("model")
	_ = cmd.MarkFlagRequired("data")
	runCmd.AddCommand(cmd)
}
