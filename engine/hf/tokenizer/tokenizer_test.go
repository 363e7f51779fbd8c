package tokenizer

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// TestVocabularyAccessors checks ids, strings and special tokens of the Qwen3 tokenizer
// against values Hugging Face reports for it.
func TestVocabularyAccessors(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	if got := tok.VocabSize(); got != 151669 {
		t.Errorf("VocabSize = %d, want 151669", got)
	}
	for _, c := range []struct {
		token string
		id    int
	}{{"<|im_start|>", 151644}, {"<|endoftext|>", 151643}, {"<think>", 151667}, {"Hello", 9707}, {"Ġworld", 1879}, {"Ġ", 220}} {
		if id, ok := tok.TokenToID(c.token); !ok || id != c.id {
			t.Errorf("TokenToID(%q) = %d, %v; want %d", c.token, id, ok, c.id)
		}
		if s, ok := tok.IDToToken(c.id); !ok || s != c.token {
			t.Errorf("IDToToken(%d) = %q, %v; want %q", c.id, s, ok, c.token)
		}
	}
	if _, ok := tok.TokenToID("no such token here"); ok {
		t.Error("TokenToID of an unknown string reports ok")
	}
	for _, id := range []int{-1, 151669, 1 << 40} {
		if _, ok := tok.IDToToken(id); ok {
			t.Errorf("IDToToken(%d) reports ok", id)
		}
	}
	special := tok.SpecialTokens()
	var names []string
	for _, s := range special {
		names = append(names, s.Content)
	}
	if !slices.Contains(names, "<|im_start|>") || !slices.Contains(names, "<|endoftext|>") || slices.Contains(names, "<think>") {
		t.Errorf("SpecialTokens = %v; want <|im_start|> and <|endoftext|> but not <think>", names)
	}
	if len(tok.AddedTokens()) != 26 {
		t.Errorf("AddedTokens has %d tokens, want 26", len(tok.AddedTokens()))
	}
	if !slices.IsSortedFunc(special, func(a, b AddedToken) int { return a.ID - b.ID }) {
		t.Error("SpecialTokens is not ordered by id")
	}
	if !bytes.Contains(tok.PostProcessor(), []byte(`"ByteLevel"`)) {
		t.Errorf("PostProcessor = %s, want the file's ByteLevel post-processor", tok.PostProcessor())
	}
}

// TestEncodeBatchMatchesEncode checks that the parallel batch gives each text's Encode, in order.
func TestEncodeBatchMatchesEncode(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	var texts []string
	for _, c := range loadGoldens(t, "qwen3") {
		texts = append(texts, c.Text)
	}
	got := tok.EncodeBatch(texts)
	if len(got) != len(texts) {
		t.Fatalf("EncodeBatch returned %d results for %d texts", len(got), len(texts))
	}
	for i, s := range texts {
		if want := tok.Encode(s); !slices.Equal(got[i], want) {
			t.Errorf("EncodeBatch[%d] (%q) = %v, Encode = %v", i, trunc(s), truncIDs(got[i]), truncIDs(want))
		}
	}
	if out := tok.EncodeBatch(nil); len(out) != 0 {
		t.Errorf("EncodeBatch(nil) = %v", out)
	}
}

// TestStreamDecoderYieldsWholeCharacters steps through the golden ids one at a time: the
// pieces never hold a partial character and add up to Decode of all ids.
func TestStreamDecoderYieldsWholeCharacters(t *testing.T) {
	for _, name := range []string{"qwen3", "tiny-gpt2"} {
		t.Run(name, func(t *testing.T) {
			tok := testTokenizer(t, name)
			for _, c := range loadGoldens(t, name) {
				for _, skip := range []bool{false, true} {
					d := tok.NewStreamDecoder(skip)
					var b strings.Builder
					for _, id := range c.IDs {
						piece, err := d.Step(id)
						if err != nil {
							t.Fatalf("%s: Step(%d): %v", c.Name, id, err)
						}
						if strings.Contains(piece, "\uFFFD") && !strings.Contains(c.Text, "\uFFFD") {
							t.Fatalf("%s: Step(%d) yielded a replacement character: %q", c.Name, id, piece)
						}
						b.WriteString(piece)
					}
					want := tok.Decode(c.IDs, skip)
					if b.String() != want {
						t.Errorf("%s (skip special %v): stream gave %q, Decode gives %q", c.Name, skip, trunc(b.String()), trunc(want))
					}
				}
			}
		})
	}
}

