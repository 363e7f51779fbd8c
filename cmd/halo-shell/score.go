package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/train"
)

func init() {
	var (
		modelDir, tokDir, device, dtype string
		texts, prompts, responses       []string
		useChat                         bool
	)
	cmd := &cobra.Command{
		Use:   "score",
		Short: "Score texts with a reward model (a sequence-classification checkpoint) as JSON",
		Long: `Loads a sequence-classification checkpoint (for instance one written by
"halo-shell launch reward": config.json naming a *ForSequenceClassification class, score.weight)
and prints {"scores": [[...], ...]}: one row of num_labels scores per input, read at the last
token that is not pad_token_id, as transformers' AutoModelForSequenceClassification does.

Inputs are --text (as given, repeatable), or --prompt and --response pairs (repeatable, as many
of each), tokenized as the reward model was trained: the prompt, then the response and the eos
token; with --chat a user message and an assistant reply rendered by the chat template.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Repeatable flags accumulate across runs of the command in one process.
			defer func() { texts, prompts, responses, useChat = nil, nil, nil, false }()
			if len(texts) == 0 && len(prompts) == 0 {
				return fmt.Errorf("score: give --text, or --prompt and --response pairs")
			}
			if len(prompts) != len(responses) {
				return fmt.Errorf("score: %d --prompt for %d --response: give them in pairs", len(prompts), len(responses))
			}
			dir := tokDir
			if dir == "" {
				dir = modelDir
			}
			var seqs [][]int32
			if len(texts) > 0 {
				tok, err := tokenizer.FromDir(dir)
				if err != nil {
					return err
				}
				for _, s := range texts {
					var ids []int32
					for _, id := range tok.Encode(s) {
						ids = append(ids, int32(id))
					}
					seqs = append(seqs, ids)
				}
			}
			for i := range prompts {
				p, r := data.Turns{Text: prompts[i]}, data.Turns{Text: responses[i]}
				if useChat {
					p = data.Turns{Chat: true, Messages: []data.Message{{Role: "user", Content: prompts[i]}}}
					r = data.Turns{Chat: true, Messages: []data.Message{{Role: "assistant", Content: responses[i]}}}
				}
				ids, err := train.EncodeCompletion(dir, p, r)
				if err != nil {
					return err
				}
				seqs = append(seqs, ids)
			}
			m, b, err := openModel(modelDir, "", device, dtype)
			if err != nil {
				return err
			}
			defer b.Close()
			defer m.Close()
			if !m.IsClassifier() {
				return fmt.Errorf("score: %s is a causal LM (config.json architectures %v): give a sequence-classification checkpoint, e.g. the output_dir of halo-shell launch reward", modelDir, m.Config().Architectures)
			}
			var batch models.Batch
			batch.DocStarts = []int32{0}
			for i, s := range seqs {
				if len(s) == 0 {
					return fmt.Errorf("score: input %d encodes to no tokens", i+1)
				}
				batch.Tokens = append(batch.Tokens, s...)
				batch.DocStarts = append(batch.DocStarts, int32(len(batch.Tokens)))
			}
			scores, err := m.Scores(batch)
			if err != nil {
				return err
			}
			L := m.Arch.NumLabels
			rows := make([][]json.Number, len(seqs))
			for i := range rows {
				for _, v := range scores[i*L : (i+1)*L] {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						return fmt.Errorf("score: input %d scores %v: the checkpoint or the forward pass is not finite", i+1, v)
					}
					rows[i] = append(rows[i], json.Number(strconv.FormatFloat(float64(v), 'g', -1, 32)))
				}
			}
			out, err := json.Marshal(map[string]any{"scores": rows})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), string(out))
			return err
		},
	}
	cmd.Flags().StringVar(&modelDir, "model", "", "sequence-classification checkpoint directory (config.json + safetensors)")
	cmd.Flags().StringVar(&tokDir, "tokenizer", "", "tokenizer directory (default: --model)")
	cmd.Flags().StringArrayVar(&texts, "text", nil, "a text to score as given (repeatable)")
	cmd.Flags().StringArrayVar(&prompts, "prompt", nil, "a prompt (repeatable; pairs with --response)")
	cmd.Flags().StringArrayVar(&responses, "response", nil, "a response to the prompt of the same rank (repeatable)")
	cmd.Flags().BoolVar(&useChat, "chat", false, "render each prompt and response as a user and an assistant message with the chat template")
	cmd.Flags().StringVar(&device, "device", "cpu", "device: cpu, cuda, cuda:N or auto")
	cmd.Flags().StringVar(&dtype, "dtype", "f32", "compute dtype: f32 or bf16")
	_ = cmd.MarkFlagRequired("model")
	runCmd.AddCommand(cmd)
}
