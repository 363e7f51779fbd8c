package train

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

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
		if errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "no chat_template") {
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

// encode renders the whole conversation and marks as trained the tokens each assistant turn
// adds: the text between the conversation before it rendered with the generation prompt and
// the conversation up to and including it (the reply and the template's end-of-turn tokens).
// The template must render prefixes of the conversation as prefixes of the text, and
// tokenizing the pieces separately must give the tokens of the whole; otherwise the record is
// refused.
func (c *chatCodec) encode(msgs []data.Message) ([]int32, []bool, error) {
	full, err := c.render(msgs, false)
	if err != nil {
		return nil, nil, err
	}
	// cuts are character offsets where the train flag changes; train[k] is the flag of piece k.
	var cuts []int
	var train []bool
	pos := 0
	for i, m := range msgs {
		if m.Role != "assistant" {
			continue
		}
		before, err := c.render(msgs[:i], true)
		if err != nil {
			return nil, nil, err
		}
		upto, err := c.render(msgs[:i+1], false)
		if err != nil {
			return nil, nil, err
		}
		if !strings.HasPrefix(upto, before) || !strings.HasPrefix(full, upto) || len(before) < pos {
			return nil, nil, fmt.Errorf("message %d: the chat template does not render the conversation's prefixes as prefixes of its text, so assistant tokens cannot be located", i)
		}
		cuts = append(cuts, len(before), len(upto))
		train = append(train, false, true)
		pos = len(upto)
	}
	var ids []int32
	var mask []bool
	start := 0
	for k, end := range cuts {
		piece := c.ids(full[start:end])
		ids = append(ids, piece...)
		for range piece {
			mask = append(mask, train[k])
		}
		start = end
	}
	rest := c.ids(full[start:])
	ids = append(ids, rest...)
	mask = append(mask, make([]bool, len(rest))...)
	if whole := c.ids(full); !slices.Equal(whole, ids) {
		return nil, nil, errors.New("tokenizing the assistant turns apart from the rest changes the tokens; the chat template's turn boundaries split a token")
	}
	return ids, mask, nil
}

// prompt renders msgs with the generation prompt and tokenizes it.
func (c *chatCodec) prompt(msgs []data.Message) ([]int32, error) {
	s, err := c.render(msgs, true)
	if err != nil {
		return nil, err
	}
	return c.ids(s), nil
}
