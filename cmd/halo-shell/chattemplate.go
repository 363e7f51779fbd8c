package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/hf/chat"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
)

func init() {
	var dir, name, kwargs string
	var genPrompt, spans, mask bool
	cmd := &cobra.Command{
		Use:   "chat-template --tokenizer DIR",
		Short: "Render conversations read from stdin with a chat template (and show the assistant spans SFT trains on)",
		Long: `Render conversations with the chat template of a tokenizer directory
(chat_template.jinja, or the chat_template of tokenizer_config.json), exactly as
transformers' apply_chat_template(tokenize=False) does.

Each stdin line is a JSON list of messages, or an object {"messages": [...], "tools": [...]}.
Each stdout line is the rendered text as a JSON string; with --spans, an object
{"text": ..., "spans": [{"message", "start", "end", "text"}]} giving the byte ranges of
assistant output; with --mask (DIR must hold tokenizer.json), {"ids": [...], "mask": [...]}:
the token ids and which of them supervised fine-tuning trains on. A bad line stops the command
with a non-zero exit status and "line N: ..." on stderr.`,
		Example: `  echo '[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}]' | halo-shell run chat-template --tokenizer ./Qwen3-0.6B --spans
  echo '[{"role":"user","content":"Hi"}]' | halo-shell run chat-template --tokenizer ./Qwen3-0.6B --add-generation-prompt --kwargs '{"enable_thinking": false}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return fmt.Errorf("chat-template: --tokenizer DIR is required (a directory holding tokenizer_config.json or chat_template.jinja)")
			}
			tmpl, err := chat.Load(dir)
			if err != nil {
				return err
			}
			opts := chat.Options{AddGenerationPrompt: genPrompt, TemplateName: name}
			if kwargs != "" {
				var kw map[string]json.RawMessage
				if err := json.Unmarshal([]byte(kwargs), &kw); err != nil {
					return fmt.Errorf("chat-template: --kwargs must be a JSON object such as '{\"enable_thinking\": false}': %v", err)
				}
				opts.Kwargs = map[string]any{}
				for k, v := range kw {
					opts.Kwargs[k] = v
				}
			}
			if mask {
				if spans {
					return fmt.Errorf("chat-template: choose --spans or --mask, not both")
				}
				tok, err := tokenizer.FromDir(dir)
				if err != nil {
					return err
				}
				return tmpl.EncodeLines(tok, cmd.InOrStdin(), cmd.OutOrStdout(), opts)
			}
			return tmpl.RenderLines(cmd.InOrStdin(), cmd.OutOrStdout(), opts, spans)
		},
	}
	cmd.Flags().StringVar(&dir, "tokenizer", "", "directory with tokenizer_config.json or chat_template.jinja")
	cmd.Flags().BoolVar(&genPrompt, "add-generation-prompt", false, "end with the header that opens an assistant turn")
	cmd.Flags().BoolVar(&spans, "spans", false, "write the text with the byte spans of assistant output")
	cmd.Flags().BoolVar(&mask, "mask", false, "write token ids and the assistant mask (needs DIR/tokenizer.json)")
	cmd.Flags().StringVar(&name, "template", "", "name of the template to use when the tokenizer has several (default: tool_use with tools, else default)")
	cmd.Flags().StringVar(&kwargs, "kwargs", "", "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'")
	runCmd.AddCommand(cmd)
}
