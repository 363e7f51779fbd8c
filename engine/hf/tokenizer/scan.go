package tokenizer

// fastScanner returns a hand-written matcher for a known pre-tokenizer pattern, or nil.
func fastScanner(pattern string) matcher { return nil }
