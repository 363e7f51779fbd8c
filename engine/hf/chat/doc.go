// Package chat renders Hugging Face chat templates and builds supervised fine-tuning inputs
// from conversations.
//
// A Template comes from a tokenizer directory (Load: chat_template.jinja or the chat_template
// of tokenizer_config.json, a string or a list of named templates) or from config bytes
// (FromConfigJSON). Render produces the same text as transformers' apply_chat_template with
// tokenize=False: templates run in a Jinja engine (internal/jinja) that follows Python jinja2
// as transformers configures it (trim_blocks, lstrip_blocks, loop controls, raise_exception,
// strftime_now, tojson as json.dumps with ensure_ascii=False). Committed goldens rendered by
// Python jinja2 (scripts/chat-goldens) hold it to that.
//
// Encode tokenizes a rendered conversation and marks the tokens of assistant output, the
// only tokens supervised fine-tuning trains on; see Encode for the algorithm and when it
// refuses.
//
// This package does not tokenize by itself (it takes an Encoder, which the tokenizer package
// satisfies), and it does not read conversations from datasets.
package chat
