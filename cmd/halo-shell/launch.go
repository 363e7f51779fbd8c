package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"

	_ "github.com/halo-shell/halo-shell/engine/backend/cpu" // registers the cpu device
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/train"
	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/session/server"
)

const launchHelp = `Trains with METHOD and a YAML config whose keys follow Hugging Face TrainingArguments
(model_name_or_path or init, dataset, max_length, packing, per_device_train_batch_size,
gradient_accumulation_steps, learning_rate, lr_scheduler_type, warmup_steps, max_steps,
num_train_epochs, weight_decay, max_grad_norm, seed, output_dir, save_steps, logging_steps,
eval_steps, optim, bf16, device, ...). Unknown keys, wrong types and impossible values are
refused before any work, naming the key, line and column.

Methods:
` + "{{methods}}" + `
Any key can be overridden after the config file: --learning_rate=1e-3, --init.preset=tiny,
--dataset.eval_split=0.1 (or --learning_rate 1e-3: the next argument is the value).
--resume_from_checkpoint=DIR continues a run exactly.

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
  --trace=FILE   record every step's ops and write a Chrome/Perfetto trace (JSON) to FILE at
                 the end (the path is printed)
  -h, --help     this help`

func init() {
	cmd := &cobra.Command{
		Use:                "launch METHOD CONFIG.yaml [--key=value ...] [--dry-run]",
		Short:              "Train from a YAML config (batch run with a progress bar and metrics.jsonl)",
		Long:               strings.Replace(launchHelp, "{{methods}}", train.MethodSummaries(), 1),
		DisableFlagParsing: true,
		// The flags are listed in launchHelp (they are parsed by parseLaunchArgs), so the
		// usage shows the command line only, not cobra's own flag section.
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			la, err := parseLaunchArgs(args)
			if err != nil {
				return err
			}
			if la.help {
				return cmd.Help()
			}
			pos, overrides, lo, dry := la.pos, la.overrides, la.opts, la.dry
			method := pos[0]
			if _, err := train.LookupMethod(method); err != nil {
				return fmt.Errorf("launch: %w", err)
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
			return launch(cfg, lo, cmd.ErrOrStderr())
		},
	}
	cmd.SetUsageTemplate("Usage:\n  {{.UseLine}}\n")
	rootCmd.AddCommand(cmd)
}

// launchArgs is a launch command line taken apart.
type launchArgs struct {
	pos       []string // the method and the config file
	overrides []string // config overrides, each "--key=value"
	opts      launchOptions
	dry, help bool
}

// parseLaunchArgs splits a launch command line into the method and config file, the config
// overrides and the launch flags. An override or flag is written --key=value or --key value
// (the next argument is then the value); --dry-run and --help take no value.
func parseLaunchArgs(args []string) (launchArgs, error) {
	la := launchArgs{opts: launchOptions{nodes: rendezvous.UnsetFlags()}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-h" || a == "--help":
			la.help = true
			continue
		case a == "--dry-run" || a == "--dry-run=true":
			la.dry = true
			continue
		case a == "--dry-run=false":
			continue
		case a == "--":
			la.pos = append(la.pos, args[i+1:]...)
			i = len(args)
			continue
		case !strings.HasPrefix(a, "-"):
			la.pos = append(la.pos, a)
			continue
		}
		if !strings.HasPrefix(a, "--") || len(a) == 2 {
			return la, fmt.Errorf("launch: %q: flags and overrides start with two dashes (--key=value or --key value)", a)
		}
		if !strings.Contains(a, "=") {
			// --key value: the next argument is the value.
			if i+1 >= len(args) || (strings.HasPrefix(args[i+1], "--") && len(args[i+1]) > 2) {
				return la, fmt.Errorf("launch: %s has no value: write %s=VALUE or %s VALUE", a, a, a)
			}
			i++
			a += "=" + args[i]
		}
		if ok, err := rendezvousArg(a, &la.opts.nodes); ok {
			if err != nil {
				return la, fmt.Errorf("launch: %w", err)
			}
			continue
		}
		switch {
		case strings.HasPrefix(a, "--name="):
			la.opts.name = strings.TrimPrefix(a, "--name=")
		case strings.HasPrefix(a, "--trace="):
			la.opts.trace = strings.TrimPrefix(a, "--trace=")
		default:
			la.overrides = append(la.overrides, a)
		}
	}
	if len(la.pos) != 2 && !la.help {
		got := "nothing"
		if len(la.pos) > 0 {
			got = fmt.Sprintf("%d arguments: %s", len(la.pos), strings.Join(la.pos, " "))
		}
		return la, fmt.Errorf("launch: want a method and a config file, then overrides: launch METHOD CONFIG.yaml [--key=value ...], METHOD one of %s (got %s)", strings.Join(train.Methods(), ", "), got)
	}
	return la, nil
}

