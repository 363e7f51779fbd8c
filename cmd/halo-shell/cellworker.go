package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/cell"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:    "cell-worker",
		Short:  "Run cells for a REPL or kernel (started by them; speaks a protocol on stdin and fd 3)",
		Hidden: true,
		Args:   cobra.NoArgs,
		Run:    func(*cobra.Command, []string) { os.Exit(cell.WorkerMain()) },
	})
}
