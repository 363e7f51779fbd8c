#!/usr/bin/env python3
"""Tell a forward bug from bf16 rounding noise in a step-1 loss gap of moe-bench.sh.

moe-bench.sh compares halo-shell with transformers at step 1, before any update, so only the
forward numerics differ there. With top-2 routing (Mixtral) a change of one bf16 unit in a router
logit can swap a token's second expert, which replaces half of that token's MoE output, and the
swap then propagates through the later layers; with top-8 of 128 (Qwen3-30B-A3B) a swapped eighth
expert moves little. So a Mixtral gap can come from rounding alone. This script measures how far
numerically equivalent forwards of the same weights move the step-1 loss, on the bench's own
weights and rows (same --seed, shape, layers, batch, seq-len and --steps as moe-bench.sh):

  torch bf16 variants: each experts implementation transformers offers (eager, grouped_mm,
      batched_mm), each sdpa backend (flash, efficient, cudnn), and the embedding with one bf16
      unit flipped in 10% of its entries;
  torch fp32: the same weights in float32 with TF32 off;
  torch bf16 and fp32 with exact inv_freq: the rotary frequencies recomputed in float32, where
      the bench's model.to(dtype=bf16) has rounded that buffer to bf16 (halo-shell's are exact);
  halo-shell (with --halo BIN): bench-train for one step in bf16 and with --fp32.

For each it records the step-1 loss, the gradient norm before clipping and, for the torch
variants, the share of tokens whose top-k expert set differs from the baseline's in each layer.
Reading it: if the torch bf16 variants spread about as far as halo-shell's bf16 gap, the gap is
routing noise; the fp32 pair then decides, since in fp32 the rounding is 2^16 times finer: a
correct forward matches torch's fp32 loss to about 1e-4 nats, a wrong one does not.

Writes OUT/init (the weights), OUT/tokens.jsonl, OUT/diag.json, and prints one line a variant.

Usage: python3 moe_forward_diag.py --shape mixtral-8x7b --layers 4 --batch 4 --seq-len 2048 \\
           --steps 20 --out DIR [--halo bin/halo-shell]
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch  # noqa: E402  (the bench's shapes, model build and token rows)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", required=True, choices=sorted(bench_torch.SHAPES))
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20, help="the bench's --steps (the token rows depend on it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sub-vocab", type=int, default=1024)
    p.add_argument("--out", required=True)
    p.add_argument("--halo", default="", help="halo-shell binary: also run bench-train for one step, bf16 and fp32")
    p.add_argument("--fp32-batch", type=int, default=0,
                   help="rows of the fp32 pair (torch and halo-shell; the first rows of step 1) [--batch]; fewer if "
                        "fp32 weights, gradients and AdamW moments do not fit beside the activations")
    return p.parse_args(argv)


def layers_of(model):
    return list(model.model.layers)


class Routes:
    """Forward hooks on every MoE layer's router that keep the chosen experts of each token."""

    def __init__(self, model):
        self.got = {}
        self.handles = []
        for i, layer in enumerate(layers_of(model)):
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if gate is None:
                continue
            self.handles.append(gate.register_forward_hook(self.hook(i)))

    def hook(self, i):
        def f(_module, _inputs, output):
            outs = output if isinstance(output, (tuple, list)) else (output,)
            idx = [t for t in outs if torch.is_tensor(t) and not t.is_floating_point()]
            if idx:
                self.got[i] = torch.sort(idx[-1].detach(), dim=-1).values.cpu()

        return f

    def take(self):
        got, self.got = self.got, {}
        return got


