package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"

	_ "github.com/halo-shell/halo-shell/engine/backend/cpu" // registers the cpu device
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/train"
	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/session/server"
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

The run is also an engine session: while it trains, "halo-shell tui --session NAME" or
"halo-shell repl --session NAME" attach to it (watch, pause, profile); "halo-shell session list"
shows it. NAME is "launch-" + the base name of output_dir unless --name says otherwise.

Multi-node flags (defaults from SLURM_NNODES, SLURM_NODEID/SLURM_PROCID, SLURM_JOB_NODELIST):
--nnodes=N, --node-rank=R, --rendezvous=HOST:PORT, --rendezvous-bind=ADDR,
--rendezvous-token=SECRET, --rendezvous-token-file=FILE, --rendezvous-timeout=DURATION. Across
nodes, each node runs the same command with its --node-rank and K devices (cpu:K, or K GPUs
such as cuda:0-7; every node the same K); node 0 serves the rendezvous; the mesh spans
nnodes*K ranks, node r's being r*K..r*K+K-1, talking over TCP on CPU devices and over one NCCL
world on GPUs (node 0 makes the NCCL id, the rendezvous carries it). Dense and MoE models; dp,
fsdp, tp dividing K, cp, ep, etp. Only node 0 writes metrics, checkpoints (with the optimizer
state: resume with --resume_from_checkpoint on every node) and the model. No session is
served.