// TestStreamDecoderHoldsPartialBytes checks that a character split over several byte
// tokens comes out whole, with nothing before its last token.
func TestStreamDecoderHoldsPartialBytes(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	// "🎉" is one token in Qwen3; build it from its four byte tokens instead.
	var ids []int
	for _, b := range []byte("🎉") {
		id, ok := tok.TokenToID(byteToStr[b])
		if !ok {
			t.Fatalf("no byte token for %#x", b)
		}
		ids = append(ids, id)
	}
	hello, _ := tok.TokenToID("Hello")
	ids = append([]int{hello}, ids...)
	d := tok.NewStreamDecoder(false)
	want := []string{"Hello", "", "", "", "🎉"}
	for i, id := range ids {
		got, err := d.Step(id)
		if err != nil {
			t.Fatal(err)
		}
		if got != want[i] {
			t.Errorf("step %d (id %d) = %q, want %q", i, id, got, want[i])
		}
	}
}

// TestDecodeSkipsSpecialAndUnknownIDs checks skip_special_tokens and ids outside the vocabulary.
func TestDecodeSkipsSpecialAndUnknownIDs(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	ids := []int{151644, 9707, -5, 1 << 35, 999999, 1879, 151645}
	if got, want := tok.Decode(ids, false), "<|im_start|>Hello world<|im_end|>"; got != want {
		t.Errorf("Decode = %q, want %q", got, want)
	}
	if got, want := tok.Decode(ids, true), "Hello world"; got != want {
		t.Errorf("Decode skipping special = %q, want %q", got, want)
	}
}

// TestInvalidUTF8IsReplaced checks that invalid input bytes encode as U+FFFD.
func TestInvalidUTF8IsReplaced(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	if got, want := tok.Encode("a\xffb"), tok.Encode("a\uFFFDb"); !slices.Equal(got, want) {
		t.Errorf("Encode(invalid) = %v, want %v", got, want)
	}
}

