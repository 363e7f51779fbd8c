package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func init() {
	var devices, layout, dtype string
	var w mesh.Workload
	cmd := &cobra.Command{
		Use:   "layout MODEL",
		Short: "Check a parallel layout against a model and print its per-device memory estimate",
		Long: `Check a parallel layout against a model's config.json (no weights are read) and print
the mesh (degrees and groups) and the per-device memory estimate: parameters, gradients,
optimizer state, activations and communication buffers.

MODEL is a checkpoint directory or a config.json. A layout that breaks a rule is refused with
the rule and a layout that works on the same devices.`,
		Example: `  halo-shell run layout ./Qwen3-0.6B --devices cpu:8 --layout "tp=2 fsdp" --seq-len 4096
  halo-shell run layout ./config.json --devices cuda:0-7 --layout "cp=2 tp=4" --dtype bf16`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load(args[0])
			if err != nil {
				return err
			}
			d, err := mesh.ParseDevices(devices)
			if err != nil {
				return err
			}
			l, err := mesh.ParseLayout(layout)
			if err != nil {
				return err
			}
			dt, err := tensor.ParseDType(dtype)
			if err != nil || !dt.IsFloat() {
				return fmt.Errorf("--dtype %q: use f32 or bf16", dtype)
			}
			w.ParamBytes = dt.Size()
			if dt == tensor.BF16 && w.OptimizerBytes == 0 {
				w.OptimizerBytes = 12 // fp32 moments and master weights
			}
			return parallel.DryRun(cmd.OutOrStdout(), cfg, d, l, w)
		},
	}
	f := cmd.Flags()
	f.StringVar(&devices, "devices", "cpu", "devices: cpu, cpu:N, cuda:0-7, cuda:0,2")
	f.StringVar(&layout, "layout", "", `layout words: dp=N fsdp tp=N cp=N ep=N etp=N (dp follows from the devices)`)
	f.IntVar(&w.SeqLen, "seq-len", 2048, "tokens per packed row")
	f.IntVar(&w.Rows, "rows", 1, "rows per data-parallel rank per micro-batch")
	f.StringVar(&dtype, "dtype", "f32", "parameter and activation dtype (f32, bf16)")
	f.IntVar(&w.OptimizerBytes, "optimizer-bytes", 0, "optimizer bytes per parameter (default 8 for f32, 12 for bf16 with fp32 masters)")
	f.BoolVar(&w.Recompute, "recompute", false, "activation recomputation")
	runCmd.AddCommand(cmd)
}
