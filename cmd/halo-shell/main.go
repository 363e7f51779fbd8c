// Command halo-shell is the single binary of the project: the REPL (default), the engine
// session, the TUI, the Jupyter kernel, batch training (launch) and tools (run).
//
// This package only wires command-line flags to the packages that do the work. Each
// subcommand lives in its own file and registers itself in an init function.
package main

import (
	"fmt"
	"os"

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
	Use:   "run",
	Short: "Run a one-shot tool (tokenize, inspect, logprobs, generate, init-model, ...)",
}

func init() {
	rootCmd.AddCommand(runCmd)
}

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "halo-shell:", err)
		os.Exit(1)
	}
}
