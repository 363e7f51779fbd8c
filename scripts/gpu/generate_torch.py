#!/usr/bin/env python3
"""Stock transformers sampling baseline for the batched-generation benchmark.

Builds the Qwen3-0.6B shape with transformers (random init from --seed, bf16 weights,
attn_implementation="sdpa") on the GPU, saves it with save_pretrained into --save (config.json +
model.safetensors: the weights halo-shell's benchmark then loads, so both engines sample from the
same model), and times model.generate on --batch prompts of --prompt-len tokens with
--new-tokens new tokens each, sampling at temperature 1 over the whole vocabulary (top_k 0,
top_p 1), no stop token (eos_token_id None, so every row makes all its tokens), the KV cache on:
the settings TestGPUGenerateThroughput uses in halo-shell. The prompt ids are those of the Go
benchmark: (r*7919 + i*104729 + 13) mod vocab for row r, token i. One untimed warm-up call of
4 new tokens comes first. Writes --out: new tokens/s, seconds, peak memory and versions.

Usage: python3 generate_torch.py --out FILE --save DIR [--batch 64 --prompt-len 32 --new-tokens 256]
"""
import argparse
import json
import os
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--save", required=True, help="directory for the model's weights (save_pretrained)")
p.add_argument("--batch", type=int, default=64)
p.add_argument("--prompt-len", type=int, default=32)
p.add_argument("--new-tokens", type=int, default=256)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()
assert torch.cuda.is_available(), "generate_torch.py needs a CUDA GPU"

torch.manual_seed(a.seed)
shape = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
             rms_norm_eps=1e-6, tie_word_embeddings=True)
# transformers 5 takes the RoPE base in rope_parameters, earlier versions as rope_theta.
cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **shape)
if not (isinstance(getattr(cfg, "rope_parameters", None), dict) and cfg.rope_parameters.get("rope_theta") == 1000000.0):
    cfg = Qwen3Config(rope_theta=1000000.0, **shape)
with torch.device("cuda"):
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    except TypeError:  # transformers before dtype= was the keyword
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
model = model.to(device="cuda", dtype=torch.bfloat16).eval()
os.makedirs(a.save, exist_ok=True)
model.save_pretrained(a.save, safe_serialization=True)

V = cfg.vocab_size
ids = torch.tensor([[(r * 7919 + i * 104729 + 13) % V for i in range(a.prompt_len)] for r in range(a.batch)],
                   dtype=torch.long, device="cuda")
mask = torch.ones_like(ids)
# No stop token: the generation config of a model built from a config may carry one, and
# generate stops a row there; eos_token_id=None makes every row produce all its tokens.
gc = transformers.GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, use_cache=True,
                                   pad_token_id=0, bos_token_id=None, eos_token_id=None)


call = {"how": "generation_config"}


def run(n):
    gc.max_new_tokens, gc.min_new_tokens = n, n
    if call["how"] == "generation_config":
        try:
            return model.generate(ids, attention_mask=mask, generation_config=gc)
        except (TypeError, ValueError) as e:  # a version that refuses one of the settings
            call["how"], call["why"] = "keywords", f"{type(e).__name__}: {e}"
    return model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=None, top_p=1.0,
                          use_cache=True, pad_token_id=0, eos_token_id=None, max_new_tokens=n, min_new_tokens=n)


with torch.no_grad():
    run(4)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = run(a.new_tokens)
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
rows_new = out.shape[1] - a.prompt_len
assert rows_new == a.new_tokens, f"generate made {rows_new} new tokens per row, want {a.new_tokens}"
new = rows_new * a.batch
res = {"new_tokens_per_s": new / sec, "seconds": sec, "new_tokens": new,
       "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
       "batch": a.batch, "prompt_len": a.prompt_len, "new_tokens_per_row": a.new_tokens,
       "weights": a.save, "generate_call": call, "attn_implementation": getattr(model.config, "_attn_implementation", None),
       "torch": torch.__version__, "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}
with open(a.out, "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps(res))
