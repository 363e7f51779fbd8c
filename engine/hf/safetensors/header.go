package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxHeaderSize is the largest JSON header accepted, in bytes. It is the reference
// implementation's limit.
const MaxHeaderSize = 100_000_000

// MaxRank is the largest number of dimensions a tensor may have. The format sets no limit;
// this one bounds what a hostile header can make the reader allocate.
const MaxRank = 64

// metadataKey is the header key that holds the free-form string map.
const metadataKey = "__metadata__"

// entry is one tensor as the header describes it.
type entry struct {
	name       string
	dtype      DType
	shape      []int
	begin, end int64 // byte offsets into the data section, end exclusive
}

// header is a parsed and validated safetensors header.
type header struct {
	metadata map[string]string // nil when the header has no __metadata__
	entries  []entry           // sorted by offset; they tile [0, dataLen) exactly
	dataLen  int64             // bytes of tensor data the header describes
}

// parseHeader parses the JSON header text of file and checks that its tensors are well formed
// and tile the data section contiguously from offset 0, as the reference implementation
// requires (no gaps, no overlaps). The data section's actual length is checked by the caller.
func parseHeader(file string, text []byte) (*header, error) {
	if !utf8.Valid(text) {
		return nil, formatErr(file, "", "header is not valid UTF-8")
	}
	p := &headerParser{file: file, text: text, dec: json.NewDecoder(bytes.NewReader(text))}
	p.dec.UseNumber()
	h, err := p.parse()
	if err != nil {
		return nil, err
	}
	if err := h.validate(file); err != nil {
		return nil, err
	}
	return h, nil
}

type headerParser struct {
	file string
	text []byte
	dec  *json.Decoder
}

// syntax turns a decoder error into a FormatError that says where in the header it happened.
func (p *headerParser) syntax(tensor string, err error) error {
	if errors.Is(err, io.EOF) {
		err = errors.New("unexpected end of JSON")
	}
	return formatErr(p.file, tensor, "invalid header JSON at byte %d: %v", p.dec.InputOffset(), err)
}

func (p *headerParser) token(tensor string) (json.Token, error) {
	tok, err := p.dec.Token()
	if err != nil {
		return nil, p.syntax(tensor, err)
	}
	return tok, nil
}

func (p *headerParser) expectDelim(tensor string, want json.Delim, what string) error {
	tok, err := p.token(tensor)
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return formatErr(p.file, tensor, "%s must be a JSON %s, found %s", what, delimKind(want), describeToken(tok))
	}
	return nil
}

func delimKind(d json.Delim) string {
	if d == '[' {
		return "array"
	}
	return "object"
}

func describeToken(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return "an object"
		case '[':
			return "an array"
		}
		return fmt.Sprintf("%q", string(t))
	case string:
		return fmt.Sprintf("the string %q", truncate(t, 40))
	case json.Number:
		return "the number " + truncate(string(t), 40)
	case bool:
		return strconv.FormatBool(t)
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", tok)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func (p *headerParser) parse() (*header, error) {
	if err := p.expectDelim("", '{', "the header"); err != nil {
		return nil, err
	}
	h := &header{}
	seen := make(map[string]bool)
	sawMetadata := false
	for p.dec.More() {
		tok, err := p.token("")
		if err != nil {
			return nil, err
		}
		key := tok.(string) // object keys are always strings
		if key == metadataKey {
			if sawMetadata {
				return nil, formatErr(p.file, "", "header has %s twice", metadataKey)
			}
			sawMetadata = true
			if h.metadata, err = p.parseMetadata(); err != nil {
				return nil, err
			}
			continue
		}
		if seen[key] {
			return nil, formatErr(p.file, key, "the header names this tensor twice")
		}
		seen[key] = true
		e, err := p.parseEntry(key)
		if err != nil {
			return nil, err
		}
		h.entries = append(h.entries, e)
	}
	if _, err := p.token(""); err != nil { // the closing brace
		return nil, err
	}
	off := p.dec.InputOffset()
	if rest := p.text[off:]; len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return nil, formatErr(p.file, "", "unexpected data after the header's JSON object at byte %d", off)
	}
	return h, nil
}

