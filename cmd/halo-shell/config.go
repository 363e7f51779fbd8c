package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

func init() {
	var (
		preset  string
		sets    []string
		out     string
		summary bool
	)
	cmd := &cobra.Command{
		Use:   "config [PATH]",
		Short: "Read a config.json (or a preset) and write it as transformers 5.17 writes it",
		Long: `Read a Hugging Face config.json (a file or a checkpoint directory), resolve Hugging Face's
defaults, check it, and write it the way transformers 5.17 save_pretrained does: rope_parameters,
dtype and the family's full key set. Files written by transformers 4.x (rope_theta,
rope_scaling, torch_dtype) are converted. With --preset FAMILY/NAME a built-in configuration is
used instead of PATH. --set key=value changes config.json keys (the value is JSON; a bare word is
a string). --summary prints shapes, parameter counts, RoPE and MoE layout instead.

Keys that are not understood are kept and listed on stderr.`,
		Example: `  halo-shell run config ./Qwen3-0.6B
  halo-shell run config --preset qwen3/tiny --set vocab_size=1000 --out ./tiny
  halo-shell run config --summary ./Mixtral-8x7B-v0.1/config.json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var c *config.Config
			var err error
			switch {
			case preset != "" && len(args) == 0:
				family, name, ok := strings.Cut(preset, "/")
				if !ok {
					return fmt.Errorf("--preset %q: write FAMILY/NAME, e.g. qwen3/tiny (families: %s)", preset, strings.Join(config.Families(), ", "))
				}
				c, err = config.Preset(family, name)
			case preset == "" && len(args) == 1:
				c, err = config.Load(args[0])
			default:
				return fmt.Errorf("give either PATH or --preset FAMILY/NAME")
			}
			if err != nil {
				return err
			}
			if len(sets) > 0 {
				over := map[string]any{}
				for _, s := range sets {
					k, v, ok := strings.Cut(s, "=")
					if !ok || k == "" {
						return fmt.Errorf("--set %q: write key=value", s)
					}
					var val any
					if json.Unmarshal([]byte(v), &val) != nil {
						val = v
					}
					over[k] = val
				}
				if c, err = c.Override(over, "--set"); err != nil {
					return err
				}
			}
			if u := c.Unknown(); len(u) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "halo-shell: config: keys not understood (kept): %s\n", strings.Join(u, ", "))
			}
			if summary {
				return c.WriteSummary(cmd.OutOrStdout())
			}
			if out != "" {
				if st, err := os.Stat(out); err != nil && os.IsNotExist(err) && !strings.HasSuffix(out, ".json") {
					if err := os.MkdirAll(out, 0o755); err != nil {
						return err
					}
				} else if err == nil && !st.IsDir() && !strings.HasSuffix(out, ".json") {
					return fmt.Errorf("--out %s: not a directory or .json file", out)
				}
				return c.Write(out)
			}
			data, err := c.MarshalJSON()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	}
	cmd.Flags().StringVar(&preset, "preset", "", "use a built-in configuration FAMILY/NAME (e.g. qwen3/tiny, llama/llama-3.2-1b)")
	cmd.Flags().StringArrayVar(&sets, "set", nil, "set a config.json key: key=JSON value (repeatable)")
	cmd.Flags().StringVar(&out, "out", "", "write config.json to this file or directory instead of stdout")
	cmd.Flags().BoolVar(&summary, "summary", false, "print a summary (shapes, parameters, RoPE, MoE) instead of the file")
	runCmd.AddCommand(cmd)
}
