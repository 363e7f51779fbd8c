package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unicode/utf8"
)

// Tokenizer is a loaded tokenizer.json. It is immutable and safe for concurrent use.
type Tokenizer struct {
	model      *bpe
	normalizer normalizer
	steps      []preStep
	// byteLevelTail: the pre-tokenizer ends with ByteLevel, so words reach the model as raw
	// bytes and the model maps them to the byte-level alphabet itself (the final ByteLevel step
	// is dropped when that mapping is all it does).
	byteLevelTail bool
	decoder       decoder
	added         addedVocab

	idToToken   map[int32]string
	maxID       int32
	postProcess json.RawMessage

	cache   *wordCache
	scratch sync.Pool

	timeoutOnce sync.Once // the warning of Encode about a pattern past its match time
}

// maxFileSize bounds the size of a tokenizer.json read from disk.
const maxFileSize = 1 << 30

// FromFile loads a tokenizer.json file.
func FromFile(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %v", err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("tokenizer: %s is a directory; use FromDir or pass the tokenizer.json inside it", path)
	}
	if !st.Mode().IsRegular() {
		// Reading a named pipe would wait for a writer; a device never ends.
		return nil, fmt.Errorf("tokenizer: %s is not a regular file (%v)", path, st.Mode().Type())
	}
	if st.Size() > maxFileSize {
		return nil, fmt.Errorf("tokenizer: %s: %d bytes is larger than the %d-byte limit", path, st.Size(), maxFileSize)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %v", err)
	}
	return fromBytes(data, path)
}

// FromDir loads dir/tokenizer.json (a Hugging Face model directory).
func FromDir(dir string) (*Tokenizer, error) {
	if st, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: directory %s does not exist (give the model or tokenizer directory that holds tokenizer.json)", dir)
	} else if err == nil && !st.IsDir() {
		return nil, fmt.Errorf("tokenizer: %s is a file, not a directory; give the directory that holds tokenizer.json", dir)
	}
	p := filepath.Join(dir, "tokenizer.json")
	if _, err := os.Stat(p); err != nil {
		return nil, fmt.Errorf("tokenizer: %s has no tokenizer.json (%v); halo-shell reads the fast-tokenizer file, not vocab.json/merges.txt", dir, err)
	}
	return FromFile(p)
}

// FromBytes loads the contents of a tokenizer.json.
func FromBytes(data []byte) (*Tokenizer, error) { return fromBytes(data, "tokenizer.json") }

type fileJSON struct {
	Version       *string         `json:"version"`
	AddedTokens   []AddedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]int32  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

