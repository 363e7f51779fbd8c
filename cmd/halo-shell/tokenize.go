package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/hf/chat"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
)

func init() {
	var dir string
	var withChat, genPrompt bool
	cmd := &cobra.Command{
		Use:     "tokenize --tokenizer DIR",
		Aliases: []string{"tokenise"},
		Short:   "Encode text (or chats) read from stdin as token ids, one JSON line per input line",
		Long: `Encode text with a Hugging Face tokenizer.json, token for token as Hugging Face's
tokenizers does with add_special_tokens=False (special tokens written in the text, such as
<|im_start|>, are recognised).

Each stdin line is one JSON string; each stdout line is the JSON array of its token ids.
With --chat each line is a JSON list of messages ({"role": ..., "content": ...}); it is
rendered with the chat template of DIR/tokenizer_config.json (as transformers'
apply_chat_template does) and then encoded. A bad line stops the command with a non-zero
exit status and "line N: ..." on stderr; the lines before it have been written.`,
		Example: `  echo '"Hello world"' | halo-shell run tokenize --tokenizer ./Qwen3-0.6B
  echo '[{"role":"user","content":"Hi"}]' | halo-shell run tokenize --tokenizer ./Qwen3-0.6B --chat`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return fmt.Errorf("tokenize: --tokenizer DIR is required (a directory holding tokenizer.json)")
			}
			tok, err := tokenizer.FromDir(dir)
			if err != nil {
				return err
			}
			var toText func([]byte) (string, error)
			if withChat {
				tmpl, err := chat.Load(dir)
				if err != nil {
					return err
				}
				opts := chat.Options{AddGenerationPrompt: genPrompt}
				toText = func(line []byte) (string, error) {
					var msgs []chat.Message
					if err := json.Unmarshal(line, &msgs); err != nil {
						return "", fmt.Errorf("want a JSON list of messages: %v", err)
					}
					return tmpl.Render(msgs, opts)
				}
			}
			return tok.EncodeLines(cmd.InOrStdin(), cmd.OutOrStdout(), toText)
		},
	}
	cmd.Flags().StringVar(&dir, "tokenizer", "", "directory with tokenizer.json (and tokenizer_config.json for --chat)")
	cmd.Flags().BoolVar(&withChat, "chat", false, "each line is a JSON list of chat messages, rendered with the chat template")
	cmd.Flags().BoolVar(&genPrompt, "add-generation-prompt", false, "with --chat, end with the header that opens an assistant turn")
	runCmd.AddCommand(cmd)
}
