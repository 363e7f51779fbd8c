package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// baseSideFiles are the files of a checkpoint directory besides its weights and config.json
// that merge-lora copies to the merged checkpoint, so that it is complete on its own.
var baseSideFiles = []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json",
	"special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
	"tokenizer.model", "added_tokens.json"}

func init() {
	var baseDir, adapterDir, outDir, device, dtype string
	cmd := &cobra.Command{
		Use:   "merge-lora",
		Short: "Fold a LoRA adapter into its base and write the merged Hugging Face checkpoint",
		Long: `Loads --base, applies the adapter in --adapter (PEFT's adapter_config.json +
adapter_model.safetensors) and writes to --out a checkpoint whose every adapted weight is
W + scale * B @ A (scale = lora_alpha/r, or lora_alpha/sqrt(r) with use_rslora), computed in
fp32 and stored in the base's dtype (config.json's dtype; --dtype overrides). Tokenizer and
generation files of the base are copied beside it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if outDir == baseDir {
				return fmt.Errorf("merge-lora: --out %s is the base directory; write the merged checkpoint somewhere else", outDir)
			}
			cfg, err := config.Load(baseDir)
			if err != nil {
				return err
			}
			var dt tensor.DType
			switch {
			case dtype != "":
				if dt, err = tensor.ParseDType(dtype); err != nil {
					return fmt.Errorf("--dtype: %w", err)
				}
			case cfg.DType == "bfloat16":
				dt = tensor.BF16
			case cfg.DType == "float16":
				dt = tensor.F16
			default:
				dt = tensor.F32
			}
			b, note, err := backend.Resolve(device)
			if err != nil {
				return err
			}
			defer b.Close()
			if note != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "halo-shell:", note)
			}
			m, err := models.Load(baseDir, b, models.Options{DType: tensor.F32})
			if err != nil {
				return err
			}
			defer m.Close()
			if err := m.LoadAdapter(adapterDir); err != nil {
				return err
			}
			n := len(m.LoRA().Modules)
			if err := m.MergeLoRA(); err != nil {
				return err
			}
			if err := m.Save(outDir, models.SaveOptions{DType: dt}); err != nil {
				return err
			}
			for _, name := range baseSideFiles {
				if err := copyIfExists(filepath.Join(baseDir, name), filepath.Join(outDir, name)); err != nil {
					return fmt.Errorf("merge-lora: %w", err)
				}
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "merged %d adapted modules into %s (%s)\n", n, outDir, dt)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&baseDir, "base", "", "base checkpoint directory (config.json + safetensors)")
	f.StringVar(&adapterDir, "adapter", "", "LoRA adapter directory (PEFT's format)")
	f.StringVar(&outDir, "out", "", "directory for the merged checkpoint")
	f.StringVar(&device, "device", "cpu", "device: cpu, cuda, cuda:N or auto")
	f.StringVar(&dtype, "dtype", "", "stored dtype of the merged weights: f32, bf16 or f16 (default: the base's)")
	for _, n := range []string{"base", "adapter", "out"} {
		_ = cmd.MarkFlagRequired(n)
	}
	runCmd.AddCommand(cmd)
}

func copyIfExists(src, dst string) error {
	in, err := os.Open(src)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
