#!/usr/bin/env python3
"""Stock transformers sampling baseline for the batched-generation benchmark.

Builds the Qwen3-0.6B shape with transformers (random init from --seed, bf16 weights,
attn_implementation="sdpa") on the GPU and times model.generate on --batch prompts of
--prompt-len tokens with --new-tokens new tokens each (min_new_tokens = max_new_tokens, so every
row makes them all), sampling at temperature 1 over the whole vocabulary (top_k 0, top_p 1), the
KV cache on: the settings TestGPUGenerateThroughput uses in halo-shell. One untimed warm-up call
of 4 new tokens comes first. Writes --out: new tokens/s, seconds, peak memory and versions.

Usage: python3 generate_torch.py --out FILE [--batch 64 --prompt-len 32 --new-tokens 256]
"""
import argparse
import json
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--prompt-len", type=int, default=32)
p.add_argument("--new-tokens", type=int, default=256)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

torch.manual_seed(a.seed)
cfg = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                  rope_theta=1000000, rms_norm_eps=1e-6, tie_word_embeddings=True)
model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
# The same prompt ids as the Go benchmark: (r*7919 + i*104729 + 13) mod vocab.
ids = torch.tensor([[(r * 7919 + i * 104729 + 13) % cfg.vocab_size for i in range(a.prompt_len)] for r in range(a.batch)],
                   device="cuda")
mask = torch.ones_like(ids)
kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, use_cache=True, pad_token_id=0, eos_token_id=None)
with torch.no_grad():
    model.generate(ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, **kw)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, **kw)
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
new = (out.shape[1] - a.prompt_len) * a.batch
res = {"new_tokens_per_s": new / sec, "seconds": sec, "new_tokens": new,
       "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
       "batch": a.batch, "prompt_len": a.prompt_len, "new_tokens_per_row": a.new_tokens,
       "torch": torch.__version__, "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}
json.dump(res, open(a.out, "w"), indent=1)
print(res)
