// Package tokenizer reads Hugging Face tokenizer.json files and encodes and decodes text
// token for token as the Hugging Face tokenizers library does.
//
// It covers the byte-level BPE lineage (GPT-2, Llama-3, Qwen2/Qwen3): the normalizers NFC,
// NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, ByteLevel and Sequence;
// the pre-tokenizers Split (regular expressions with lookahead, every split behaviour,
// invert), ByteLevel, Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit and Sequence;
// both merges formats; ignore_merges; byte_fallback; continuing_subword_prefix and
// end_of_word_suffix; added and special tokens with single_word, lstrip, rstrip and
// normalized; and the decoders ByteLevel, ByteFallback, Fuse, Strip, Replace and Sequence.
//
// Encode equals Hugging Face's Tokenizer.encode(text, add_special_tokens=False).ids:
// post-processors, truncation and padding are not applied (the post-processor is exposed
// for callers that add BOS/EOS themselves). Decode equals Tokenizer.decode and
// StreamDecoder equals tokenizers' DecodeStream.
//
// It is not a trainer, and it does not implement the Unigram, WordPiece or WordLevel models:
// loading such a tokenizer.json returns an error that names the model type.
//
// A Tokenizer is immutable after loading and safe for concurrent use.
package tokenizer
