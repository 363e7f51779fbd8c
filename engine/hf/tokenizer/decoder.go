package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// decoder turns a list of token strings into a list of strings whose concatenation is the
// decoded text (Hugging Face's Decoder::decode_chain).
type decoder interface {
	decodeChain(tokens []string) []string
}

type byteLevelDecoder struct{}

func (byteLevelDecoder) decodeChain(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		buf = byteLevelDecodeToken(buf, t)
	}
	return []string{lossyUTF8(buf)}
}

type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decodeChain(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		s := string(pending)
		if strings.ToValidUTF8(s, "") == s {
			out = append(out, s)
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if b, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				pending = append(pending, byte(b))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		r := []rune(t)
		lo := 0
		for lo < d.start && lo < len(r) && r[lo] == d.content {
			lo++
		}
		hi := len(r)
		for n := 0; n < d.stop && hi > lo && r[hi-1] == d.content; n++ {
			hi--
		}
		out[i] = string(r[lo:hi])
	}
	return out
}

type replaceDecoder struct {
	m       matcher
	content string
}

func (d replaceDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		// Decode has no error to return: a pattern past its match time leaves the rest of
		// the token as it is (compileRegex has refused the patterns that backtrack on its
		// probe texts).
		out[i], _ = replaceAll(t, d.m, d.content)
	}
	return out
}

// metaspaceDecoder turns the replacement character back into spaces; in the first token
// it drops them (all of them, as Hugging Face does) unless the scheme is never.
type metaspaceDecoder struct{ st metaspaceStep }

func (d metaspaceDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		if i == 0 && d.st.scheme != prependNever {
			out[i] = strings.ReplaceAll(t, d.st.repl, "")
		} else {
			out[i] = strings.ReplaceAll(t, d.st.repl, " ")
		}
	}
	return out
}

type sequenceDecoder []decoder

func (seq sequenceDecoder) decodeChain(tokens []string) []string {
	for _, d := range seq {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

func parseDecoder(raw json.RawMessage, path string, depth int) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, fmt.Errorf("%s: Sequence nested deeper than %d", path, maxNesting)
	}
	var head struct {
		Type     string            `json:"type"`
		Decoders []json.RawMessage `json:"decoders"`
		Pattern  *patternJSON      `json:"pattern"`
		Content  *string           `json:"content"`
		Start    int               `json:"start"`
		Stop     int               `json:"stop"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch head.Type {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Metaspace":
		st, err := parseMetaspace(raw, path)
		if err != nil {
			return nil, err
		}
		return metaspaceDecoder{st}, nil
	case "Strip":
		if head.Content == nil || len([]rune(*head.Content)) != 1 {
			return nil, fmt.Errorf("%s: Strip needs a one-character \"content\"", path)
		}
		if head.Start < 0 || head.Stop < 0 {
			return nil, fmt.Errorf("%s: Strip start and stop must not be negative", path)
		}
		return stripDecoder{[]rune(*head.Content)[0], head.Start, head.Stop}, nil
	case "Replace":
		m, err := head.Pattern.compile()
		if err != nil {
			return nil, fmt.Errorf("%s: Replace: %w", path, err)
		}
		if head.Content == nil {
			return nil, fmt.Errorf("%s: Replace has no \"content\" string", path)
		}
		return replaceDecoder{m, *head.Content}, nil
	case "Sequence":
		var seq sequenceDecoder
		for i, r := range head.Decoders {
			d, err := parseDecoder(r, fmt.Sprintf("%s.decoders[%d]", path, i), depth+1)
			if err != nil {
				return nil, err
			}
			if d != nil {
				seq = append(seq, d)
			}
		}
		return seq, nil
	case "":
		return nil, fmt.Errorf("%s: no \"type\"", path)
	}
	return nil, fmt.Errorf("%s: decoder type %q is not supported; supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence", path, head.Type)
}