// TestLossyUTF8 checks the Rust from_utf8_lossy rule: one U+FFFD per maximal invalid subpart.
func TestLossyUTF8(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"abc", "abc"},
		{"\xe4\xb8", "\uFFFD"},                 // truncated 3-byte sequence: one replacement
		{"\xe4\xb8a", "\uFFFDa"},               // followed by ASCII
		{"\xff\xfe", "\uFFFD\uFFFD"},           // two invalid bytes
		{"\xf0\x9f\x8e", "\uFFFD"},             // truncated 4-byte sequence
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: E0 then two continuation bytes
		{"\xc0\xaf", "\uFFFD\uFFFD"},           // overlong
		{"\xe4\xb8\xad", "中"},
	} {
		if got := lossyUTF8([]byte(c.in)); got != c.want {
			t.Errorf("lossyUTF8(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestEncodeLines checks the line protocol of `halo-shell run tokenize`.
func TestEncodeLines(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	for _, c := range []struct {
		name, in, want, err string
	}{
		{"two lines", "\"Hello world\"\n\"<|im_start|>\"\n", "[9707,1879]\n[151644]\n", ""},
		{"no final newline", `"Hello"`, "[9707]\n", ""},
		{"crlf", "\"Hello\"\r\n\"\"\r\n", "[9707]\n[]\n", ""},
		{"empty input", "", "", ""},
		{"number", "\"Hello\"\n42\n\"x\"\n", "[9707]\n", "line 2: want a JSON string, got a JSON number"},
		{"not json", "\"Hello\"\n\"x\"\nnope\n", "[9707]\n[87]\n", "line 3: not a JSON string"},
		{"blank line", "\n", "", "line 1: not a JSON string"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			err := tok.EncodeLines(strings.NewReader(c.in), &out, nil)
			if c.err == "" && err != nil {
				t.Fatalf("error %v", err)
			}
			if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("error %v, want one containing %q", err, c.err)
			}
			if out.String() != c.want {
				t.Errorf("output %q, want %q", out.String(), c.want)
			}
		})
	}
}

// TestEncodeLinesManyBatches checks that output lines stay in input order across batches.
func TestEncodeLinesManyBatches(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	var in, want strings.Builder
	for i := 0; i < 3*linesPerBatch+7; i++ {
		s := strings.Repeat("x", i%17) + " " + string(rune('a'+i%26))
		q, _ := json.Marshal(s)
		in.Write(q)
		in.WriteByte('\n')
		ids, _ := json.Marshal(tok.Encode(s))
		want.Write(ids)
		want.WriteByte('\n')
	}
	var out bytes.Buffer
	if err := tok.EncodeLines(strings.NewReader(in.String()), &out, nil); err != nil {
		t.Fatal(err)
	}
	if out.String() != want.String() {
		t.Errorf("output differs from encoding each line in order")
	}
}

// TestLoadErrors checks that bad files are refused with a message naming the problem.
func TestLoadErrors(t *testing.T) {
	vocab := `{"a":0,"b":1,"ab":2}`
	bpe := func(extra string) string {
		return `{"model":{"type":"BPE","vocab":` + vocab + `,"merges":["a b"]` + extra + `}}`
	}
	for _, c := range []struct{ name, json, want string }{
		{"not json", `{"model":`, "not a tokenizer.json: line 1 column"},
		{"no model", `{"version":"1.0"}`, `no "model"`},
		{"bad version", `{"version":"2.0","model":{}}`, `version "2.0" is unknown`},
		{"unigram", `{"model":{"type":"Unigram","vocab":[["a",0.0]]}}`, "tokenizer model Unigram is not supported yet; supported: BPE (byte-level or SentencePiece-style)"},
		{"wordpiece", `{"model":{"type":"WordPiece","vocab":{"a":0}}}`, "tokenizer model WordPiece is not supported yet"},
		{"untyped non-bpe", `{"model":{"vocab":{"a":0}}}`, "tokenizer model (no type) is not supported yet"},
		{"dropout", bpe(`,"dropout":0.1`), "model.dropout 0.1"},
		{"negative id", `{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`, `model.vocab["a"] = -1 is not a token id`},
		{"merge not in vocab", `{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]}}`, `model.merges[0]: token "c" is not in model.vocab`},
		{"merged not in vocab", `{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[["a","b"]]}}`, `model.merges[0]: merged token "ab" is not in model.vocab`},
		{"merge without space", `{"model":{"type":"BPE","vocab":{"a":0},"merges":["ab"]}}`, `model.merges[0] = "ab": want two tokens`},
		{"merge wrong shape", `{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a"]]}}`, `model.merges[0] = ["a"]: want "a b" or ["a", "b"]`},
		{"unk not in vocab", bpe(`,"unk_token":"<unk>"`), `model.unk_token "<unk>" is not in model.vocab`},
		{"unknown normalizer", `{"normalizer":{"type":"Precompiled"},"model":{"type":"BPE","vocab":{},"merges":[]}}`, `normalizer: normalizer type "Precompiled" is not supported`},
		{"nested bad normalizer", `{"normalizer":{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Nope"}]},"model":{"type":"BPE","vocab":{},"merges":[]}}`, `normalizer.normalizers[1]: normalizer type "Nope"`},
		{"unknown pre-tokenizer", `{"pre_tokenizer":{"type":"BertPreTokenizer"},"model":{"type":"BPE","vocab":{},"merges":[]}}`, `pre_tokenizer: pre-tokenizer type "BertPreTokenizer" is not supported`},
		{"bad regex", `{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated"},"model":{"type":"BPE","vocab":{},"merges":[]}}`, `pre_tokenizer: Split: regular expression "(a" does not compile`},
		{"bad behavior", `{"pre_tokenizer":{"type":"Split","pattern":{"String":"a"},"behavior":"Sideways"},"model":{"type":"BPE","vocab":{},"merges":[]}}`, `behavior "Sideways" is not one of`},
		{"split without pattern", `{"pre_tokenizer":{"type":"Split","behavior":"Isolated"},"model":{"type":"BPE","vocab":{},"merges":[]}}`, `Split: pattern is missing`},
		{"unknown decoder", `{"decoder":{"type":"WordPiece"},"model":{"type":"BPE","vocab":{},"merges":[]}}`, `decoder: decoder type "WordPiece" is not supported`},
		{"deep nesting", `{"normalizer":` + strings.Repeat(`{"type":"Sequence","normalizers":[`, 40) + strings.Repeat(`]}`, 40) + `,"model":{"type":"BPE","vocab":{},"merges":[]}}`, "nested deeper than 32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := FromBytes([]byte(c.json))
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "tokenizer: tokenizer.json: ") {
				t.Errorf("error %q, want it to start with \"tokenizer: tokenizer.json: \" and contain %q", err, c.want)
			}
		})
	}
}

