package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/session"
	"github.com/halo-shell/halo-shell/session/server"
)

func init() {
	sessionCmd := &cobra.Command{
		Use:   "session",
		Short: "Start, list, inspect and stop engine sessions",
	}
	var (
		name, config, method, listen, saveOnStop string
		tlsCert, tlsKey                          string
		foreground, allowRemote                  bool
		overrides                                []string
	)
	start := &cobra.Command{
		Use:   "start",
		Short: "Start a session (detached unless --foreground) and print its name, socket and pid",
		Long: `Starts an engine session that clients (REPL, TUI, Jupyter kernel) attach to by name. By default it
re-executes itself detached (its own process session), logs to NAME.log beside its socket and
returns once the socket answers. SIGTERM (session stop) stops it at the next step boundary,
saving a checkpoint first when --save-on-stop is set.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			so := server.Options{Name: name, Listen: listen, AllowRemote: allowRemote, TLSCert: tlsCert, TLSKey: tlsKey,
				SaveOnStop: saveOnStop, ConfigPath: config, Method: method, Overrides: overrides}
			if listen != "" {
				warning, err := server.CheckListen(so)
				if err != nil {
					return err
				}
				if warning != "" && !foreground {
					fmt.Fprintln(cmd.ErrOrStderr(), "halo-shell: warning:", warning)
				}
			} else if allowRemote || tlsCert != "" || tlsKey != "" {
				return fmt.Errorf("session start: --allow-remote, --tls-cert and --tls-key go with --listen tcp://HOST:PORT")
			}
			if foreground {
				h := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
				ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
				defer stop()
				so.Logger = slog.New(h)
				return server.Serve(ctx, so)
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("session start: cannot find this program to re-execute: %w", err)
			}
			res, err := session.Start(cmd.Context(), session.StartOptions{Name: name, ConfigPath: config, Method: method,
				Listen: listen, AllowRemote: allowRemote, TLSCert: absPath(tlsCert), TLSKey: absPath(tlsKey),
				SaveOnStop: saveOnStop, Overrides: overrides, Command: []string{exe}})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s started: socket %s, pid %d, log %s\n", res.Name, res.Socket, res.Pid, res.Log)
			return nil
		},
	}
	f := start.Flags()
	f.StringVar(&name, "name", session.DefaultName, "session name")
	f.StringVar(&config, "config", "", "YAML config to load at start")
	f.StringVar(&method, "method", "sft", "training method of --config: sft or pretrain")
	f.StringSliceVar(&overrides, "set", nil, "config overrides for --config, as --set learning_rate=1e-3 (repeatable)")
	f.StringVar(&listen, "listen", "", "also serve tcp://HOST:PORT (bearer token required; HOST defaults to 127.0.0.1; other than loopback needs --allow-remote)")
	f.BoolVar(&allowRemote, "allow-remote", false, "let --listen bind an address other machines can reach (warns; use --tls-cert/--tls-key, or an SSH tunnel to a loopback address)")
	f.StringVar(&tlsCert, "tls-cert", "", "PEM certificate: serve --listen over TLS (clients set HALO_SESSION_CA to the CA file)")
	f.StringVar(&tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&saveOnStop, "save-on-stop", "", "directory where stopping saves a checkpoint first")
	f.BoolVar(&foreground, "foreground", false, "run in this process instead of detaching")

	list := &cobra.Command{
		Use:   "list",
		Short: "List live sessions (removing stale sockets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ss, err := session.List(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tSTEP\tPID\tCLIENTS\tSOCKET")
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%d\t%s\n", s.Name, stateWord(s.Status.State), s.Status.Step, s.Status.TotalSteps,
					s.Status.Pid, len(s.Status.Clients), s.Socket)
			}
			return tw.Flush()
		},
	}
	var statusName string
	status := &cobra.Command{
		Use:   "status",
		Short: "Show a session's state, step, configuration and clients",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := session.ValidateName(statusName); err != nil {
				return err
			}
			c, err := session.Dial(statusName, session.Options{ClientName: "session-status"})
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			defer cancel()
			st, err := c.Status(ctx)
			if session.IsUnavailable(err) {
				return session.NotRunning(cmd.Context(), statusName)
			}
			if err != nil {
				return fmt.Errorf("session %s: %w", statusName, err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "session %s (pid %d): %s, step %d of %d", st.Name, st.Pid, stateWord(st.State), st.Step, st.TotalSteps)
			if st.Device != "" {
				fmt.Fprintf(out, " on %s", st.Device)
			}
			fmt.Fprintln(out)
			if m := st.LastMetrics; m != nil {
				fmt.Fprintf(out, "last step %d: loss %.4f, lr %.3g, grad norm %.3f, %.0f tok/s\n", m.Step, m.Loss, m.Lr, m.GradNorm, m.TokensPerS)
			}
			if st.LastError != "" {
				fmt.Fprintf(out, "last error: %s\n", st.LastError)
			}
			if st.ConfigSummary != "" {
				fmt.Fprintln(out, st.ConfigSummary)
			}
			for _, cl := range st.Clients {
				role := "observer"
				if cl.Controller {
					role = "controller"
				}
				fmt.Fprintf(out, "client %s %s %s\n", cl.Id, cl.Name, role)
			}
			return nil
		},
	}
	status.Flags().StringVar(&statusName, "name", session.DefaultName, "session name")
	var (
		stopName string
		stopWait time.Duration
	)
	stop := &cobra.Command{
		Use:   "stop",
		Short: "Stop a session at its next step boundary (SIGTERM; saves first when configured)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := session.Stop(cmd.Context(), stopName, stopWait)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s (pid %d) stopped at step %d\n", st.Name, st.Pid, st.Step)
			return nil
		},
	}
	stop.Flags().StringVar(&stopName, "name", session.DefaultName, "session name")
	stop.Flags().DurationVar(&stopWait, "wait", 2*time.Minute, "how long to wait for the session to exit")
	sessionCmd.AddCommand(start, list, status, stop)
	rootCmd.AddCommand(sessionCmd)
}

// absPath makes a path absolute against this process's directory ("" stays "").
func absPath(p string) string {
	if p == "" {
		return ""
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func stateWord(s session.State) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "STATE_"))
}