func fromBytes(data []byte, name string) (*Tokenizer, error) {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("tokenizer: %s: %s", name, fmt.Sprintf(format, a...))
	}
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fail("not a tokenizer.json: %v", jsonError(data, err))
	}
	if f.Version != nil && *f.Version != "1.0" {
		return nil, fail("version %q is unknown; only \"1.0\" exists", *f.Version)
	}
	if isNull(f.Model) {
		return nil, fail("no \"model\"")
	}
	var kind struct {
		Type   string          `json:"type"`
		Merges json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(f.Model, &kind); err != nil {
		return nil, fail("model: %v", err)
	}
	if kind.Type == "" && kind.Merges != nil {
		kind.Type = "BPE"
	}
	if kind.Type != "BPE" {
		t := kind.Type
		if t == "" {
			t = "(no type)"
		}
		return nil, fail("tokenizer model %s is not supported yet; supported: BPE (byte-level or SentencePiece-style)", t)
	}
	var mj modelJSON
	if err := json.Unmarshal(f.Model, &mj); err != nil {
		return nil, fail("model: %v", jsonError(f.Model, err))
	}
	if mj.Dropout != nil && *mj.Dropout != 0 {
		return nil, fail("model.dropout %v makes encoding random; only dropout null or 0 is supported", *mj.Dropout)
	}
	t := &Tokenizer{postProcess: f.PostProcessor, maxID: -1}
	m, err := buildBPE(&mj, t)
	if err != nil {
		return nil, fail("%v", err)
	}
	t.model = m
	if t.normalizer, err = parseNormalizer(f.Normalizer, "normalizer", 0); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", name, err)
	}
	if t.steps, t.byteLevelTail, err = parsePreTokenizer(f.PreTokenizer, "pre_tokenizer", 0, true); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", name, err)
	}
	if t.byteLevelTail && (m.continuingPrefix != "" || m.endSuffix != "") {
		// The raw-byte fast path does not handle prefixes and suffixes: map in the pre-tokenizer.
		last := t.steps[len(t.steps)-1].(byteLevelStep)
		last.mapBytes = true
		t.steps[len(t.steps)-1] = last
		t.byteLevelTail = false
	}
	if t.byteLevelTail {
		m.buildByteLevelTables()
		// A final ByteLevel without prefix space or regex only maps bytes, which the model
		// does itself: drop the step.
		if last := t.steps[len(t.steps)-1].(byteLevelStep); !last.addPrefixSpace && last.useRegex == nil {
			t.steps = t.steps[:len(t.steps)-1]
		}
	}
	if t.decoder, err = parseDecoder(f.Decoder, "decoder", 0); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", name, err)
	}
	if err := t.addTokens(f.AddedTokens); err != nil {
		return nil, fail("%v", err)
	}
	t.cache = newWordCache()
	t.scratch.New = func() any { return new(scratch) }
	return t, nil
}

// jsonError adds the line and column to a JSON syntax error.
func jsonError(data []byte, err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) && se.Offset <= int64(len(data)) {
		line := 1 + bytes.Count(data[:se.Offset], []byte("\n"))
		col := se.Offset - int64(bytes.LastIndexByte(data[:se.Offset], '\n'))
		return fmt.Errorf("line %d column %d: %v", line, col, err)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("key %q: %v", te.Field, err)
	}
	return err
}

func buildBPE(mj *modelJSON, t *Tokenizer) (*bpe, error) {
	m := &bpe{vocab: mj.Vocab, unkID: -1, fuseUnk: mj.FuseUnk, byteFallback: mj.ByteFallback, ignoreMerges: mj.IgnoreMerges}
	if m.vocab == nil {
		m.vocab = map[string]int32{}
	}
	t.idToToken = make(map[int32]string, len(m.vocab)+64)
	if mj.ContinuingSubwordPrefix != nil {
		m.continuingPrefix = *mj.ContinuingSubwordPrefix
	}
	if mj.EndOfWordSuffix != nil {
		m.endSuffix = *mj.EndOfWordSuffix
	}
	for tok, id := range m.vocab {
		if id < 0 || id == math.MaxInt32 {
			return nil, fmt.Errorf("model.vocab[%q] = %d is not a token id (0 to %d)", tok, id, math.MaxInt32-1)
		}
		t.setToken(id, tok)
	}
	if mj.UnkToken != nil {
		id, ok := m.vocab[*mj.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", *mj.UnkToken)
		}
		m.unkID = id
	}
	m.buildFallbackTable()
	m.merges = make(map[uint64]mergeRule, len(mj.Merges))
	prefixLen := len(m.continuingPrefix)
	for i, raw := range mj.Merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("model.merges[%d] = %.80s: %v", i, raw, err)
		}
		ia, ok := m.vocab[a]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in model.vocab", i, a)
		}
		ib, ok := m.vocab[b]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in model.vocab", i, b)
		}
		if len(b) < prefixLen {
			return nil, fmt.Errorf("model.merges[%d]: token %q is shorter than continuing_subword_prefix %q", i, b, m.continuingPrefix)
		}
		joined := a + b[prefixLen:]
		id, ok := m.vocab[joined]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: merged token %q is not in model.vocab", i, joined)
		}
		m.merges[pairKey(ia, ib)] = mergeRule{int32(i), id}
	}
	return m, nil
}