func (p *headerParser) parseMetadata() (map[string]string, error) {
	tok, err := p.token("")
	if err != nil {
		return nil, err
	}
	if tok == nil { // "__metadata__": null is the same as no metadata
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, formatErr(p.file, "", "%s must be a JSON object of strings, found %s", metadataKey, describeToken(tok))
	}
	m := make(map[string]string)
	for p.dec.More() {
		tok, err := p.token("")
		if err != nil {
			return nil, err
		}
		key := tok.(string)
		if _, dup := m[key]; dup {
			return nil, formatErr(p.file, "", "%s has key %q twice", metadataKey, key)
		}
		tok, err = p.token("")
		if err != nil {
			return nil, err
		}
		val, ok := tok.(string)
		if !ok {
			return nil, formatErr(p.file, "", "%s[%q] must be a string, found %s", metadataKey, key, describeToken(tok))
		}
		m[key] = val
	}
	if _, err := p.token(""); err != nil {
		return nil, err
	}
	return m, nil
}

func (p *headerParser) parseEntry(name string) (entry, error) {
	e := entry{name: name}
	if err := p.expectDelim(name, '{', "the tensor's entry"); err != nil {
		return e, err
	}
	var haveDType, haveShape, haveOffsets bool
	for p.dec.More() {
		tok, err := p.token(name)
		if err != nil {
			return e, err
		}
		field := tok.(string)
		switch field {
		case "dtype":
			if haveDType {
				return e, formatErr(p.file, name, "field dtype appears twice")
			}
			haveDType = true
			tok, err := p.token(name)
			if err != nil {
				return e, err
			}
			s, ok := tok.(string)
			if !ok {
				return e, formatErr(p.file, name, "dtype must be a string, found %s", describeToken(tok))
			}
			if e.dtype, err = ParseDType(s); err != nil {
				return e, formatErr(p.file, name, "unknown dtype %q (known: %s)", truncate(s, 40), knownDTypes())
			}
		case "shape":
			if haveShape {
				return e, formatErr(p.file, name, "field shape appears twice")
			}
			haveShape = true
			dims, err := p.parseUints(name, "shape", MaxRank)
			if err != nil {
				return e, err
			}
			e.shape = make([]int, len(dims))
			for i, d := range dims {
				e.shape[i] = int(d) // parseUints bounds values by MaxInt64
				if uint64(e.shape[i]) != d {
					return e, formatErr(p.file, name, "shape[%d] = %d does not fit this platform's int", i, d)
				}
			}
		case "data_offsets":
			if haveOffsets {
				return e, formatErr(p.file, name, "field data_offsets appears twice")
			}
			haveOffsets = true
			offs, err := p.parseUints(name, "data_offsets", 2)
			if err != nil {
				return e, err
			}
			if len(offs) != 2 {
				return e, formatErr(p.file, name, "data_offsets must hold exactly 2 numbers [begin, end], found %d", len(offs))
			}
			e.begin, e.end = int64(offs[0]), int64(offs[1])
		default:
			// The reference ignores unknown fields; so do we.
			if err := p.skipValue(name); err != nil {
				return e, err
			}
		}
	}
	if _, err := p.token(name); err != nil {
		return e, err
	}
	var missing []string
	if !haveDType {
		missing = append(missing, "dtype")
	}
	if !haveShape {
		missing = append(missing, "shape")
	}
	if !haveOffsets {
		missing = append(missing, "data_offsets")
	}
	if len(missing) > 0 {
		return e, formatErr(p.file, name, "entry lacks %s", strings.Join(missing, ", "))
	}
	return e, nil
}