// TestFromDirAndFileErrors checks the messages for missing files and directories.
func TestFromDirAndFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := FromDir(dir); err == nil || !strings.Contains(err.Error(), "has no tokenizer.json") {
		t.Errorf("FromDir(empty) error %v", err)
	}
	if _, err := FromFile(dir); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("FromFile(dir) error %v", err)
	}
	p := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(p, []byte(`{"model":{"type":"Unigram"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := FromDir(dir); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("FromDir error %v does not name the file %s", err, p)
	}
}

// FuzzFromBytes loads arbitrary bytes as a tokenizer.json: it must return a tokenizer or an
// error, never panic; a tokenizer that loads must encode and decode without panicking.
func FuzzFromBytes(f *testing.F) {
	for _, name := range []string{"tiny-gpt2", "tiny-norm", "tiny-misc"} {
		data, err := os.ReadFile(filepath.Join("testdata", name, "tokenizer.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"added_tokens":[{"id":5,"content":"<x>","special":true}]}`,
		`{"model":{"type":"BPE","unk_token":"a","fuse_unk":true,"byte_fallback":true,"vocab":{"a":0},"merges":[]},"decoder":{"type":"Strip","content":"a","start":9,"stop":9}}`,
		`{"normalizer":{"type":"Replace","pattern":{"Regex":"a*"},"content":"b"},"model":{"type":"BPE","vocab":{"b":0},"merges":[]}}`,
		`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"x*"},"behavior":"MergedWithNext","invert":true},"model":{"merges":[],"vocab":{}}}`,
		`{"model":{"type":"Unigram"}}`, `[]`, `null`, `{"model":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := FromBytes(data)
		if err != nil {
			if tok != nil {
				t.Fatal("tokenizer and error both returned")
			}
			return
		}
		for _, s := range []string{"", "ab ab", "<x>a b\n\n  é中🎉 123", string(data[:min(len(data), 64)])} {
			ids := tok.Encode(s)
			_ = tok.Decode(ids, false)
			d := tok.NewStreamDecoder(true)
			for _, id := range ids {
				d.Step(id)
			}
		}
	})
}

// FuzzRoundTrip checks decode(encode(s)) == NFC(s) for the Qwen3 tokenizer (byte-level BPE
// whose only normalizer is NFC), on arbitrary valid UTF-8.
func FuzzRoundTrip(f *testing.F) {
	tok := testTokenizer(f, "qwen3")
	for _, s := range []string{"", "Hello world", "  x\n\n\ty", "中文 🎉 café", "<|im_start|>user\n<|im_end|>", "12345 it's"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			s = strings.ToValidUTF8(s, "\uFFFD")
		}
		want := nfc(s)
		if got := tok.Decode(tok.Encode(s), false); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q", want, got)
		}
	})
}

func nfc(s string) string { return unicodeNormalizer{norm.NFC}.normalize(s) }

// TestEncodeOffsetsThroughNormalization checks the ranges of tokens of text the normalizer
// changes: NFC composes "e\u0301" into one character whose token covers both source
// characters, and the ranges stay within the text and in order.
func TestEncodeOffsetsThroughNormalization(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	text := "cafe\u0301 x<|im_end|>"
	ids, offs := tok.EncodeOffsets(text)
	if !slices.Equal(ids, tok.Encode(text)) {
		t.Fatalf("ids %v, Encode gives %v", ids, tok.Encode(text))
	}
	var pieces []string
	for _, o := range offs {
		pieces = append(pieces, text[o[0]:o[1]])
	}
	want := []string{"ca", "fe\u0301", " x", "<|im_end|>"}
	if !slices.Equal(pieces, want) {
		t.Errorf("token texts %q, want %q (offsets %v)", pieces, want, offs)
	}
}

// TestEncodeOffsetsCoarse checks the fallback for a normalizer that is not character by
// character (Prepend): every token of the segment gets the segment's range.
func TestEncodeOffsetsCoarse(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "tiny-gpt2", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	spec["normalizer"] = map[string]any{"type": "Prepend", "prepend": "_"}
	data, _ = json.Marshal(spec)
	tok, err := FromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	text := "hello there<|endoftext|>again"
	ids, offs := tok.EncodeOffsets(text)
	if !slices.Equal(ids, tok.Encode(text)) || len(ids) < 4 {
		t.Fatalf("ids %v, Encode gives %v", ids, tok.Encode(text))
	}
	eot, _ := tok.TokenToID("<|endoftext|>")
	k := slices.Index(ids, eot)
	for i, o := range offs {
		want := [2]int{0, 11}
		switch {
		case i == k:
			want = [2]int{11, 24}
		case i > k:
			want = [2]int{24, 29}
		}
		if o != want {
			t.Errorf("token %d (id %d): offsets %v, want %v", i, ids[i], o, want)
		}
	}
}

// FuzzEncodeOffsets checks on arbitrary text that EncodeOffsets gives Encode's ids and
// ranges that stay inside the text and never decrease, for a tokenizer with a normalizer and
// added tokens (Qwen3) and one with Lowercase/NFKC, prefix spaces and rstrip (tiny-norm).
func FuzzEncodeOffsets(f *testing.F) {
	toks := []*Tokenizer{testTokenizer(f, "qwen3"), testTokenizer(f, "tiny-norm")}
	for _, s := range []string{"", "Hello world", "cafe\u0301 <|im_end|>  x", "ﬁ İ HeLLo 123", "<|im_start|>\n\n a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range toks {
			ids, offs := tok.EncodeOffsets(s)
			if want := tok.Encode(s); !slices.Equal(ids, want) {
				t.Fatalf("EncodeOffsets(%q) ids %v, Encode %v", s, ids, want)
			}
			if len(offs) != len(ids) {
				t.Fatalf("%d offsets for %d ids", len(offs), len(ids))
			}
			n := len(strings.ToValidUTF8(s, "\uFFFD"))
			for i, o := range offs {
				if o[0] < 0 || o[0] > o[1] || o[1] > n || (i > 0 && o[0] < offs[i-1][0]) {
					t.Fatalf("EncodeOffsets(%q): bad ranges %v", s, offs)
				}
			}
		}
	})
}

// TestEncodeOffsetsDroppedCharacters checks that characters a model drops (not in the
// vocabulary, no unk_token) do not shift later ranges: each token covers its true bytes.
func TestEncodeOffsetsDroppedCharacters(t *testing.T) {
	tok, err := FromBytes([]byte(`{"model":{"type":"BPE","vocab":{"a":1,"b":2,"ab":3,"c":4},"merges":["a b"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	ids, offs := tok.EncodeOffsets("xa bxc")
	if want := []int{3, 4}; !slices.Equal(ids, want) {
		t.Fatalf("ids %v, want %v", ids, want)
	}
	if want := [][2]int{{1, 4}, {5, 6}}; !slices.Equal(offs, want) {
		t.Errorf("offsets %v, want %v", offs, want)
	}
}

// FuzzStreamDecode feeds arbitrary id sequences (byte tokens that split characters, special
// tokens, ids past the vocabulary) to a StreamDecoder: it never fails for the byte-level
// Qwen3 tokenizer, and what it yields is Decode of all ids whenever that does not end inside
// a character.
func FuzzStreamDecode(f *testing.F) {
	tok := testTokenizer(f, "qwen3")
	f.Add([]byte{0, 1, 2, 3}, false)
	f.Add([]byte("\xff\x10\x20\x30\x40"), true)
	f.Fuzz(func(t *testing.T, data []byte, skip bool) {
		var ids []int
		for i := 0; i+1 < len(data); i += 2 {
			x := int(data[i])<<8 | int(data[i+1])
			switch x % 4 {
			case 0: // a byte token
				id, _ := tok.TokenToID(byteToStr[byte(x>>2)])
				ids = append(ids, id)
			case 1: // an added token or an id past the vocabulary
				ids = append(ids, 151643+(x>>2)%40)
			default:
				ids = append(ids, (x*7919)%151643)
			}
		}
		d := tok.NewStreamDecoder(skip)
		var b strings.Builder
		for _, id := range ids {
			s, err := d.Step(id)
			if err != nil {
				t.Fatalf("Step(%d): %v (ids %v)", id, err, ids)
			}
			b.WriteString(s)
		}
		if want := tok.Decode(ids, skip); !strings.HasSuffix(want, "\uFFFD") && b.String() != want {
			t.Fatalf("stream %q, Decode %q (ids %v)", b.String(), want, ids)
		}
	})
}
