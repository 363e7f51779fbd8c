package train

import (
	"errors"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/hf/chat"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
)

// chatCodec renders conversations with the tokenizer's chat template and marks the assistant
// tokens for SFT.
type chatCodec struct {
	tmpl *chat.Template
	tok  *tokenizer.Tokenizer
}

// loadChat loads dir's chat template; nil (and no error) when the tokenizer has none.
func loadChat(dir string, tok *tokenizer.Tokenizer) (*chatCodec, error) {
	t, err := chat.Load(dir)
	if err != nil {
		if errors.Is(err, chat.ErrNoTemplate) {
			return nil, nil
		}
		return nil, err
	}
	if len(t.Sources) == 0 {
		return nil, nil
	}
	return &chatCodec{tmpl: t, tok: tok}, nil
}

func toChat(msgs []data.Message) []chat.Message {
	out := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		out[i] = chat.Message{Role: m.Role, Content: chat.Text(m.Content)}
	}
	return out
}

func (c *chatCodec) render(msgs []data.Message, gen bool) (string, error) {
	return c.tmpl.Render(toChat(msgs), chat.Options{AddGenerationPrompt: gen})
}

func (c *chatCodec) ids(s string) []int32 {
	v := c.tok.Encode(s)
	out := make([]int32, len(v))
	for i, id := range v {
		out[i] = int32(id)
	}
	return out
}

// encode renders the conversation and marks the tokens of assistant output (each reply up to
// and including its end-of-turn marker) as trained, with the chat package's mask.
func (c *chatCodec) encode(msgs []data.Message) ([]int32, []bool, error) {
	ids, mask, err := c.tmpl.Encode(c.tok, toChat(msgs), chat.Options{})
	if err != nil {
		return nil, nil, err
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, mask, nil
}

// prompt renders msgs with the generation prompt and tokenizes it.
func (c *chatCodec) prompt(msgs []data.Message) ([]int32, error) {
	s, err := c.render(msgs, true)
	if err != nil {
		return nil, err
	}
	return c.ids(s), nil
}