func (t *Tokenizer) setToken(id int32, tok string) {
	t.idToToken[id] = tok
	if id > t.maxID {
		t.maxID = id
	}
}

// addTokens registers the added tokens in file order, assigning ids the way Hugging Face
// does (an existing id for a known content, otherwise the next free id).
func (t *Tokenizer) addTokens(list []AddedToken) error {
	v := &t.added
	v.byID = map[int32]AddedToken{}
	v.byContent = map[string]int32{}
	v.special = map[string]bool{}
	type flags struct {
		content                               string
		singleWord, lstrip, rstrip, norm, spc bool
	}
	seen := map[flags]bool{}
	var specialList, addedList []AddedToken
	maxAdded := int32(-1)
	modelSize := int64(len(t.model.vocab))
	for _, tok := range list {
		if tok.Special && tok.Content != "" && !v.special[tok.Content] {
			specialList = append(specialList, tok)
			v.special[tok.Content] = true
		}
		f := flags{tok.Content, tok.SingleWord, tok.LStrip, tok.RStrip, tok.Normalized, tok.Special}
		if tok.Content == "" || seen[f] {
			continue
		}
		var id int32
		if x, ok := v.byContent[tok.Content]; ok {
			id = x
		} else if x, ok := t.model.vocab[tok.Content]; ok {
			id = x
		} else if maxAdded < 0 {
			id = int32(min(modelSize, math.MaxInt32-1))
		} else if int64(maxAdded) >= modelSize || modelSize == 0 {
			if maxAdded >= math.MaxInt32-1 {
				return fmt.Errorf("added_tokens: %q: no token id left", tok.Content)
			}
			id = maxAdded + 1
		} else {
			id = int32(modelSize)
		}
		if old, ok := v.byID[id]; ok {
			delete(seen, flags{old.Content, old.SingleWord, old.LStrip, old.RStrip, old.Normalized, old.Special})
		}
		seen[f] = true
		tok.ID = int(id)
		v.byContent[tok.Content] = id
		v.byID[id] = tok
		t.setToken(id, tok.Content)
		maxAdded = max(maxAdded, id)
		if !v.special[tok.Content] {
			addedList = append(addedList, tok)
		}
	}
	// Normalized added tokens decode to their normalized form, as in Hugging Face (the
	// decoder then inverts the normalization, byte-level mapping for instance).
	if t.normalizer != nil {
		for id, tok := range v.byID {
			if tok.Normalized {
				if n := t.normalizer.normalize(tok.Content); n != tok.Content {
					t.idToToken[id] = n
				}
			}
		}
	}
	v.raw, v.norm = newTrie(), newTrie()
	for _, tok := range append(specialList, addedList...) {
		id := v.byContent[tok.Content]
		if tok.Normalized {
			c := tok.Content
			if t.normalizer != nil {
				c = t.normalizer.normalize(c)
			}
			v.norm.insert(c, id)
		} else {
			v.raw.insert(tok.Content, id)
		}
	}
	return nil
}

func (t *Tokenizer) getScratch() *scratch  { return t.scratch.Get().(*scratch) }
func (t *Tokenizer) putScratch(s *scratch) { t.scratch.Put(s) }

// Encode returns the token ids of text, equal to Hugging Face's
// Tokenizer.encode(text, add_special_tokens=False).ids. Added and special tokens written in
// the text are recognised. Invalid UTF-8 bytes are first replaced by U+FFFD.
//
// Encode always encodes all of text. When a regular expression of the tokenizer runs past
// its match time (HALO_TOKENIZER_MATCH_TIMEOUT) on it, the rest of that piece is not split or
// replaced by the pattern, so the ids may differ from Hugging Face's (which would not return
// at all), and a warning naming the pattern is logged once; EncodeErr returns the error
// instead.
func (t *Tokenizer) Encode(text string) []int {
	ids, err := t.EncodeErr(text)
	if err != nil {
		t.timeoutOnce.Do(func() {
			slog.Warn("tokenizer: encoding went on without a pattern that ran past its match time; later timeouts are not logged", "err", err)
		})
	}
	return ids
}

