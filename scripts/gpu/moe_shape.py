#!/usr/bin/env python3
"""The Qwen3-MoE expert-parallel benchmark's model, token rows and summary.

  moe_shape.py make --out DIR [--layers 4] [--rows N] [--seq-len 2048] [--seed 0]
      builds a qwen3_moe model with transformers at random init (torch.manual_seed(seed), bf16)
      with the layer dimensions of Qwen/Qwen3-30B-A3B (hidden 2048, 32 heads, 4 KV heads,
      head_dim 128, 128 experts of moe_intermediate_size 768, top-8, norm_topk_prob, vocab
      151936, untied embeddings) and --layers decoder layers, saves it with save_pretrained to
      DIR/init and writes DIR/tokens.jsonl: --rows rows of --seq-len ids, one
      {"input_ids": [...]} per line, from the seeded Markov chain of bench_torch.py (so the
      loss falls visibly).

  moe_shape.py summary OUTDIR --eps 1,2 [--command LINE]
      reads OUTDIR/moe-ep{N}.json (the reports of `halo-shell run bench-train`), with
      OUTDIR/moe-ep{N}.cmd (the command line), .rc (its exit status) and .log (its output) for
      each EP size, and writes OUTDIR/moe-ep-report.json: per EP size tokens/s, step time, peak GiB
      per GPU (the list and the largest), the shares of the profiled step in the dispatch and
      combine all-to-alls, losses, MFU and the command line, or the error of a failed run.
      It needs the standard library only.
"""
import argparse
import json
import os
import sys

# Qwen/Qwen3-30B-A3B's config.json, but for the number of layers.
QWEN3_30B_A3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    attention_bias=False,
    hidden_act="silu",
    initializer_range=0.02,
    tie_word_embeddings=False,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
    output_router_logits=False,
    router_aux_loss_coef=0.001,
    use_sliding_window=False,
    bos_token_id=151643,
    eos_token_id=151645,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)