def step1(model, ids, routes):
    """Loss and pre-clipping gradient norm of one forward and backward, grads cleared after."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    norms = [torch.linalg.vector_norm(p.grad.float()) for p in model.parameters() if p.grad is not None]
    gn = torch.linalg.vector_norm(torch.stack(norms)).item()
    loss = out.loss.item()
    model.zero_grad(set_to_none=True)
    return loss, gn, routes.take()


def inv_freq_buffers(model):
    """(module, buffer name) of every rotary frequency buffer (a buffer whose name ends in
    inv_freq: inv_freq, original_inv_freq, or one per layer type)."""
    found = []
    for mod_name, m in model.named_modules():
        for b_name, b in m.named_buffers(recurse=False):
            if b_name.endswith("inv_freq") and torch.is_tensor(b):
                found.append((m, b_name))
    return found


def exact_inv_freq(model):
    """Recomputes every rotary frequency buffer in float32 for default RoPE and returns a
    function that puts the old buffers back. model.to(dtype=bf16) rounds these buffers to bf16
    (they are floating buffers), and the forward then rotates with the rounded frequencies;
    halo-shell computes them exactly. Other RoPE types are left as they are."""
    c = model.config
    rp = getattr(c, "rope_parameters", None) or {}
    if rp.get("rope_type", "default") != "default":
        return lambda: None
    theta = rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    dim = int(head_dim * getattr(c, "partial_rotary_factor", 1.0))
    old = []
    for m, name in inv_freq_buffers(model):
        b = getattr(m, name)
        exact = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=b.device) / dim))
        if exact.shape != b.shape:
            continue
        old.append((m, name, b))
        setattr(m, name, exact.float())

    def restore():
        for m, name, b in old:
            setattr(m, name, b)

    return restore


def disagreement(base, other):
    """Per layer, the share of tokens whose expert set differs from base's."""
    d = {}
    for i, b in base.items():
        o = other.get(i)
        if o is None or o.shape != b.shape:
            continue
        d[i] = (b != o).any(dim=-1).float().mean().item()
    return d


def halo_step1(bin_path, args, init_dir, data, extra, batch):
    out = os.path.join(args.out, "halo-%s.json" % ("fp32" if extra else "bf16"))
    cmd = [bin_path, "run", "bench-train", "--model", init_dir, "--data", data, "--device", "cuda", "--steps", "1",
           "--warmup", "0", "--batch", str(batch), "--seq-len", str(args.seq_len), "--lr", "1e-4",
           "--max-grad-norm", "1.0", "--no-profile", "--out", out] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-2000:], "command": " ".join(cmd)}
    with open(out) as f:
        rep = json.load(f)
    s = rep["steps"][0]
    return {"loss": s["loss"], "grad_norm": s["grad_norm"], "command": " ".join(cmd)}