// EncodeErr is Encode that returns a *MatchTimeoutError (with the ids Encode would return)
// when a regular expression of the tokenizer runs past its match time on text.
func (t *Tokenizer) EncodeErr(text string) ([]int, error) {
	sc := t.getScratch()
	ids := t.encode(text, sc, make([]int32, 0, len(text)/3+1))
	err := sc.err
	sc.err = nil
	t.putScratch(sc)
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out, err
}

// EncodeBatch encodes every text with all available cores, as Encode does; the result is
// in input order.
func (t *Tokenizer) EncodeBatch(texts []string) [][]int {
	out, errs := t.encodeBatch(texts)
	for _, err := range errs {
		if err != nil {
			t.timeoutOnce.Do(func() {
				slog.Warn("tokenizer: encoding went on without a pattern that ran past its match time; later timeouts are not logged", "err", err)
			})
			break
		}
	}
	return out
}

// encodeBatch is EncodeBatch with EncodeErr's error of each text.
func (t *Tokenizer) encodeBatch(texts []string) ([][]int, []error) {
	out := make([][]int, len(texts))
	errs := make([]error, len(texts))
	workers := min(runtime.GOMAXPROCS(0), len(texts))
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				k := i
				i++
				next.Unlock()
				if k >= len(texts) {
					return
				}
				out[k], errs[k] = t.EncodeErr(texts[k])
			}
		}()
	}
	wg.Wait()
	return out, errs
}

func (t *Tokenizer) encode(text string, sc *scratch, dst []int32) []int32 {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	var segs []segment
	if t.added.raw.empty() {
		segs = []segment{{text, -1, 0, len(text)}}
	} else {
		segs = t.added.findMatches(text, t.added.raw, nil)
	}
	for _, seg := range segs {
		if seg.id >= 0 {
			dst = append(dst, seg.id)
			continue
		}
		s := seg.text
		if t.normalizer != nil {
			var err error
			s, err = normalizeText(t.normalizer, s)
			sc.fail(err)
		}
		if t.added.norm.empty() {
			dst = t.encodeText(s, seg.start == 0, sc, dst)
			continue
		}
		for _, nseg := range t.added.findMatches(s, t.added.norm, nil) {
			if nseg.id >= 0 {
				dst = append(dst, nseg.id)
			} else {
				dst = t.encodeText(nseg.text, seg.start == 0 && nseg.start == 0, sc, dst)
			}
		}
	}
	return dst
}

// encodeText pre-tokenizes normalized text and encodes every word; origin says whether s
// starts the input text.
func (t *Tokenizer) encodeText(s string, origin bool, sc *scratch, dst []int32) []int32 {
	runSteps(t.steps, s, origin, sc, func(word string, _ wordPos) {
		dst = t.encodeWord(word, sc, dst)
	})
	return dst
}

// maxCachedWord is the longest word (in bytes) whose ids are cached.
const maxCachedWord = 128

func (t *Tokenizer) encodeWord(word string, sc *scratch, dst []int32) []int32 {
	if len(word) <= maxCachedWord {
		if ids, ok := t.cache.get(word); ok {
			return append(dst, ids...)
		}
	}
	n := len(dst)
	if t.byteLevelTail {
		dst = t.model.tokenizeRaw(word, &sc.bpe, dst)
	} else {
		dst = t.model.tokenize(word, &sc.bpe, dst)
	}
	if len(word) <= maxCachedWord {
		t.cache.put(word, dst[n:])
	}
	return dst
}

// Decode returns the text of ids, equal to Hugging Face's Tokenizer.decode(ids,
// skip_special_tokens=skipSpecial). Unknown ids are skipped, as there.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			continue
		}
		tok, ok := t.idToToken[int32(id)]
		if !ok {
			continue
		}
		if skipSpecial && t.added.special[tok] {
			continue
		}
		tokens = append(tokens, tok)
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decodeChain(tokens), "")
}

