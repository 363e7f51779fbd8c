package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/hf/chat"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
	"github.com/halo-shell/halo-shell/engine/models"
)

// chatPrompt renders an optional system message and a user message with the chat template of
// the tokenizer directory, opening the assistant turn (add_generation_prompt).
func chatPrompt(dir, system, prompt string) (string, error) {
	tpl, err := chat.Load(dir)
	if err != nil {
		return "", err
	}
	var msgs []chat.Message
	if system != "" {
		msgs = append(msgs, chat.Message{Role: "system", Content: chat.Text(system)})
	}
	msgs = append(msgs, chat.Message{Role: "user", Content: chat.Text(prompt)})
	return tpl.Render(msgs, chat.Options{AddGenerationPrompt: true})
}

func init() {
	var (
		modelDir, adapterDir, tokDir, prompt, system, device, dtype string
		useChat, bos                                                bool
		o                                                           models.GenerateOptions
	)
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Continue a prompt with a checkpoint (greedy or sampled, with a KV cache), streaming the text",
		Long: `Loads a Hugging Face checkpoint and its tokenizer, encodes --prompt (with --chat: as a user
message rendered by the chat template with add_generation_prompt) and streams the decoded
continuation. Temperature 0 (the default) is greedy decoding; generation stops at an
end-of-sequence token of config.json or generation_config.json, at the tokenizer's
eos_token (tokenizer_config.json), or after --max-new-tokens.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tokDir := tokDir // the flag's own value stays as given
			if tokDir == "" {
				tokDir = modelDir
			}
			tok, err := tokenizer.FromDir(tokDir)
			if err != nil {
				return err
			}
			text := prompt
			if useChat {
				if text, err = chatPrompt(tokDir, system, prompt); err != nil {
					return err
				}
			}
			m, b, err := openModel(modelDir, adapterDir, device, dtype)
			if err != nil {
				return err
			}
			defer b.Close()
			defer m.Close()
			var ids []int32
			cfg := m.Config()
			if bos {
				if cfg.BOSTokenID == nil {
					return fmt.Errorf("--bos: config.json has no bos_token_id")
				}
				ids = append(ids, int32(*cfg.BOSTokenID))
			}
			for _, id := range tok.Encode(text) {
				ids = append(ids, int32(id))
			}
			if len(ids) == 0 {
				return fmt.Errorf("--prompt encodes to no tokens")
			}
			for _, id := range cfg.EOSTokenIDs {
				o.StopIDs = append(o.StopIDs, int32(id))
			}
			o.StopIDs = append(o.StopIDs, generationEOS(modelDir)...)
			o.StopIDs = append(o.StopIDs, tokenizerEOS(tokDir, tok)...)
			dec := tok.NewStreamDecoder(true)
			out := cmd.OutOrStdout()
			o.OnToken = func(id int32) error {
				s, err := dec.Step(int(id))
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(out, s)
				return err
			}
			if _, err := m.Generate(ids, o); err != nil {
				return err
			}
			_, err = fmt.Fprintln(out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelDir, "model", "", "checkpoint directory (config.json + safetensors + tokenizer)")
	f.StringVar(&adapterDir, "adapter", "", "LoRA adapter directory (PEFT's format) applied over --model")
	f.StringVar(&tokDir, "tokenizer", "", "tokenizer directory (default: --model)")
	f.StringVar(&prompt, "prompt", "", "prompt text")
	f.BoolVar(&useChat, "chat", false, "render the prompt as a user message with the chat template (add_generation_prompt)")
	f.StringVar(&system, "system", "", "with --chat: a system message before the prompt")
	f.BoolVar(&bos, "bos", false, "prepend config.json's bos_token_id")
	f.IntVar(&o.MaxNewTokens, "max-new-tokens", 64, "most tokens to generate")
	f.Float64Var(&o.Temperature, "temperature", 0, "sampling temperature; 0 = greedy")
	f.IntVar(&o.TopK, "top-k", 0, "sample among the k most likely tokens (0 = all)")
	f.Float64Var(&o.TopP, "top-p", 0, "nucleus sampling probability mass (0 = off)")
	f.Uint64Var(&o.Seed, "seed", 0, "sampling seed")
	f.StringVar(&device, "device", "cpu", "device: cpu, cuda, cuda:N or auto")
	f.StringVar(&dtype, "dtype", "f32", "compute dtype: f32 or bf16")
	_ = cmd.MarkFlagRequired("model")
	_ = cmd.MarkFlagRequired("prompt")
	runCmd.AddCommand(cmd)
}

// tokenizerEOS returns the id of tokenizer_config.json's eos_token (ChatML's <|im_end|>,
// Llama-3's <|eot_id|>), which ends a turn even when config.json names no eos_token_id.
func tokenizerEOS(dir string, tok *tokenizer.Tokenizer) []int32 {
	t, err := chat.Load(dir)
	if err != nil || t.EOS == "" {
		return nil
	}
	if id, ok := tok.TokenToID(t.EOS); ok {
		return []int32{int32(id)}
	}
	return nil
}

// generationEOS reads eos_token_id (an int or a list) from generation_config.json, if any.
func generationEOS(dir string) []int32 {
	raw, err := os.ReadFile(filepath.Join(dir, "generation_config.json"))
	if err != nil {
		return nil
	}
	var gc struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if json.Unmarshal(raw, &gc) != nil || gc.EOS == nil {
		return nil
	}
	var one int32
	if json.Unmarshal(gc.EOS, &one) == nil {
		return []int32{one}
	}
	var many []int32
	_ = json.Unmarshal(gc.EOS, &many)
	return many
}
