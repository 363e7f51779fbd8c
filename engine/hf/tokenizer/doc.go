// Package tokenizer reads Hugging Face tokenizer.json files and encodes and decodes text
// token for token as the Hugging Face tokenizers library (0.23) does.
//
// It covers BPE tokenizers of the byte-level lineage (GPT-2, Llama-3, Qwen2/Qwen3, DeepSeek,
// GPT-4o) and of the SentencePiece lineage (Llama-2, Mistral, Gemma): the normalizers NFC,
// NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, ByteLevel and Sequence;
// the pre-tokenizers Split (regular expressions with lookahead, every split behaviour,
// invert), ByteLevel, Metaspace, Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit and
// Sequence; both merges formats; ignore_merges; byte_fallback; unk_token and fuse_unk;
// continuing_subword_prefix and end_of_word_suffix; added and special tokens with
// single_word, lstrip, rstrip and normalized; and the decoders ByteLevel, ByteFallback, Fuse,
// Strip, Replace, Metaspace and Sequence.
//
// Encode equals Hugging Face's Tokenizer.encode(text, add_special_tokens=False).ids:
// post-processors, truncation and padding are not applied (the post-processor is exposed
// for callers that add BOS/EOS themselves). Decode equals Tokenizer.decode and
// StreamDecoder equals tokenizers' DecodeStream.
//
// Exactness rests on three things. Regular expressions run on regexp2 (a backtracking
// engine with lookaround, like the Oniguruma engine Hugging Face uses), except the split
// patterns of the GPT-2, Llama-3, Qwen2, GPT-4o (o200k) and DeepSeek-V3 families, which
// hand-written scanners replace (scan.go; ten times faster or more, checked against regexp2).
// Character classes (\p{L}, \p{Lu}, \p{N}, \d, \w, \s, digits, punctuation, word characters,
// lowercase, accents) come from tables read back from Hugging Face tokenizers itself
// (unicode_tables.go, written by scripts/tokenizer-goldens/unicode.mjs), because its Unicode
// data is newer than Go's for some classes and older for normalization. And the goldens under
// testdata/ were produced by Hugging Face tokenizers (scripts/tokenizer-goldens/gen.mjs).
//
// A backtracking engine can take exponential time: a tokenizer.json whose regular
// expression does so on probe texts made from its own characters ((a+)+$ on forty a and a !)
// is refused at load with the pattern named, and every match runs under a time limit
// (HALO_TOKENIZER_MATCH_TIMEOUT). Past it, EncodeErr returns a *MatchTimeoutError and Encode
// encodes the rest of that piece without the pattern, logging a warning once.
//
// It is not a trainer, and it does not implement the Unigram, WordPiece or WordLevel models
// or BERT-style components: loading such a tokenizer.json returns an error that names what
// is not supported.
//
// A Tokenizer is immutable after loading and safe for concurrent use.
package tokenizer
