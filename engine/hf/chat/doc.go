// Package chat renders Hugging Face chat templates and builds supervised fine-tuning inputs
// from conversations.
//
// A Template comes from a tokenizer directory (Load: chat_template.jinja, or the chat_template
// of tokenizer_config.json, a string or a list of named templates such as "default" and
// "tool_use"), from config bytes (FromConfigJSON) or from a source string (FromSource).
// Render produces the same text as transformers' apply_chat_template with tokenize=False:
// templates run in a Jinja engine (internal/jinja) that follows Python jinja2 as transformers
// configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls,
// raise_exception, strftime_now, tojson as json.dumps with ensure_ascii=False, Python values
// and string methods, compile-time constant folding). Goldens rendered by Python jinja2 with
// scripts/chat-goldens hold it to that: ten templates (eight from models: Qwen3, Qwen3.5,
// Llama-3, gpt-oss, Ministral 3, DeepSeek-V3 and V4, GLM-5; two written for the tests) over
// sixteen conversations, and some 3,000 snippets, random expressions, whitespace-control
// nestings and scoping programs.
//
// AssistantSpans locates the text of each assistant turn in a rendered conversation (from
// {% generation %} blocks when the template has them, else by rendering prefixes of the
// conversation and aligning them with the whole); Encode tokenizes the conversation and
// turns those spans into the token mask supervised fine-tuning trains on. Both refuse, with a
// *MaskError naming the message, conversations they cannot align with confidence.
// RenderLines serves `halo-shell run chat-template`.
//
// This package does not tokenize by itself (it takes an Encoder, which the tokenizer package's
// Tokenizer satisfies) and does not read datasets.
package chat
