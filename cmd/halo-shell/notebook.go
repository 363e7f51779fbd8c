package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/kernel"
	"github.com/halo-shell/halo-shell/kernel/nbrun"
)

func init() {
	notebookCmd := &cobra.Command{
		Use:   "notebook",
		Short: "Execute Jupyter notebooks headless on the halo kernel (no Python or Jupyter needed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	var (
		out, sessionName, dir, kernelLog string
		timeout                          time.Duration
		allowErrors, verbose             bool
	)
	run := &cobra.Command{
		Use:   "run NOTEBOOK.ipynb",
		Short: "Execute a notebook's code cells in order on the halo kernel and write the executed notebook",
		Long: `Starts the halo kernel (this binary, as the kernelspec does: halo-shell kernel --connection-file F),
runs the notebook's code cells in order over the Jupyter wire protocol and writes the executed
notebook (nbformat 4: streams, results, displays with every MIME type, errors, execution counts;
metadata and cell ids kept). The kernel attaches to the default session (starting it when none
runs) or to --session, and runs in the current directory (or --dir).

It stops at the first failing cell (the notebook is written up to it) unless --allow-errors
(cells tagged raises-exception may fail; cells tagged skip-execution are skipped);
a cell that runs past --timeout is interrupted and the run fails naming it. The exit status is
0 when every cell ran (with --allow-errors, when no cell timed out).`,
		Example: `  halo-shell notebook run notebooks/01-roofline.ipynb --out /tmp/01.ipynb
  halo-shell notebook run nb.ipynb --timeout 10m --allow-errors`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			src := args[0]
			raw, err := os.ReadFile(src)
			if err != nil {
				return fmt.Errorf("notebook run: %w", err)
			}
			nb, err := nbrun.Parse(raw)
			if err != nil {
				return fmt.Errorf("notebook run: %s: %w", src, err)
			}
			stderr := cmd.ErrOrStderr()
			if name := nb.KernelName(); name != "" && name != kernel.SpecName {
				fmt.Fprintf(stderr, "notebook run: warning: %s names the kernel %q; its cells run on the %s kernel (Go cells) all the same\n", src, name, kernel.SpecName)
			}
			dst := out
			if dst == "" {
				dst = strings.TrimSuffix(src, filepath.Ext(src)) + ".executed.ipynb"
			}
			if timeout < 0 {
				return fmt.Errorf("notebook run: --timeout %v is negative; give a duration such as 5m, or 0 for none", timeout)
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("notebook run: cannot find this executable to start the kernel: %w", err)
			}
			argv := kernel.NewSpec(exe, sessionName).Argv
			for i, a := range argv {
				if a == "{connection_file}" {
					argv[i] = nbrun.ConnectionFileArg
				}
			}
			o := nbrun.Options{Kernel: argv, KernelName: kernel.SpecName, Dir: dir, Timeout: timeout, AllowErrors: allowErrors}
			if kernelLog != "" {
				f, err := os.Create(kernelLog)
				if err != nil {
					return fmt.Errorf("notebook run: --kernel-log: %w", err)
				}
				defer f.Close()
				o.KernelLog = f
			}
			if verbose {
				total := nb.Runnable()
				n := 0
				o.OnCell = func(index int, c *nbrun.Cell, took time.Duration, err error) {
					n++
					status := "ok"
					if err != nil {
						status = "FAILED"
					}
					fmt.Fprintf(stderr, "notebook run: cell %d (%d of %d) %s in %.1fs\n", index, n, total, status, took.Seconds())
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, runErr := nbrun.Run(ctx, nb, o)
			if runErr != nil && res.Ran == 0 {
				// Nothing ran (the kernel did not start): an earlier executed notebook at
				// the destination is worth more than an empty one.
				return fmt.Errorf("notebook run: %s: %w", src, runErr)
			}
			if err := writeNotebook(dst, nb, cmd.OutOrStdout()); err != nil {
				if runErr != nil {
					return fmt.Errorf("notebook run: %v; and writing %s: %w", runErr, dst, err)
				}
				return fmt.Errorf("notebook run: writing %s: %w", dst, err)
			}
			where := dst
			if dst == "-" {
				where = "stdout"
			}
			fmt.Fprintf(stderr, "notebook run: %s: %d code cell(s) ran in %.1fs, %d failed; wrote %s\n",
				src, res.Ran, res.Elapsed.Seconds(), len(res.Failed), where)
			if runErr != nil {
				return fmt.Errorf("notebook run: %s: %w", src, runErr)
			}
			for _, f := range res.Failed {
				fmt.Fprintln(stderr, "notebook run: (allowed)", f)
			}
			return nil
		},
	}
	run.Flags().StringVarP(&out, "out", "o", "", "where to write the executed notebook (default: NOTEBOOK.executed.ipynb beside it; - for stdout)")
	run.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "longest one cell may run before it is interrupted and the run fails (0: no limit)")
	run.Flags().BoolVar(&allowErrors, "allow-errors", false, "go on past failing cells (their errors are recorded in the notebook)")
	run.Flags().StringVar(&sessionName, "session", "", "session the kernel attaches to: a name, a socket path or tcp://HOST:PORT (default: the default session)")
	run.Flags().StringVar(&dir, "dir", "", "the kernel's working directory, where cells' relative paths start (default: the current directory)")
	run.Flags().StringVar(&kernelLog, "kernel-log", "", "write the kernel's log (its stderr) to this file")
	run.Flags().BoolVarP(&verbose, "verbose", "v", false, "print a line per cell as it finishes")
	outputs := &cobra.Command{
		Use:   "outputs NOTEBOOK.ipynb",
		Short: "Print the text of a notebook's outputs: streams, text/plain of results and displays, errors",
		Long: `Prints, cell by cell in order, the text of every code cell's outputs: stream text, the text/plain
form of results and displays, and errors as ENAME: EVALUE; each output ends with a newline.
Read an executed notebook's measurements with it, e.g.
  halo-shell notebook outputs executed.ipynb | grep '^verdict: '`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("notebook outputs: %w", err)
			}
			nb, err := nbrun.Parse(raw)
			if err != nil {
				return fmt.Errorf("notebook outputs: %s: %w", args[0], err)
			}
			w := cmd.OutOrStdout()
			for i, c := range nb.Cells {
				outs, err := c.CellOutputs()
				if err != nil {
					return fmt.Errorf("notebook outputs: %s: cell %d: %w", args[0], i+1, err)
				}
				for _, o := range outs {
					text := o.PlainText()
					if text == "" {
						continue
					}
					if !strings.HasSuffix(text, "\n") {
						text += "\n"
					}
					if _, err := io.WriteString(w, text); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	notebookCmd.AddCommand(run, outputs)
	rootCmd.AddCommand(notebookCmd)
}

// writeNotebook writes nb to path (stdout for "-") through a temporary file, so that a
// failed write never leaves half a notebook.
func writeNotebook(path string, nb *nbrun.Notebook, stdout io.Writer) error {
	b, err := nb.Marshal()
	if err != nil {
		return err
	}
	if path == "-" {
		_, err := stdout.Write(b)
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}
