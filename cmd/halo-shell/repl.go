package main

import (
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/repl"
)

func init() {
	addFlags := func(c *cobra.Command, sessionName, history *string) {
		c.Flags().StringVar(sessionName, "session", "", "session to attach to: a name, a socket path or tcp://HOST:PORT (default: the default session, started if none runs)")
		c.Flags().StringVar(history, "history", "", `history file ("-" for none; default $HALO_HISTORY, else repl_history under $XDG_STATE_HOME/halo-shell or the user cache directory)`)
	}
	run := func(cmd *cobra.Command, sessionName, history string) error {
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGHUP)
		defer stop()
		return repl.Run(ctx, repl.Options{Session: sessionName, HistoryFile: history,
			In: cmd.InOrStdin(), Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()})
	}
	var sessionName, history string
	replCmd := &cobra.Command{
		Use:   "repl",
		Short: "Attach a Go REPL to a session (the default command)",
		Long: `Evaluates Go statements against the halo API of the attached session, with colon commands for
the common actions (:step N, :run, :pause, :resume, :profile N, :set lr=1e-5, :save DIR,
:status, :attach NAME, :load CONFIG.yaml, :eval, :generate TEXT, :help). Variables persist
between lines. Ctrl-C interrupts the current line, never the session; Ctrl-D detaches.
When standard input is not a terminal, it is read as a script:

  echo ':step 2' | halo-shell repl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd, sessionName, history) },
	}
	addFlags(replCmd, &sessionName, &history)
	rootCmd.AddCommand(replCmd)

	var rootSession, rootHistory string
	addFlags(rootCmd, &rootSession, &rootHistory)
	rootCmd.Args = cobra.NoArgs
	rootCmd.RunE = func(cmd *cobra.Command, _ []string) error { return run(cmd, rootSession, rootHistory) }
}
