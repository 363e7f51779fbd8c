#!/usr/bin/env python3
"""Writes the quickstart tokenizer: tokenizer.json and tokenizer_config.json.

A byte-level BPE in the Qwen2 layout (the same pre-tokenizer regex, digits split one by one):
the 256 byte tokens (id = byte value), a few merges for the chat template's words, and the
ChatML special tokens. Run from this directory: python3 make_tokenizer.py
Check with: node check_tokenizer.mjs (Hugging Face tokenizers) and the Go tokenizer tests.
"""
import json


def bytes_to_unicode():
    # GPT-2's reversible byte -> printable character map used by ByteLevel.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
vocab = {B2U[b]: b for b in range(256)}
merges = []
for word in ["user", "assistant", "system", "What", " is"]:
    sym = "".join(B2U[b] for b in word.encode())
    cur = sym[0]
    for ch in sym[1:]:
        if cur + ch not in vocab:
            merges.append(f"{cur} {ch}")
            vocab[cur + ch] = len(vocab)
        cur += ch

specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
added = []
for s in specials:
    added.append({"id": len(vocab), "content": s, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True})
    vocab_id = len(vocab)
    vocab[s] = vocab_id

pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    ]},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": {k: v for k, v in vocab.items() if k not in specials}, "merges": merges},
}
chat_template = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
config = {
    "add_bos_token": False,
    "add_prefix_space": False,
    "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
    "bos_token": None,
    "chat_template": chat_template,
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "errors": "replace",
    "model_max_length": 512,
    "pad_token": "<|endoftext|>",
    "split_special_tokens": False,
    "tokenizer_class": "Qwen2Tokenizer",
    "unk_token": None,
}
with open("tokenizer.json", "w", encoding="utf-8") as f:
    json.dump(tok, f, ensure_ascii=False, indent=1)
    f.write("\n")
with open("tokenizer_config.json", "w", encoding="utf-8") as f:
    json.dump(config, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"vocab {len(vocab)} tokens ({len(merges)} merges, {len(specials)} special)")