// TokenToID returns the id of a token string (added tokens first, then the model
// vocabulary).
func (t *Tokenizer) TokenToID(token string) (int, bool) {
	if id, ok := t.added.byContent[token]; ok {
		return int(id), true
	}
	id, ok := t.model.vocab[token]
	return int(id), ok
}

// IDToToken returns the token string of an id (in the model's alphabet: byte-level
// tokens read "Ġthe", not " the").
func (t *Tokenizer) IDToToken(id int) (string, bool) {
	if id < 0 || id > math.MaxInt32 {
		return "", false
	}
	tok, ok := t.idToToken[int32(id)]
	return tok, ok
}

// VocabSize returns one more than the largest token id of the model vocabulary and the
// added tokens: the number of rows an embedding table needs.
func (t *Tokenizer) VocabSize() int { return int(t.maxID) + 1 }

// SpecialTokens returns the added tokens marked special, ordered by id.
func (t *Tokenizer) SpecialTokens() []AddedToken {
	var out []AddedToken
	for _, tok := range t.added.sortedTokens() {
		if tok.Special {
			out = append(out, tok)
		}
	}
	return out
}

// AddedTokens returns all added tokens (special or not), ordered by id.
func (t *Tokenizer) AddedTokens() []AddedToken { return t.added.sortedTokens() }

// PostProcessor returns the raw "post_processor" JSON of the file (null when absent). Encode
// never applies it; callers that want BOS/EOS add them themselves.
func (t *Tokenizer) PostProcessor() json.RawMessage { return t.postProcess }

// parseMerge reads one merge: "a b" or ["a", "b"]. Plain JSON strings (no escapes) are
// sliced directly; anything else goes through encoding/json.
func parseMerge(raw json.RawMessage) (string, string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", "", fmt.Errorf(`want "a b" or ["a", "b"]`)
	}
	if raw[0] == '"' {
		s, err := jsonString(raw)
		if err != nil {
			return "", "", fmt.Errorf(`want "a b" or ["a", "b"]`)
		}
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return "", "", fmt.Errorf("want two tokens separated by a space")
		}
		return a, b, nil
	}
	var pair []string
	if raw[0] == '[' {
		// Fast path: ["a","b"] with plain strings.
		if a, b, ok := plainPair(raw); ok {
			return a, b, nil
		}
		if err := json.Unmarshal(raw, &pair); err == nil && len(pair) == 2 {
			return pair[0], pair[1], nil
		}
	}
	return "", "", fmt.Errorf(`want "a b" or ["a", "b"]`)
}

// jsonString decodes a JSON string literal, without encoding/json when it has no escapes.
func jsonString(raw []byte) (string, error) {
	if len(raw) >= 2 && raw[len(raw)-1] == '"' && bytes.IndexByte(raw[1:len(raw)-1], '\\') < 0 &&
		bytes.IndexByte(raw[1:len(raw)-1], '"') < 0 && utf8.Valid(raw) {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// plainPair parses ["a","b"] (optional spaces) where both strings are free of escapes.
func plainPair(raw []byte) (string, string, bool) {
	i := 1
	str := func() (string, bool) {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\n' || raw[i] == '\t' || raw[i] == '\r') {
			i++
		}
		if i >= len(raw) || raw[i] != '"' {
			return "", false
		}
		end := bytes.IndexByte(raw[i+1:], '"')
		if end < 0 {
			return "", false
		}
		s := raw[i+1 : i+1+end]
		if bytes.IndexByte(s, '\\') >= 0 || !utf8.Valid(s) {
			return "", false
		}
		i += end + 2
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\n' || raw[i] == '\t' || raw[i] == '\r') {
			i++
		}
		return string(s), true
	}
	a, ok := str()
	if !ok || i >= len(raw) || raw[i] != ',' {
		return "", "", false
	}
	i++
	b, ok := str()
	if !ok || i != len(raw)-1 || raw[i] != ']' {
		return "", "", false
	}
	return a, b, true
}
