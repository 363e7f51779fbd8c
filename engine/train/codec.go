package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
)

// textCodec turns records into token ids with train masks, and chats into generation prompts:
// the tokenizer plus tokenizer_config.json (eos token, chat template).
type textCodec struct {
	dir  string
	tok  *tokenizer.Tokenizer // nil when a run on pre-tokenized data has no tokenizer
	eos  int32                // -1 when the tokenizer config names none
	stop []int32
	chat *chatCodec // nil when tokenizer_config.json has no chat template
}

// tokenizerConfig is the part of tokenizer_config.json the trainer reads.
type tokenizerConfig struct {
	EOSToken     json.RawMessage `json:"eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// tokenString reads a special-token entry: a string or {"content": "..."}.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return ""
}

// loadCodec reads the tokenizer in dir. With optional (pre-tokenized data), a dir without
// tokenizer.json gives a codec without a tokenizer, which encodes tokens records only.
func loadCodec(dir string, optional bool) (*textCodec, error) {
	if optional {
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); errors.Is(err, os.ErrNotExist) {
			return &textCodec{dir: dir, eos: -1}, nil
		}
	}
	tok, err := tokenizer.FromDir(dir)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	c := &textCodec{dir: dir, tok: tok, eos: -1}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("train: %w", err)
	}
	if err == nil {
		var tc tokenizerConfig
		if err := json.Unmarshal(raw, &tc); err != nil {
			return nil, fmt.Errorf("train: %s: %v", cfgPath, err)
		}
		if s := tokenString(tc.EOSToken); s != "" {
			id, ok := tok.TokenToID(s)
			if !ok {
				return nil, fmt.Errorf("train: %s: eos_token %q is not in tokenizer.json", cfgPath, s)
			}
			c.eos = int32(id)
		}
		if c.chat, err = loadChat(dir, tok); err != nil {
			return nil, fmt.Errorf("train: %s: %w", cfgPath, err)
		}
	}
	if c.eos >= 0 {
		c.stop = append(c.stop, c.eos)
	}
	for _, s := range []string{"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"} {
		if id, ok := tok.TokenToID(s); ok && int32(id) != c.eos {
			c.stop = append(c.stop, int32(id))
		}
	}
	return c, nil
}

// vocabSize is the tokenizer's vocabulary size, 0 without a tokenizer.
func (c *textCodec) vocabSize() int {
	if c.tok == nil {
		return 0
	}
	return c.tok.VocabSize()
}

// needTokenizer says why a codec without a tokenizer cannot do what was asked.
func (c *textCodec) needTokenizer(what string) error {
	if c.tok != nil {
		return nil
	}
	return fmt.Errorf("%s needs a tokenizer, and %s has no tokenizer.json: set tokenizer_name_or_path", what, c.dir)
}

func (c *textCodec) ids(s string) []int32 {
	ids := c.tok.Encode(s)
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// idsErr is ids that fails when a regular expression of the tokenizer runs past its match
// time on s, so that a training document is refused rather than split differently.
func (c *textCodec) idsErr(s string) ([]int32, error) {
	ids, err := c.tok.EncodeErr(s)
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, nil
}

func (c *textCodec) decode(ids []int32) string {
	v := make([]int, len(ids))
	for i, id := range ids {
		v[i] = int(id)
	}
	return c.tok.Decode(v, true)
}

// encoder maps records to documents for a method: pretrain trains on every token; sft on the
// assistant replies of chats (the chat template's mask), the completion of prompt/completion
// records, and every token of plain text. Text and completions end with the eos token.
// Tokens records are taken as they are, every token a target, whatever the method; their ids
// must be below vocab (the model's vocab_size).
func (c *textCodec) encoder(method string, vocab int) data.Encoder {
	return func(r data.Record) (data.Document, error) {
		var d data.Document
		if r.Kind == data.FormatTokens {
			for i, id := range r.IDs {
				if int(id) >= vocab {
					return d, fmt.Errorf("input_ids[%d] = %d is not below the model's vocab_size %d", i, id, vocab)
				}
			}
			d.Tokens = r.IDs
			d.Train = make([]bool, len(r.IDs))
			for i := range d.Train {
				d.Train[i] = true
			}
			return d, nil
		}
		if err := c.needTokenizer("a " + string(r.Kind) + " record"); err != nil {
			return d, err
		}
		var encErr error
		add := func(ids []int32, train bool) {
			d.Tokens = append(d.Tokens, ids...)
			for range ids {
				d.Train = append(d.Train, train)
			}
		}
		text := func(s string) []int32 {
			ids, err := c.idsErr(s)
			if encErr == nil {
				encErr = err
			}
			return ids
		}
		eos := func(train bool) {
			if c.eos >= 0 {
				add([]int32{c.eos}, train)
			}
		}
		switch r.Kind {
		case data.FormatText:
			add(text(r.Text), true)
			eos(true)
		case data.FormatPromptCompletion:
			add(text(r.Prompt), method == MethodPretrain)
			add(text(r.Completion), true)
			eos(true)
		case data.FormatMessages:
			if c.chat == nil {
				return d, fmt.Errorf("chat record but %s/tokenizer_config.json has no chat_template", c.dir)
			}
			ids, mask, err := c.chat.encode(r.Messages)
			if err != nil {
				return d, err
			}
			d.Tokens, d.Train = ids, mask
			if method == MethodPretrain {
				for i := range d.Train {
					d.Train[i] = true
				}
			}
		default:
			return d, fmt.Errorf("record of unknown kind %q", r.Kind)
		}
		if encErr != nil {
			return d, encErr
		}
		if len(d.Tokens) == 0 {
			return d, errors.New("record has no tokens")
		}
		return d, nil
	}
}

// generationPrompt renders a chat with the generation prompt appended (the assistant turn
// opened), as token ids.
func (c *textCodec) generationPrompt(msgs []data.Message) ([]int32, error) {
	if err := c.needTokenizer("a chat prompt"); err != nil {
		return nil, err
	}
	if c.chat == nil {
		return nil, fmt.Errorf("%s/tokenizer_config.json has no chat_template", c.dir)
	}
	return c.chat.prompt(msgs)
}
