#!/usr/bin/env python3
"""bf16 LoRA baseline with torch + transformers + PEFT, and the inputs halo-shell trains on after it.

For the Qwen3-4B shape (or any shape of bench_torch.py) this:

  1. builds the model with transformers (random init from --seed, bf16, sdpa) on the GPU and saves
     it with save_pretrained into OUT/init;
  2. writes OUT/tokens.jsonl (bench_torch.py's seeded Markov rows: steps x batch rows of seq_len);
  3. wraps it with peft.get_peft_model(LoraConfig(r, lora_alpha, target_modules="all-linear",
     lora_dropout=0)), optionally with gradient checkpointing (use_reentrant=False, with the input
     embeddings requiring grad as PEFT documents), trains --steps steps with
     torch.optim.AdamW(fused=True) over the adapters at a constant learning rate, every token
     trained, timing each step between torch.cuda.synchronize() calls;
  4. writes OUT/torch-peft.json: per-step loss and time, the median tokens/s after --warmup, and
     torch.cuda.max_memory_allocated() / max_memory_reserved() over the whole run (build
     included, as halo-shell's bench-train counts its load).

Usage: python3 lora_torch.py --out DIR [--shape qwen3-4b --steps 10 --batch 1 --seq-len 4096 --r 16 --alpha 32]
Needs torch, transformers, peft and safetensors.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as bt  # noqa: E402  (the shapes, model build and token rows of the full benchmark)

# Qwen/Qwen3-4B's Hub config (tied embeddings).
bt.SHAPES.setdefault("qwen3-4b", ("qwen3", dict(
    vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    max_window_layers=36, use_sliding_window=False, rms_norm_eps=1e-6, attention_bias=False,
    hidden_act="silu", initializer_range=0.02, tie_word_embeddings=True, bos_token_id=151643,
    eos_token_id=151645, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-4b", choices=sorted(bt.SHAPES))
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (smoke runs)")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--no-checkpointing", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sub-vocab", type=int, default=1024)
    a = p.parse_args(argv)
    a.warmup = max(0, min(a.warmup, a.steps - 1))
    return a


def main(argv):
    from peft import LoraConfig, get_peft_model
    import peft
    import transformers

    args = parse_args(argv)
    assert torch.cuda.is_available(), "lora_torch.py needs a CUDA GPU"
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    _, config = bt.model_config(argparse.Namespace(shape=args.shape, layers=args.layers))
    model = bt.build_model(config)
    model.save_pretrained(os.path.join(args.out, "init"), safe_serialization=True)
    rows = args.steps * args.batch
    data_path = os.path.join(args.out, "tokens.jsonl")
    bt.write_tokens(data_path, bt.markov_rows(rows, args.seq_len, config.vocab_size, args.sub_vocab, args.seed))
    data = bt.read_tokens(data_path)

    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    torch.cuda.synchronize()
    steps = []
    for i in range(args.steps):
        batch = data[i * args.batch:(i + 1) * args.batch]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ids = batch.to("cuda", non_blocking=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tokens = ids.numel()
        steps.append({"step": i + 1, "loss": loss.item(), "step_time_s": dt, "tokens": tokens, "tokens_per_s": tokens / dt})
        print(f"step {i + 1}: loss {loss.item():.4f} {tokens / dt:.0f} tok/s", flush=True)
    timed = steps[args.warmup:]
    report = {
        "engine": "torch+peft",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
        "gpu": torch.cuda.get_device_name(0),
        "shape": args.shape,
        "settings": {"batch": args.batch, "seq_len": args.seq_len, "r": args.r, "alpha": args.alpha,
                     "targets": "all-linear", "gradient_checkpointing": not args.no_checkpointing, "lr": args.lr},
        "trainable_params": sum(p.numel() for p in trainable),
        "steps": steps,
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in timed),
        "memory": {"peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                   "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                   "note": "torch.cuda.max_memory_allocated() / max_memory_reserved() over the whole run, build included, as halo-shell's peak"},
    }
    with open(os.path.join(args.out, "torch-peft.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
