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
		Use:   "make-arith-data --out DIR",
		Short: "Write a synthetic arithmetic chat dataset (train.jsonl and a disjoint eval.jsonl)",
		Long: `Writes DIR/train.jsonl and DIR/eval.jsonl: chats "What is 37+48?" -> "85" with distinct
problems drawn by seed; no held-out problem appears in the training set. With the defaults
they are the chats the quickstart generates in memory (examples/quickstart.yaml,
dataset.synthetic with seed 1), so a config with dataset: {path: DIR/train.jsonl,
eval_path: DIR/eval.jsonl} trains on the same data from files.`,
		Example: `  halo-shell run make-arith-data --out /tmp/arith
  halo-shell launch sft examples/quickstart.yaml --dataset.synthetic=null \
      --dataset.path=/tmp/arith/train.jsonl --dataset.eval_path=/tmp/arith/eval.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("make-arith-data: --out DIR is required (the directory to write train.jsonl and eval.jsonl into, e.g. --out /tmp/arith)")
			}
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
	cmd.Flags().StringVar(&out, "out", "", "output directory (required)")
	runCmd.AddCommand(cmd)
}