Flags:
  --dry-run      print the resolved config and a memory estimate, then exit
  --name=NAME    the session name of this run
  --trace=FILE   record every step's ops and write a Chrome/Perfetto trace (JSON) at the end
  -h, --help     this help`

func init() {
	cmd := &cobra.Command{
		Use:                "launch pretrain|sft CONFIG.yaml [--key=value ...] [--dry-run]",
		Short:              "Train from a YAML config (batch run with a progress bar and metrics.jsonl)",
		Long:               launchHelp,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var pos, overrides []string
			lo := launchOptions{nodes: rendezvous.UnsetFlags()}
			dry := false
			for _, a := range args {
				if ok, err := rendezvousArg(a, &lo.nodes); ok {
					if err != nil {
						return fmt.Errorf("launch: %w", err)
					}
					continue
				}
				switch {
				case a == "-h" || a == "--help":
					return cmd.Help()
				case a == "--dry-run" || a == "--dry-run=true":
					dry = true
				case a == "--dry-run=false":
				case strings.HasPrefix(a, "--name="):
					lo.name = strings.TrimPrefix(a, "--name=")
				case strings.HasPrefix(a, "--trace="):
					lo.trace = strings.TrimPrefix(a, "--trace=")
				case a == "--name" || a == "--trace":
					return fmt.Errorf("launch: write %s=VALUE", a)
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
			rc, err := launchNodes(cfg, lo.nodes, os.Getenv)
			if err != nil {
				return err
			}
			if rc.NNodes > 1 && (lo.name != "" || lo.trace != "") {
				return fmt.Errorf("launch: %d nodes: --name and --trace need the run's session, and a run across nodes serves none yet; drop them (the nodes print their progress and node 0 writes metrics.jsonl)", rc.NNodes)
			}
			if dry {
				return dryRun(cmd, cfg, rc.NNodes)
			}
			if rc.NNodes > 1 {
				return launchAcross(cfg, rc)
			}
			return launch(cfg, lo)
		},
	}
	rootCmd.AddCommand(cmd)
}

// dryRun prints the resolved config and the memory estimate of one device (of the whole
// mesh of every node's devices when nnodes > 1).
func dryRun(cmd *cobra.Command, cfg *train.Config, nnodes int) error {
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
	d, l, isParallel, err := cfg.ParallelLayout()
	if err != nil {
		return err
	}
	if nnodes > 1 {
		if d, l, err = train.NodeDevices(cfg, nnodes); err != nil {
			return err
		}
		isParallel = true
	}
	if isParallel {
		// The mesh and the per-device estimate of the layout, or the rule it breaks.
		fmt.Fprintln(out, "# parallel layout")
		if nnodes > 1 {
			fmt.Fprintf(out, "# across %d nodes of %d devices each\n", nnodes, d.Len()/nnodes)
			if k := d.Len() / nnodes; d.Kind == "cuda" && k == 1 {
				fmt.Fprintln(out, "# the devices below are the ranks of the NCCL world: node r drives rank r")
			} else if d.Kind == "cuda" {
				fmt.Fprintf(out, "# the devices below are the ranks of the NCCL world: node r drives ranks r*%d to r*%d+%d\n", k, k, k-1)
			}
		}
		w := cfg.Workload()
		if cp := 2 * max(l.CP, 1); w.SeqLen%cp != 0 {
			w.SeqLen += cp - w.SeqLen%cp // the trainer pads packed rows to the context-parallel chunking
		}
		return parallel.DryRun(out, mc, d, l, w)
	}
	est, err := train.EstimateMemory(cfg, mc)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, est)
	return nil
}

// launchOptions are the launch flags that are not config keys.
type launchOptions struct {
	name  string           // session name ("" = launch-<output_dir base name>)
	trace string           // Chrome/Perfetto trace file ("" = none)
	nodes rendezvous.Flags // --nnodes, --node-rank, --rendezvous...
}

// launchNodes resolves the multi-node flags with the SLURM variables (flags win) and checks
// that the run can span them before any work: K devices on every node (cpu:K over TCP, or K
// GPUs over NCCL), a mesh of nnodes·K ranks, with a layout a run across nodes supports
// (train.NodeDevices).
func launchNodes(cfg *train.Config, f rendezvous.Flags, getenv func(string) string) (rendezvous.Config, error) {
	rc, err := rendezvous.ResolveConfig(f, getenv)
	if err != nil {
		return rc, fmt.Errorf("launch: %w", err)
	}
	if rc.NNodes <= 1 {
		return rc, nil
	}
	if _, _, _, err := cfg.ParallelLayout(); err != nil {
		return rc, err
	}
	if _, _, err := train.NodeDevices(cfg, rc.NNodes); err != nil {
		return rc, fmt.Errorf("launch: %w", err)
	}
	return rc, nil
}

// launchAcross runs this node's share of a run across nodes: no session; node 0 writes the
// files and shows progress, the other nodes print one summary line.
func launchAcross(cfg *train.Config, rc rendezvous.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t, err := train.NewOnNodes(ctx, cfg, rc)
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

func launch(cfg *train.Config, lo launchOptions) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Op timing by class for the session's profile RPC; it costs nothing until profiling is on.
	t, err := server.NewTrainer(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	tty := false
	if st, err := os.Stderr.Stat(); err == nil {
		tty = st.Mode()&os.ModeCharDevice != 0
	}
	name := lo.name
	if name == "" {
		name = session.NameFor("launch-" + filepath.Base(filepath.Clean(cfg.Run.OutputDir)))
	}
	// The session's own log goes to a file so it never tears the progress line.
	if err := os.MkdirAll(cfg.Run.OutputDir, 0o755); err != nil {
		return fmt.Errorf("launch: output_dir: %w", err)
	}
	logFile, err := os.OpenFile(filepath.Join(cfg.Run.OutputDir, "session.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("launch: session log: %w", err)
	}
	defer logFile.Close()
	so := server.Options{Name: name, TraceFile: lo.trace, Logger: slog.New(slog.NewTextHandler(logFile, nil))}
	fmt.Fprintf(os.Stderr, "session %q: attach with halo-shell tui --session %s\n", name, name)
	_, err = server.ServeRun(ctx, so, t, train.RunOptions{Progress: os.Stderr, TTY: tty, Log: os.Stderr})
	if errors.Is(err, context.Canceled) {
		return errors.New("launch: interrupted")
	}
	return err
}
