package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"

	_ "github.com/halo-shell/halo-shell/engine/backend/cpu" // registers the cpu device
	"github.com/halo-shell/halo-shell/engine/train"
)

const launchHelp = `Trains with a YAML config whose keys follow Hugging Face TrainingArguments
(model_name_or_path or init, dataset, max_length, packing, per_device_train_batch_size,
gradient_accumulation_steps, learning_rate, lr_scheduler_type, warmup_steps, max_steps,
num_train_epochs, weight_decay, max_grad_norm, seed, output_dir, save_steps, logging_steps,
eval_steps, optim, bf16, device, ...). Unknown keys, wrong types and impossible values are
refused before any work, naming the key, line and column.

Any key can be overridden after the config file: --learning_rate=1e-3, --init.preset=tiny,
--dataset.eval_split=0.1. --resume_from_checkpoint=DIR continues a run exactly.

Writes output_dir/metrics.jsonl (one JSON object per optimizer step), checkpoints
output_dir/checkpoint-N every save_steps and at the end, and the final Hugging Face model into
output_dir. Ctrl-C stops at the next step boundary and saves a checkpoint.

Flags:
  --dry-run   print the resolved config and a memory estimate, then exit
  -h, --help  this help`

func init() {
	cmd := &cobra.Command{
		Use:                "launch pretrain|sft CONFIG.yaml [--key=value ...] [--dry-run]",
		Short:              "Train from a YAML config (batch run with a progress bar and metrics.jsonl)",
		Long:               launchHelp,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var pos, overrides []string
			dry := false
			for _, a := range args {
				switch {
				case a == "-h" || a == "--help":
					return cmd.Help()
				case a == "--dry-run" || a == "--dry-run=true":
					dry = true
				case a == "--dry-run=false":
				case strings.HasPrefix(a, "-"):
					overrides = append(overrides, a)
				default:
					pos = append(pos, a)
				}
			}
			if len(pos) != 2 {
				return fmt.Errorf("launch: want a method and a config file: launch pretrain|sft CONFIG.yaml [--key=value ...] (got %d arguments)", len(pos))
			}
			method := pos[0]
			if method != train.MethodPretrain && method != train.MethodSFT {
				return fmt.Errorf("launch: unknown method %q (use pretrain or sft)", method)
			}
			cfg, err := train.LoadConfig(pos[1], method, overrides)
			if err != nil {
				return err
			}
			if dry {
				return dryRun(cmd, cfg)
			}
			return launch(cfg)
		},
	}
	rootCmd.AddCommand(cmd)
}

func dryRun(cmd *cobra.Command, cfg *train.Config) error {
	out := cmd.OutOrStdout()
	y, err := yaml.MarshalWithOptions(cfg, yaml.IndentSequence(true))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "# resolved config\n%s\n", y)
	mc, err := train.ModelConfigFor(cfg)
	if err != nil {
		return err
	}
	est, err := train.EstimateMemory(cfg, mc)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, est)
	return nil
}

func launch(cfg *train.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t, err := train.New(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	tty := false
	if st, err := os.Stderr.Stat(); err == nil {
		tty = st.Mode()&os.ModeCharDevice != 0
	}
	_, err = train.Run(ctx, t, train.RunOptions{Progress: os.Stderr, TTY: tty, Log: os.Stderr})
	if errors.Is(err, context.Canceled) {
		return errors.New("launch: interrupted")
	}
	return err
}
