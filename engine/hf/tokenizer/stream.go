package tokenizer

import (
	"fmt"
	"strings"
)

// StreamDecoder decodes ids one at a time, as they are generated, and yields text only
// once it is complete: bytes of a character split over several tokens are held back until
// the character is whole. It equals Hugging Face tokenizers' DecodeStream.
//
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	ids         []int
	prefix      string
	prefixIndex int
}

// NewStreamDecoder starts a streaming decode; skipSpecial drops special tokens as Decode does.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: skipSpecial}
}

// Step adds one id and returns the text it completes, which may be empty (the id ends in
// the middle of a character, or decodes to nothing).
func (d *StreamDecoder) Step(id int) (string, error) {
	if d.prefix == "" && len(d.ids) > 0 {
		p := d.t.Decode(d.ids, d.skipSpecial)
		if !strings.HasSuffix(p, "\uFFFD") {
			d.prefix = p
			d.prefixIndex = len(d.ids)
		}
	}
	d.ids = append(d.ids, id)
	s := d.t.Decode(d.ids, d.skipSpecial)
	if len(s) <= len(d.prefix) || strings.HasSuffix(s, "\uFFFD") {
		return "", nil
	}
	if !strings.HasPrefix(s, d.prefix) {
		return "", fmt.Errorf("tokenizer: stream decode: token %d changed text already returned (%q is not a prefix of %q)", id, d.prefix, s)
	}
	text := s[len(d.prefix):]
	newIndex := len(d.ids) - d.prefixIndex
	d.ids = append(d.ids[:0], d.ids[d.prefixIndex:]...)
	d.prefix = d.t.Decode(d.ids, d.skipSpecial)
	d.prefixIndex = newIndex
	return text, nil
}
