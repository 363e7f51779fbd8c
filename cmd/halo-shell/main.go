// Command halo-shell is the single binary of the project: the REPL (default), the engine
// session, the TUI, the Jupyter kernel, batch training (launch) and tools (run).
//
// This package only wires command-line flags to the packages that do the work. Each
// subcommand lives in its own file and registers itself in an init function.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/halo-shell/halo-shell/internal/switches"

	"github.com/spf13/cobra"
)

// rootCmd is the halo-shell command; subcommands attach to it from their own files.
var rootCmd = &cobra.Command{
	Use:           "halo-shell",
	Short:         "Interactive LLM training: sessions, REPL, TUI, Jupyter kernel and batch runs",
	SilenceUsage:  true,
	SilenceErrors: true,
}

// runCmd groups the one-shot tools: `halo-shell run <tool>`.
var runCmd = &cobra.Command{
	Use:   "run TOOL",
	Short: "Run a one-shot tool (tokenize, inspect, logprobs, generate, init-model, ...)",
	// An unknown tool reaches RunE (its flags unparsed) so that it is named with the closest
	// tools, rather than reported as an unknown flag of "run".
	SuggestionsMinimumDistance: 2,
	FParseErrWhitelist:         cobra.FParseErrWhitelist{UnknownFlags: true},
	RunE: func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("run: unknown tool %q", args[0])
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
		}
		return errors.New(msg + `; "halo-shell run --help" lists the tools`)
	},
}

func init() {
	rootCmd.AddCommand(runCmd)
}

func main() {
	warnSwitches(os.Stderr, os.Environ())
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "halo-shell:", err)
		os.Exit(1)
	}
}

// warnSwitches prints one warning line per HALO_* variable of environ that is not a known
// switch (a typo) or holds a value outside its switch's list (SWITCHES.md lists them all).
func warnSwitches(w io.Writer, environ []string) {
	for _, p := range switches.Problems(environ) {
		fmt.Fprintln(w, "halo-shell: warning:", p)
	}
}