def main(argv):
    args = parse_args(argv)
    assert torch.cuda.is_available(), "moe_forward_diag.py needs a CUDA GPU"
    os.makedirs(args.out, exist_ok=True)
    # The bench's order of seeding and building, so the weights are the bench's.
    torch.manual_seed(args.seed)
    _, config = bench_torch.model_config(args)
    model = bench_torch.build_model(config)
    init_dir = os.path.join(args.out, "init")
    model.save_pretrained(init_dir, safe_serialization=True)
    rows = args.steps * args.batch
    data = os.path.join(args.out, "tokens.jsonl")
    bench_torch.write_tokens(data, bench_torch.markov_rows(rows, args.seq_len, config.vocab_size, args.sub_vocab, args.seed))
    ids = bench_torch.read_tokens(data)[: args.batch].to("cuda")

    routes = Routes(model)
    results = []

    def record(name, fn):
        try:
            loss, gn, r = fn()
            results.append({"variant": name, "loss": loss, "grad_norm": gn, "routes": r})
        except Exception as e:  # a variant this install lacks; the others stand
            results.append({"variant": name, "error": repr(e)[:500]})

    default_impl = getattr(model.config, "_experts_implementation", None)
    record("torch bf16 (defaults: experts %s, sdpa)" % default_impl, lambda: step1(model, ids, routes))

    if default_impl is not None and hasattr(model, "set_experts_implementation"):
        for impl in ("eager", "grouped_mm", "batched_mm"):
            if impl == default_impl:
                continue

            def run_impl(impl=impl):
                model.set_experts_implementation(impl)
                try:
                    return step1(model, ids, routes)
                finally:
                    model.set_experts_implementation(default_impl)

            record("torch bf16 experts " + impl, run_impl)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def run_sdpa(backend=backend):
            with sdpa_kernel([backend]):
                return step1(model, ids, routes)

        record("torch bf16 sdpa " + name, run_sdpa)

    def run_perturbed():
        w = model.get_input_embeddings().weight
        keep = w.detach().clone()
        g = torch.Generator(device="cuda").manual_seed(7)
        flip = (torch.rand(w.shape, device="cuda", generator=g) < 0.1).to(torch.int16)
        with torch.no_grad():
            w.view(torch.int16).bitwise_xor_(flip)  # one unit in the last place of 10% of entries
        try:
            return step1(model, ids, routes)
        finally:
            with torch.no_grad():
                w.copy_(keep)

    record("torch bf16 embedding +-1 ulp in 10%", run_perturbed)

    def run_exact(batch=None):
        restore = exact_inv_freq(model)
        try:
            return step1(model, ids[:batch] if batch else ids, routes)
        finally:
            restore()

    inv_dtypes = sorted({"%s %s" % (name, getattr(m, name).dtype) for m, name in inv_freq_buffers(model)})
    record("torch bf16 exact fp32 inv_freq", run_exact)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    fp32_batch = args.fp32_batch or args.batch
    model.float()

    def run_fp32():
        try:
            return step1(model, ids[:fp32_batch], routes)
        except Exception:  # an experts implementation without fp32 (torch._grouped_mm takes bf16)
            if not hasattr(model, "set_experts_implementation"):
                raise
            model.set_experts_implementation("eager")
            return step1(model, ids[:fp32_batch], routes)

    record("torch fp32", run_fp32)

    def run_fp32_exact():
        restore = exact_inv_freq(model)
        try:
            return run_fp32()
        finally:
            restore()

    record("torch fp32 exact fp32 inv_freq", run_fp32_exact)
    del model
    torch.cuda.empty_cache()

    base = results[0].get("routes") or {}
    for r in results:
        rt = r.pop("routes", None)
        if rt is not None and base:
            r["routing_disagreement_by_layer"] = disagreement(base, rt)  # layers of other shapes are left out

    if args.halo:
        for extra, batch in (([], args.batch), (["--fp32", "--optim", "adamw_torch"], fp32_batch)):
            h = halo_step1(args.halo, args, init_dir, data, extra, batch)
            h["variant"] = "halo-shell " + ("fp32" if extra else "bf16")
            results.append(h)

    ref = results[0].get("loss")
    for r in results:
        if "loss" in r and ref is not None:
            r["loss_minus_baseline"] = r["loss"] - ref
    by = {r["variant"]: r for r in results if "loss" in r}
    torch_bf16 = [r["loss"] for r in results if r["variant"].startswith("torch bf16") and "loss" in r]
    summary = {"torch_bf16_spread": max(torch_bf16) - min(torch_bf16) if torch_bf16 else None}
    if "halo-shell bf16" in by and ref is not None:
        summary["halo_bf16_minus_torch_bf16"] = by["halo-shell bf16"]["loss"] - ref
    if "halo-shell fp32" in by and "torch fp32" in by:
        summary["halo_fp32_minus_torch_fp32"] = by["halo-shell fp32"]["loss"] - by["torch fp32"]["loss"]
        summary["grad_norm_fp32_ratio"] = by["halo-shell fp32"]["grad_norm"] / by["torch fp32"]["grad_norm"]
    if "halo-shell fp32" in by and "torch fp32 exact fp32 inv_freq" in by:
        summary["halo_fp32_minus_torch_fp32_exact_inv_freq"] = (
            by["halo-shell fp32"]["loss"] - by["torch fp32 exact fp32 inv_freq"]["loss"])
    summary["torch_inv_freq_dtypes"] = inv_dtypes
    report = {"shape": args.shape, "layers": config.num_hidden_layers, "batch": args.batch, "seq_len": args.seq_len,
              "fp32_batch": fp32_batch, "steps_of_rows": args.steps, "seed": args.seed, "summary": summary,
              "results": results}
    with open(os.path.join(args.out, "diag.json"), "w") as f:
        json.dump(report, f, indent=1)
    for r in results:
        if "error" in r:
            print("%-44s error: %s" % (r["variant"], r["error"].splitlines()[-1] if r["error"] else ""))
            continue
        dis = r.get("routing_disagreement_by_layer")
        dis_s = " ".join("%.3f" % dis[i] for i in sorted(dis)) if dis else ""
        print("%-44s loss %.5f (%+.5f) grad_norm %.4f %s" % (r["variant"], r["loss"], r.get("loss_minus_baseline", 0.0),
                                                           r["grad_norm"], ("routing differs: " + dis_s) if dis_s else ""))
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