// dryRun prints the resolved config and the memory estimate of one device (of the whole
// mesh of every node's devices when nnodes > 1).
func dryRun(cmd *cobra.Command, cfg *train.Config, nnodes int) error {
	out := cmd.OutOrStdout()
	if w := gpuWarning(cfg); w != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "launch: warning:", w)
	}
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
		if err := parallel.DryRun(out, mc, d, l, w); err != nil {
			return err
		}
		if line, err := train.PEFTEstimateLine(cfg, mc); err != nil {
			return err
		} else if line != "" {
			fmt.Fprintln(out, line)
		}
		if nnodes <= 1 {
			warnMemory(cmd, cfg, mc)
		}
		return nil
	}
	est, err := train.EstimateMemory(cfg, mc)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, est)
	warnMemory(cmd, cfg, mc)
	return nil
}

// warnMemory warns on stderr when the run's estimate exceeds the host memory available now,
// for runs on CPU devices (device: auto counts as one where no GPU is usable); the run itself
// would refuse to start.
func warnMemory(cmd *cobra.Command, cfg *train.Config, mc *config.Config) {
	need, err := train.RunMemoryNeed(cfg, mc)
	if err != nil {
		return
	}
	if !need.Host && !(cfg.Parallel.Devices == "" && cfg.Run.Device == "auto" && cuda.Available() != nil) {
		return
	}
	avail, ok := train.HostMemoryAvailable()
	if !ok {
		return
	}
	if short := train.MemoryShortfall(need, avail, "host memory"); short != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "launch: warning: %s; the run would refuse to start (HALO_MEMORY_CHECK=warn tries anyway)\n", short)
	}
}

// gpuWarning says why the run the config describes cannot start on this machine's GPUs, when
// it asks for CUDA devices (device: cuda, or devices: cuda:...) that are not usable here; ""
// otherwise. A dry run only estimates, so it goes on after the warning; device: auto falls
// back to the CPU and never warns.
func gpuWarning(cfg *train.Config) string {
	want, ids := "", []int{0}
	if d, _, _, err := cfg.ParallelLayout(); err == nil && cfg.Parallel.Devices != "" {
		if d.Kind != "cuda" {
			return ""
		}
		want, ids = cfg.Parallel.Devices, d.IDs
	} else if cfg.Run.Device == "cuda" {
		want = "device: cuda"
	} else {
		return ""
	}
	if err := cuda.Available(); err != nil {
		return fmt.Sprintf("the config asks for GPUs (%s) but none is usable here: %v\nThe estimate below is for the GPU run; the run itself would fail on this machine: use --device=cpu (or device: auto, which falls back to the CPU)", want, err)
	}
	n := cuda.DeviceCount()
	for _, id := range ids {
		if id >= n {
			return fmt.Sprintf("the config asks for cuda:%d (%s) but the driver sees %d GPU(s), cuda:0 to cuda:%d; the run itself would fail", id, want, n, n-1)
		}
	}
	return ""
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

// launch runs cfg on this machine as a session; progress and notes go to stderr.
func launch(cfg *train.Config, lo launchOptions, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Op timing by class for the session's profile RPC; it costs nothing until profiling is on.
	t, err := server.NewTrainer(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	tty := false
	if f, ok := stderr.(*os.File); ok {
		if st, err := f.Stat(); err == nil {
			tty = st.Mode()&os.ModeCharDevice != 0
		}
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
	trace := lo.trace
	if trace != "" {
		if trace, err = filepath.Abs(trace); err != nil {
			return fmt.Errorf("launch: --trace: %w", err)
		}
		fmt.Fprintf(stderr, "launch: recording a trace of every step; it is written to %s at the end\n", trace)
	}
	so := server.Options{Name: name, TraceFile: trace, Logger: slog.New(slog.NewTextHandler(logFile, nil))}
	fmt.Fprintf(stderr, "session %q: attach with halo-shell tui --session %s\n", name, name)
	started := time.Now()
	_, err = server.ServeRun(ctx, so, t, train.RunOptions{Progress: stderr, TTY: tty, Log: stderr})
	if trace != "" {
		reportTrace(stderr, trace, started)
	}
	if errors.Is(err, context.Canceled) {
		return errors.New("launch: interrupted")
	}
	return err
}

// reportTrace says where the run's trace went: the file when the run wrote it (it is
// written at the end, also after Ctrl-C), or that there is none.
func reportTrace(w io.Writer, path string, since time.Time) {
	st, err := os.Stat(path)
	if err != nil || st.ModTime().Before(since.Add(-time.Second)) {
		fmt.Fprintf(w, "launch: no trace was written to %s (session.log in output_dir says why)\n", path)
		return
	}
	fmt.Fprintf(w, "launch: wrote the trace (%d KiB) to %s; open it in https://ui.perfetto.dev or chrome://tracing\n", (st.Size()+1023)/1024, path)
}
