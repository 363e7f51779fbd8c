#!/usr/bin/env python3
"""Stock PyTorch + transformers training baseline, and the inputs halo-shell trains on after it.

For one model shape this:

  1. builds the model from a config dict with transformers (random init from --seed, bf16
     weights, attn_implementation="sdpa", no gradient checkpointing) on the GPU and saves the
     initial weights with save_pretrained into OUT/init (config.json + model.safetensors);
  2. writes OUT/tokens.jsonl: steps x batch rows of seq_len token ids, one {"input_ids": [...]}
     per line, drawn from a seeded first-order Markov chain over a random sub-vocabulary (each
     token has 4 possible successors with probabilities 0.55/0.25/0.15/0.05), so the loss falls
     visibly within 20 steps; both engines read these same bytes;
  3. trains --steps steps with torch.optim.AdamW(fused=True) at a constant learning rate, clipping
     the global gradient norm with clip_grad_norm_ (skipped with --max-grad-norm 0), every token
     trained (labels = input_ids; transformers shifts them), step i on rows i*batch onwards,
     timing each step between torch.cuda.synchronize() calls (the batch's copy to the GPU included);
  4. profiles one extra step with torch.profiler and splits its GPU kernel time into op classes by
     kernel name (a heuristic: matmul, attention, loss, optimizer, embedding, other);
  5. writes OUT/torch.json: per-step loss, grad norm and time, the median tokens/s after --warmup
     steps, torch.cuda.max_memory_allocated() / max_memory_reserved(), MFU with the same formula
     as halo-shell (6*N + 6*L*T*NH*HD per token against --peak-tflops), the breakdown and versions.

Weight decay, when set, applies to parameters with ndim >= 2 only, as halo-shell does.

Usage: python3 bench_torch.py --shape qwen3-0.6b --out DIR [--steps 20 --batch 4 --seq-len 4096 ...]
Needs torch, transformers and safetensors (for save_pretrained) only.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# The two shapes of the benchmark: the Hub configs of Qwen/Qwen3-0.6B and
# meta-llama/Llama-3.2-1B (the same values as halo-shell's config presets qwen3-0.6b and
# llama-3.2-1b).
SHAPES = {
    "qwen3-0.6b": (
        "qwen3",
        dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            max_window_layers=28,
            use_sliding_window=False,
            rms_norm_eps=1e-6,
            attention_bias=False,
            hidden_act="silu",
            initializer_range=0.02,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151645,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    "llama-3.2-1b": (
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
            initializer_range=0.02,
            tie_word_embeddings=True,
            bos_token_id=128000,
            eos_token_id=128001,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    ),
}

# Mixture-of-experts shapes: the Hub configs of Qwen/Qwen3-30B-A3B, allenai/OLMoE-1B-7B-0924 and
# mistralai/Mixtral-8x7B-v0.1; DEFAULT_LAYERS gives the decoder layers built when --layers is
# not given (the full Qwen3 and Mixtral stacks do not fit one GPU with AdamW state).
SHAPES["qwen3-30b-a3b"] = (
    "qwen3_moe",
    dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, attention_bias=False, hidden_act="silu", initializer_range=0.02,
        tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, output_router_logits=False,
        router_aux_loss_coef=0.001, use_sliding_window=False, bos_token_id=151643, eos_token_id=151645,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
)
SHAPES["olmoe-1b-7b"] = (
    "olmoe",
    dict(
        vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096, rms_norm_eps=1e-5,
        attention_bias=False, hidden_act="silu", initializer_range=0.02, tie_word_embeddings=False,
        num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, output_router_logits=False,
        router_aux_loss_coef=0.01, clip_qkv=None, pad_token_id=1, bos_token_id=None, eos_token_id=50279,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
)
SHAPES["mixtral-8x7b"] = (
    "mixtral",
    dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-5, hidden_act="silu", initializer_range=0.02, tie_word_embeddings=False,
        num_local_experts=8, num_experts_per_tok=2, output_router_logits=False, router_aux_loss_coef=0.02,
        sliding_window=None, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
)
# DeepSeek-V4-Flash's attention and hyper-connections as DeepseekV4Config's defaults give them
# (hidden 4096, 64 heads of 512 over one shared key/value head, q and grouped o LoRA ranks
# 1024, window 128, compress rates 4 and 128, the indexer's 64 heads of 128 keeping 512, four
# streams with 20 Sinkhorn iterations), one layer of each attention kind and a second
# compressed sparse one, with 16 routed experts of 2048 instead of 256 (top-6, one shared) so
# that AdamW's state fits one GPU; the first layer hash-routed.
SHAPES["deepseek-v4-flash"] = (
    "deepseek_v4",
    dict(
        num_hidden_layers=4, n_routed_experts=16, num_nextn_predict_layers=0,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    ),
)
DEFAULT_LAYERS = {"qwen3-30b-a3b": 4, "mixtral-8x7b": 4}


def moe_sizes(config):
    """(experts, top-k, expert width, MoE layers) of a mixture-of-experts config, or None."""
    e = (getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
         or getattr(config, "n_routed_experts", None))
    if not e:
        return None
    k = config.num_experts_per_tok
    width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    L = config.num_hidden_layers
    sparse = set(range(L)) - set(getattr(config, "mlp_only_layers", None) or [])
    step = getattr(config, "decoder_sparse_step", 1) or 1
    layers = sum(1 for i in sparse if (i + 1) % step == 0)
    return e, k, width, layers


def active_params(n_params, config):
    """The parameters one token uses: all but the routed experts a token skips."""
    m = moe_sizes(config)
    if m is None:
        return n_params
    e, k, width, layers = m
    per_expert = 3 * config.hidden_size * width  # gate, up, down
    return n_params - layers * (e - k) * per_expert


FLOPS_FORMULA = (
    "flops_per_token = 6*N + 6*L*T*NH*HD: N the parameters a token uses (a tied embedding counted once; "
    "for a mixture of experts all but the routed experts a token skips), L layers, "
    "T tokens per sequence, NH*HD the query width; mfu = flops_per_token * tokens_per_s / (peak_tflops * 1e12)"
)

SUCCESSOR_PROBS = [0.55, 0.25, 0.15, 0.05]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--out", required=True, help="output directory (init/, tokens.jsonl, torch.json)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="leading steps left out of the medians")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--layers", type=int, default=0,
                   help="override num_hidden_layers (default: DEFAULT_LAYERS of the shape, else its full depth)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--seed", type=int, default=0, help="weights and data")
    p.add_argument("--sub-vocab", type=int, default=1024, help="tokens the Markov chain uses")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--no-profile", action="store_true")
    a = p.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.seq_len < 2:
        p.error("need steps >= 1, batch >= 1, seq-len >= 2")
    a.warmup = max(0, min(a.warmup, a.steps - 1))
    return a


def model_config(args):
    model_type, kw = SHAPES[args.shape]
    kw = dict(kw)
    layers = args.layers or DEFAULT_LAYERS.get(args.shape, 0)
    if layers:
        kw["num_hidden_layers"] = layers
        if "max_window_layers" in kw:
            kw["max_window_layers"] = layers
    return model_type, AutoConfig.for_model(model_type, **kw)


def build_model(config):
    """Random init directly on the GPU in bf16."""
    # sdpa where the family has it; eager otherwise (DeepSeek-V4's sink attention).
    attn = "sdpa"
    if config.model_type in ("deepseek_v4",):
        attn = "eager"
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.bfloat16)
        except TypeError:  # transformers before dtype= was the keyword
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, torch_dtype=torch.bfloat16)
    model = model.to(device="cuda", dtype=torch.bfloat16)
    model.config.use_cache = False
    if getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()
    model.train()
    return model


def markov_rows(rows, seq_len, vocab, sub_vocab, seed):
    """rows x seq_len ids of a seeded first-order Markov chain over sub_vocab random ids."""
    g = torch.Generator().manual_seed(seed + 1)
    k = min(sub_vocab, vocab)
    tokens = torch.randperm(vocab, generator=g)[:k]
    succ = torch.randint(0, k, (k, len(SUCCESSOR_PROBS)), generator=g)
    probs = torch.tensor(SUCCESSOR_PROBS)
    state = torch.randint(0, k, (rows,), generator=g)
    out = torch.empty(rows, seq_len, dtype=torch.long)
    for t in range(seq_len):
        out[:, t] = tokens[state]
        pick = torch.multinomial(probs, rows, replacement=True, generator=g)
        state = succ[state, pick]
    return out


def write_tokens(path, ids):
    with open(path, "w") as f:
        for row in ids.tolist():
            f.write(json.dumps({"input_ids": row}, separators=(",", ":")) + "\n")


def read_tokens(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line)["input_ids"])
    return torch.tensor(rows, dtype=torch.long)


def classify(name):
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa", "efficient_attention", "cudnn_sdp")):
        return "attention"
    if any(s in n for s in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "wgmma")):
        return "matmul"
    if any(s in n for s in ("adam", "multi_tensor", "foreach", "norm_kernel", "lpnorm")):
        return "optimizer"
    if any(s in n for s in ("cross_entropy", "log_softmax", "softmax", "nll_loss")):
        return "loss"
    if any(s in n for s in ("embedding", "index_select", "indexing_backward", "index_put")):
        return "embedding"
    return "other"


def profile_step(step_fn):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step_fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    by_class, kernels = {}, []
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = getattr(ev, "self_cuda_time_total", 0)
        if not us or getattr(ev, "device_type", None) is not None and "CUDA" not in str(ev.device_type):
            continue
        c = classify(ev.key)
        by_class[c] = by_class.get(c, 0.0) + us / 1e6
        kernels.append((us / 1e6, ev.key, c, ev.count))
    total = sum(by_class.values())
    kernels.sort(reverse=True)
    return {
        "wall_s": wall,
        "gpu_kernel_s": total,
        "by_class_s": by_class,
        "fraction": {k: v / total for k, v in by_class.items()} if total > 0 else {},
        "top_kernels": [{"name": k[:160], "class": c, "s": s, "calls": n} for s, k, c, n in kernels[:15]],
        "method": "torch.profiler self device time of each CUDA kernel, classed by kernel name (heuristic); "
        "RMSNorm, RoPE and SwiGLU run as elementwise kernels and fall under other",
    }


def main(argv):
    args = parse_args(argv)
    assert torch.cuda.is_available(), "bench_torch.py needs a CUDA GPU"
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model_type, config = model_config(args)
    model = build_model(config)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    init_dir = os.path.join(args.out, "init")
    model.save_pretrained(init_dir, safe_serialization=True)
    save_s = time.perf_counter() - t0

    rows = args.steps * args.batch
    data_path = os.path.join(args.out, "tokens.jsonl")
    write_tokens(data_path, markov_rows(rows, args.seq_len, config.vocab_size, args.sub_vocab, args.seed))
    data = read_tokens(data_path)  # the bytes halo-shell reads, read back
    assert data.shape == (rows, args.seq_len), data.shape

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, fused=True)
    params = [p for p in model.parameters()]
    n_params = sum(p.numel() for p in params)  # tied weights appear once in parameters()

    def step(i):
        ids = data[(i % args.steps) * args.batch : (i % args.steps + 1) * args.batch].to("cuda", non_blocking=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        if args.max_grad_norm > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm, foreach=True)
        else:
            gn = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach(), gn.detach()

    steps = []
    for i in range(args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss, gn = step(i)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        tokens = args.batch * args.seq_len
        s = {"step": i + 1, "loss": loss.item(), "grad_norm": gn.item(), "lr": args.lr, "tokens": tokens,
             "step_time_s": dt, "tokens_per_s": tokens / dt}
        steps.append(s)
        print("step %d loss %.4f grad_norm %.3f %.3f s %.0f tok/s" % (s["step"], s["loss"], s["grad_norm"], dt, s["tokens_per_s"]),
              flush=True)
    timed = steps[args.warmup:]
    tps = statistics.median(s["tokens_per_s"] for s in timed)
    memory = {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "note": "torch.cuda.max_memory_allocated() / max_memory_reserved() over the build and the timed steps",
    }
    breakdown = None
    if not args.no_profile:
        try:
            breakdown = profile_step(lambda: step(args.steps))
        except Exception as e:  # the figures above stand without it
            breakdown = {"error": repr(e)[:500]}

    L, NH, HD = config.num_hidden_layers, config.num_attention_heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    n_active = active_params(n_params, config)
    fpt = 6 * n_active + 6 * L * args.seq_len * NH * HD
    report = {
        "engine": "torch",
        "shape": args.shape,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "python": platform.python_version(),
        },
        "device": torch.cuda.get_device_name(0),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "model": {"dir": init_dir, "model_type": model_type, "params": n_params, "active_params": n_active, "layers": L,
                  "hidden": config.hidden_size, "heads": NH, "kv_heads": config.num_key_value_heads, "head_dim": HD,
                  "mlp": config.intermediate_size, "vocab": config.vocab_size,
                  "tied": bool(config.tie_word_embeddings), "dtype": "bf16",
                  "moe": dict(zip(("experts", "top_k", "expert_width", "moe_layers"), moe_sizes(config))) if moe_sizes(config) else None},
        "settings": {"steps": args.steps, "warmup": args.warmup, "batch_size": args.batch, "seq_len": args.seq_len,
                     "data_rows": rows, "data": data_path, "sub_vocab": args.sub_vocab,
                     "successor_probs": SUCCESSOR_PROBS, "seed": args.seed,
                     "optim": "torch.optim.AdamW(fused=True)", "lr": args.lr, "beta1": args.beta1,
                     "beta2": args.beta2, "eps": args.eps, "weight_decay": args.weight_decay,
                     "max_grad_norm": args.max_grad_norm, "gradient_checkpointing": False},
        "build_s": build_s,
        "save_s": save_s,
        "steps": steps,
        "losses": [s["loss"] for s in steps],
        "tokens_per_s": tps,
        "tokens_per_s_mean": statistics.fmean(s["tokens_per_s"] for s in timed),
        "step_time_s": statistics.median(s["step_time_s"] for s in timed),
        "memory": memory,
        "flops_per_token": fpt,
        "flops_formula": FLOPS_FORMULA,
        "peak_tflops": args.peak_tflops,
        "achieved_tflops": fpt * tps / 1e12,
        "mfu": fpt * tps / (args.peak_tflops * 1e12),
        "breakdown": breakdown,
    }
    if any(not math.isfinite(s["loss"]) for s in steps):
        report["error"] = "a loss is not finite"
    with open(os.path.join(args.out, "torch.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("%s torch: %.0f tok/s (median after %d warmup steps), peak %.2f GiB allocated, MFU %.1f%%" % (
        args.shape, tps, args.warmup, report["memory"]["peak_allocated_gib"], 100 * report["mfu"]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
