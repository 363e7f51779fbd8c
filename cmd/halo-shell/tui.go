package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/tui"
)

func init() {
	var (
		name        string
		config      string
		method      string
		noStart     bool
		peakTFLOPS  float64
		statusEvery time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tui",
		Short: "Attach a live dashboard to a session (q detaches; the session keeps running)",
		Long: `Attaches a terminal dashboard to an engine session: loss and learning-rate charts, tokens/s,
MFU, a step-time breakdown (compute by op class, each collective kind, idle), the session's log
and its state. Keys: p pause/resume (starts a run when idle), s step once, f profile 3 steps,
t take control, ? help, q detach. When no session of that name runs, one is started (loading
--config when given), unless --no-start is given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return tui.Run(cmd.Context(), tui.RunOptions{
				Session: name,
				NoStart: noStart,
				Start:   session.StartOptions{ConfigPath: config, Method: method},
				Model:   tui.Options{PeakFLOPS: peakTFLOPS * 1e12, StatusEvery: statusEvery},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "session", "", "session name, socket path or tcp://HOST:PORT (default: the default session)")
	f.BoolVar(&noStart, "no-start", false, "attach only to a running session; never start one")
	f.StringVar(&config, "config", "", "YAML config to load into a session this command starts")
	f.StringVar(&method, "method", "sft", "training method of --config: sft or pretrain")
	f.Float64Var(&peakTFLOPS, "peak-tflops", 0, "device peak in TFLOP/s for MFU (default: known for H100/H200/A100)")
	f.DurationVar(&statusEvery, "status-every", 2*time.Second, "how often to refresh clients and controller")
	rootCmd.AddCommand(cmd)
}
