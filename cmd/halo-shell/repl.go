package main

import (
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/repl"
)

func init() {
	addFlags := func(c *cobra.Command, sessionName, history *string, takeOver *bool) {
		c.Flags().StringVar(sessionName, "session", "", "session to attach to: a name, a socket path or tcp://HOST:PORT (default: the default session, started if none runs)")
		c.Flags().BoolVar(takeOver, "take-over", false, "take control of the session from the client that holds it (as :takeover does)")
		c.Flags().StringVar(history, "history", "", `history file ("-" for none; default $HALO_HISTORY, else repl_history under $XDG_STATE_HOME/halo-shell or the user cache directory)`)
	}
	run := func(cmd *cobra.Command, sessionName, history string, takeOver bool) error {
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGHUP)
		defer stop()
		return repl.Run(ctx, repl.Options{Session: sessionName, HistoryFile: history, TakeOver: takeOver,
			In: cmd.InOrStdin(), Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()})
	}
	var (
		sessionName, history string
		takeOver             bool
	)
	replCmd := &cobra.Command{
		Use:   "repl",
		Short: "Attach a Go REPL to a session (the default command)",
		Long: `Evaluates Go statements against the halo API of the attached session, with colon commands for
the common actions (:step N, :run, :pause, :resume, :profile N, :set lr=1e-5, :save DIR,
:status, :takeover, :release, :attach NAME, :load CONFIG.yaml, :eval, :generate TEXT, :help). Variables persist
between lines. Ctrl-C interrupts the current line, never the session; Ctrl-D detaches.
When standard input is not a terminal, it is read as a script:

  echo ':step 2' | halo-shell repl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd, sessionName, history, takeOver) },
	}
	addFlags(replCmd, &sessionName, &history, &takeOver)
	rootCmd.AddCommand(replCmd)

	var (
		rootSession, rootHistory string
		rootTakeOver             bool
	)
	addFlags(rootCmd, &rootSession, &rootHistory, &rootTakeOver)
	rootCmd.Args = cobra.NoArgs
	rootCmd.RunE = func(cmd *cobra.Command, _ []string) error { return run(cmd, rootSession, rootHistory, rootTakeOver) }
}