def make(args):
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_torch import markov_rows, write_tokens

    kw = dict(QWEN3_30B_A3B)
    kw["num_hidden_layers"] = args.layers
    config = AutoConfig.for_model("qwen3_moe", **kw)
    torch.manual_seed(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        except TypeError:  # transformers before dtype= was the keyword
            model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model = model.to(dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    init = os.path.join(args.out, "init")
    os.makedirs(init, exist_ok=True)
    model.save_pretrained(init, safe_serialization=True)
    gen = os.path.join(init, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    del model
    ids = markov_rows(args.rows, args.seq_len, kw["vocab_size"], args.sub_vocab, args.seed)
    write_tokens(os.path.join(args.out, "tokens.jsonl"), ids)
    info = dict(params=n, layers=args.layers, rows=args.rows, seq_len=args.seq_len, seed=args.seed,
                built_on=dev, torch=torch.__version__, transformers=transformers.__version__)
    with open(os.path.join(args.out, "model.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(f"saved a {args.layers}-layer Qwen3-30B-A3B-shaped model ({n / 1e9:.2f} B parameters) to {init} "
          f"and {args.rows} rows of {args.seq_len} tokens", flush=True)


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def gib(n):
    return n / (1 << 30)


def ep_entry(outdir, ep):
    base = os.path.join(outdir, f"moe-ep{ep}")
    e = {"ep": ep, "command": (read(base + ".cmd", "") or "").strip()}
    rc = (read(base + ".rc", "") or "").strip()
    e["exit_status"] = int(rc) if rc.lstrip("-").isdigit() else None
    raw = read(base + ".json")
    report = None
    if raw is not None:
        try:
            report = json.loads(raw)
        except ValueError as err:
            e["error"] = f"{base}.json is not JSON: {err}"
    if report is None or e["exit_status"] not in (0, None):
        log = (read(base + ".log", "") or "").strip().splitlines()
        e.setdefault("error", "the run failed" if e["exit_status"] else "the run wrote no report")
        e["log_tail"] = log[-15:]
        if report is None:
            return e
    mem = report.get("memory", {})
    per = mem.get("per_device") or []
    if per:
        peaks = [d.get("peak_allocated_bytes", 0) for d in per]
        reserved = [d.get("reserved_bytes", 0) for d in per]
    else:
        peaks = [mem.get("peak_allocated_bytes", 0)]
        reserved = [mem.get("reserved_bytes", 0)]
    bd = report.get("breakdown") or {}
    comm = bd.get("comm") or {}
    st = report.get("settings", {})
    e.update(
        device=report.get("device"),
        layout=report.get("layout"),
        batch_rows=st.get("batch_size"),
        seq_len=st.get("seq_len"),
        batch_split=st.get("batch_split"),
        tokens_per_s=report.get("tokens_per_s"),
        step_time_s=report.get("step_time_s"),
        peak_gib_max=round(gib(max(peaks)), 3),
        peak_gib_per_gpu=[round(gib(p), 3) for p in peaks],
        reserved_gib_per_gpu=[round(gib(r), 3) for r in reserved],
        dispatch_share=comm.get("dispatch_fraction", 0.0),
        combine_share=comm.get("combine_fraction", 0.0),
        comm_share=comm.get("comm_fraction", 0.0),
        comm_by_kind_s=comm.get("by_kind_s", {}),
        profiled_step_wall_s=bd.get("wall_s"),
        losses=report.get("losses"),
        mfu=report.get("mfu"),
        params=report.get("model", {}).get("params"),
        active_params=report.get("model", {}).get("active_params"),
    )
    return e


def summary(args):
    eps = [int(x) for x in args.eps.split(",") if x.strip()]
    runs = [ep_entry(args.outdir, ep) for ep in eps]
    method = "no EP>1 run wrote a report"
    for ep in eps:
        try:
            r = json.loads(read(os.path.join(args.outdir, f"moe-ep{ep}.json")) or "null")
        except ValueError:
            continue
        comm = ((r or {}).get("breakdown") or {}).get("comm")
        if comm:
            method = comm.get("method", method)
            break
    out = {
        "benchmark": "Qwen3-MoE (Qwen3-30B-A3B layer shape) expert-parallel training, halo-shell run bench-train",
        "command": args.command,
        "model": json.loads(read(os.path.join(args.outdir, "model.json")) or "{}"),
        "share_method": method,
        "ep1_note": "EP=1 is the one-GPU run (--device cuda:0): no collectives, shares 0",
        "runs": runs,
    }
    path = os.path.join(args.outdir, "moe-ep-report.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"{'ep':>3} {'tok/s':>10} {'step s':>8} {'peak GiB (max)':>15} {'dispatch':>9} {'combine':>8}  status")
    for r in runs:
        if "tokens_per_s" in r:
            print(f"{r['ep']:>3} {r['tokens_per_s']:>10.0f} {r['step_time_s']:>8.3f} {r['peak_gib_max']:>15.2f} "
                  f"{100 * r['dispatch_share']:>8.1f}% {100 * r['combine_share']:>7.1f}%  {r.get('error', 'ok')}")
        else:
            print(f"{r['ep']:>3} {'-':>10} {'-':>8} {'-':>15} {'-':>9} {'-':>8}  {r.get('error')}")
    print(f"wrote {path}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="build, save the model and write token rows")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--rows", type=int, default=40)
    m.add_argument("--seq-len", type=int, default=2048)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--sub-vocab", type=int, default=1024)
    s = sub.add_parser("summary", help="write OUTDIR/moe-ep-report.json")
    s.add_argument("outdir")
    s.add_argument("--eps", required=True, help="comma-separated EP sizes that were run")
    s.add_argument("--command", default="")
    a = p.parse_args(argv)
    if a.cmd == "make":
        if a.layers < 1 or a.rows < 1 or a.seq_len < 2:
            p.error("need --layers >= 1, --rows >= 1, --seq-len >= 2")
        make(a)
    else:
        summary(a)


if __name__ == "__main__":
    main(sys.argv[1:])
