package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/data"
)

func init() {
	var o data.ArithmeticOptions
	var out string
	cmd := &cobra.Command{
		Use:   "make-arith-data",
		Short: "Write a synthetic arithmetic chat dataset (train.jsonl and a disjoint eval.jsonl)",
		Long: `Writes OUT/train.jsonl and OUT/eval.jsonl: chats "What is 37+48?" -> "85" with distinct
problems drawn by seed; no held-out problem appears in the training set. The quickstart's
data under examples/quickstart/ was made with the defaults.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			train, eval, err := data.Arithmetic(o)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			for _, f := range []struct {
				name string
				recs []data.Record
			}{{"train.jsonl", train}, {"eval.jsonl", eval}} {
				path := filepath.Join(out, f.name)
				w, err := os.Create(path)
				if err != nil {
					return err
				}
				if err := data.WriteJSONL(w, f.recs); err != nil {
					w.Close()
					return fmt.Errorf("%s: %w", path, err)
				}
				if err := w.Close(); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d chats)\n", path, len(f.recs))
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&o.Seed, "seed", 1, "seed choosing the problems and the held-out set")
	cmd.Flags().IntVar(&o.MaxOperand, "max-operand", 99, "largest operand")
	cmd.Flags().IntVar(&o.Train, "train", 8000, "number of training chats")
	cmd.Flags().IntVar(&o.Eval, "eval", 200, "number of held-out chats")
	cmd.Flags().StringVar(&out, "out", "examples/quickstart", "output directory")
	runCmd.AddCommand(cmd)
}
