package main

import (
	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/hf/inspect"
)

func init() {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect PATH",
		Short: "Show a checkpoint's config summary, tensors (name, dtype, shape) and parameter count",
		Long: `Inspect a Hugging Face checkpoint without loading its weights.

PATH is a .safetensors file, a model.safetensors.index.json, or a checkpoint directory
(sharded or not). When the directory has a config.json, its model type and sizes are shown
first. Then every tensor with its dtype and shape, and the parameter and byte totals.`,
		Example: `  halo-shell run inspect ./Qwen3-0.6B
  halo-shell run inspect --json model.safetensors`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := inspect.Inspect(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return r.WriteJSON(cmd.OutOrStdout())
			}
			return r.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "write the report as JSON")
	runCmd.AddCommand(cmd)
}
