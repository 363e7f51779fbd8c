package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func init() {
	var s models.InitSpec
	var dtype string
	cmd := &cobra.Command{
		Use:   "init-model",
		Short: "Write a randomly initialised Hugging Face checkpoint of a family preset",
		Long: `Builds a model from a config preset (--arch, --preset), sizes its vocabulary to the tokenizer,
initialises it as transformers does (normal(0, initializer_range) for matrices, ones for norms,
zeros for biases) and writes config.json, safetensors weights and the tokenizer files to --out.
--set key=value overrides any config.json key (repeatable).`,
		Example: `  halo-shell run init-model --arch qwen3 --preset tiny --tokenizer examples/quickstart/tokenizer --out /tmp/tiny
  halo-shell run init-model --arch llama --preset tiny --tokenizer DIR --out DIR --set num_hidden_layers=4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dt, err := tensor.ParseDType(dtype)
			if err != nil {
				return fmt.Errorf("--dtype: %w", err)
			}
			s.DType = dt
			b, err := backend.Open("cpu")
			if err != nil {
				return err
			}
			defer b.Close()
			cfg, err := models.InitCheckpoint(b, s)
			if err != nil {
				return err
			}
			m, err := models.New(cfg, b, models.Options{})
			if err != nil {
				return err
			}
			defer m.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s (%s preset), %d parameters, vocab %d, %d layers, hidden %d\n",
				s.OutDir, cfg.ModelType, s.Preset, m.NumParams(), cfg.VocabSize, cfg.NumHiddenLayers, cfg.HiddenSize)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&s.Arch, "arch", "", "model family (model_type): "+fmt.Sprint(models.Families()))
	f.StringVar(&s.Preset, "preset", "tiny", "config preset of the family (tiny, qwen3-0.6b, llama-3.2-1b, ...)")
	f.StringVar(&s.TokenizerDir, "tokenizer", "", "tokenizer directory (tokenizer.json); sets vocab_size and is copied to --out")
	f.StringVar(&s.OutDir, "out", "", "output checkpoint directory")
	f.Uint64Var(&s.Seed, "seed", 0, "random seed")
	f.StringArrayVar(&s.Set, "set", nil, "config.json override key=value (repeatable)")
	f.StringVar(&dtype, "dtype", "f32", "stored weight dtype: f32 or bf16")
	_ = cmd.MarkFlagRequired("arch")
	_ = cmd.MarkFlagRequired("out")
	runCmd.AddCommand(cmd)
}