// parseUints reads a JSON array of at most max non-negative integers no larger than MaxInt64.
func (p *headerParser) parseUints(tensor, field string, max int) ([]uint64, error) {
	tok, err := p.token(tensor)
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, formatErr(p.file, tensor, "%s must be an array of non-negative integers, found %s", field, describeToken(tok))
	}
	var out []uint64
	for p.dec.More() {
		tok, err := p.token(tensor)
		if err != nil {
			return nil, err
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, formatErr(p.file, tensor, "%s[%d] must be a non-negative integer, found %s", field, len(out), describeToken(tok))
		}
		v, err := strconv.ParseUint(string(num), 10, 64)
		if err != nil || v > math.MaxInt64 {
			return nil, formatErr(p.file, tensor, "%s[%d] = %s is not a non-negative integer below 2^63", field, len(out), truncate(string(num), 40))
		}
		if len(out) == max {
			if field == "shape" {
				return nil, formatErr(p.file, tensor, "shape has more than %d dimensions", max)
			}
			return nil, formatErr(p.file, tensor, "%s must hold exactly %d numbers, found more", field, max)
		}
		out = append(out, v)
	}
	if _, err := p.token(tensor); err != nil {
		return nil, err
	}
	return out, nil
}

// skipValue consumes one JSON value of any kind.
func (p *headerParser) skipValue(tensor string) error {
	depth := 0
	for {
		tok, err := p.token(tensor)
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
			default:
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}

// byteSize returns the number of bytes a tensor of dtype and shape occupies.
func byteSize(dtype DType, shape []int) (nelem, nbytes int64, err error) {
	n := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, 0, fmt.Errorf("shape %v has a negative dimension", shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, 0, fmt.Errorf("shape %v has more than 2^63 elements", shape)
		}
		n = lo
	}
	hi, nbits := bits.Mul64(n, uint64(dtype.Bits()))
	if hi != 0 || nbits/8 > math.MaxInt64 {
		return 0, 0, fmt.Errorf("shape %v of dtype %s is larger than 2^63 bytes", shape, dtype)
	}
	if nbits%8 != 0 {
		return 0, 0, fmt.Errorf("shape %v of dtype %s (%d bits each) is not a whole number of bytes", shape, dtype, dtype.Bits())
	}
	return int64(n), int64(nbits / 8), nil
}

// validate checks each tensor's byte count against its shape and dtype, then that the tensors,
// ordered by offset, tile the data section from 0 with no gap and no overlap.
func (h *header) validate(file string) error {
	for i := range h.entries {
		e := &h.entries[i]
		_, size, err := byteSize(e.dtype, e.shape)
		if err != nil {
			return formatErr(file, e.name, "%v", err)
		}
		if e.end < e.begin {
			return formatErr(file, e.name, "data_offsets [%d, %d] end before they begin", e.begin, e.end)
		}
		if e.end-e.begin != size {
			return formatErr(file, e.name, "shape %v of dtype %s needs %d bytes but data_offsets [%d, %d] hold %d",
				e.shape, e.dtype, size, e.begin, e.end, e.end-e.begin)
		}
	}
	slices.SortFunc(h.entries, func(a, b entry) int {
		if a.begin != b.begin {
			return cmpInt64(a.begin, b.begin)
		}
		if a.end != b.end {
			return cmpInt64(a.end, b.end)
		}
		return strings.Compare(a.name, b.name)
	})
	var cursor int64
	for i, e := range h.entries {
		switch {
		case e.begin > cursor:
			after := "the start of the data section"
			if i > 0 {
				after = fmt.Sprintf("tensor %q", h.entries[i-1].name)
			}
			return formatErr(file, e.name, "data_offsets [%d, %d] leave a gap of %d bytes after %s; the format requires tensor data to be contiguous",
				e.begin, e.end, e.begin-cursor, after)
		case e.begin < cursor:
			prev := h.entries[i-1]
			return formatErr(file, e.name, "data_offsets [%d, %d] overlap tensor %q at [%d, %d]", e.begin, e.end, prev.name, prev.begin, prev.end)
		}
		cursor = e.end
	}
	h.dataLen = cursor
	return nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
