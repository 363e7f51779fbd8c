#!/usr/bin/env python3
"""Reference values for engine/optim and engine/backend tests, computed by torch and transformers.

Writes (relative to the repository root):
  engine/optim/testdata/torch_goldens.json   lr schedules (transformers.get_scheduler),
                                             torch.optim.AdamW trajectories, clip_grad_norm_
  engine/backend/testdata/rope_goldens.json  inv_freq / attention scaling / cos / sin from
                                             transformers' LlamaRotaryEmbedding for each rope type

Run from the repository root with python3 that has torch and transformers:
  python3 engine/optim/testdata/make_goldens.py [OUTDIR]
OUTDIR defaults to the repository root (files land at the paths above).
"""
import json
import math
import os
import sys
import traceback

import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

out_root = sys.argv[1] if len(sys.argv) > 1 else "."
torch.manual_seed(0)


def schedules():
    cases = [
        dict(kind="constant", lr=1e-3, warmup=0, total=20),
        dict(kind="constant_with_warmup", lr=1e-3, warmup=5, total=20),
        dict(kind="linear", lr=3e-4, warmup=4, total=20),
        dict(kind="linear", lr=3e-4, warmup=0, total=10),
        dict(kind="cosine", lr=5e-4, warmup=3, total=25),
        dict(kind="cosine", lr=5e-4, warmup=0, total=12, num_cycles=1.5),
        dict(kind="cosine_with_min_lr", lr=1e-3, warmup=2, total=15, min_lr=1e-4),
        dict(kind="cosine_with_min_lr", lr=1e-3, warmup=2, total=15, min_lr_rate=0.2),
    ]
    res = []
    for c in cases:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=c["lr"])
        kw = {}
        if "num_cycles" in c:
            kw["num_cycles"] = c["num_cycles"]
        if "min_lr" in c:
            kw["min_lr"] = c["min_lr"]
        if "min_lr_rate" in c:
            kw["min_lr_rate"] = c["min_lr_rate"]
        sch = transformers.get_scheduler(c["kind"], opt, num_warmup_steps=c["warmup"],
                                         num_training_steps=c["total"], scheduler_specific_kwargs=kw or None)
        lrs = []
        for _ in range(c["total"] + 3):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        res.append(dict(c, lrs=lrs))
    return res


def adamw():
    res = []
    for case in [
        dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, wd=0.0, steps=6),
        dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, wd=0.1, steps=6),
    ]:
        g = torch.Generator().manual_seed(len(res) + 1)
        p0 = torch.randn(11, generator=g, dtype=torch.float32)
        grads = [torch.randn(11, generator=g, dtype=torch.float32) * (0.1 + i) for i in range(case["steps"])]
        grads[2][3] = 0.0
        p = torch.nn.Parameter(p0.clone())
        opt = torch.optim.AdamW([p], lr=case["lr"], betas=case["betas"], eps=case["eps"],
                                weight_decay=case["wd"], foreach=False, fused=False)
        traj = []
        for gr in grads:
            p.grad = gr.clone()
            opt.step()
            st = opt.state[p]
            traj.append(dict(param=p.detach().tolist(), exp_avg=st["exp_avg"].tolist(), exp_avg_sq=st["exp_avg_sq"].tolist()))
        res.append(dict(case, betas=list(case["betas"]), p0=p0.tolist(), grads=[x.tolist() for x in grads], trajectory=traj))
    return res


def clip():
    res = []
    for max_norm, scale in [(1.0, 1.0), (1.0, 0.01), (0.5, 3.0)]:
        g = torch.Generator().manual_seed(int(max_norm * 10 + scale * 100))
        ts = [torch.randn(n, generator=g) * scale for n in (5, 3, 8)]
        ps = [torch.nn.Parameter(torch.zeros_like(t)) for t in ts]
        for p, t in zip(ps, ts):
            p.grad = t.clone()
        norm = torch.nn.utils.clip_grad_norm_(ps, max_norm)
        res.append(dict(max_norm=max_norm, grads=[t.tolist() for t in ts], norm=float(norm),
                        clipped=[p.grad.tolist() for p in ps]))
    return res


def rope():
    base = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                num_hidden_layers=1, vocab_size=32)
    cases = [
        dict(name="default", theta=10000.0, max_pos=2048, params={}),
        dict(name="linear", theta=10000.0, max_pos=2048, params=dict(rope_type="linear", factor=4.0)),
        dict(name="dynamic_short", theta=10000.0, max_pos=64, params=dict(rope_type="dynamic", factor=2.0), seq=32),
        dict(name="dynamic_long", theta=10000.0, max_pos=64, params=dict(rope_type="dynamic", factor=2.0), seq=200),
        dict(name="llama3", theta=500000.0, max_pos=131072, params=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                                      high_freq_factor=4.0, original_max_position_embeddings=8192)),
        dict(name="yarn", theta=10000.0, max_pos=4096, params=dict(rope_type="yarn", factor=4.0)),
        dict(name="yarn_original", theta=1000000.0, max_pos=40960, params=dict(rope_type="yarn", factor=4.0,
                                                                              original_max_position_embeddings=32768)),
        dict(name="yarn_mscale", theta=10000.0, max_pos=4096, params=dict(rope_type="yarn", factor=8.0, mscale=0.707,
                                                                        mscale_all_dim=0.707, beta_fast=16.0, beta_slow=2.0)),
        dict(name="yarn_attention_factor", theta=10000.0, max_pos=4096, params=dict(rope_type="yarn", factor=2.0, attention_factor=1.5)),
    ]
    res = []
    for c in cases:
        try:
            extra = dict(base, max_position_embeddings=c["max_pos"])
            if "partial" in c:
                extra["partial_rotary_factor"] = c["partial"]
            params = dict(c["params"])
            params.setdefault("rope_type", "default")
            how = "rope_parameters"
            try:
                rp = dict(params, rope_theta=c["theta"])
                if "partial" in c:
                    rp["partial_rotary_factor"] = c["partial"]
                cfg = LlamaConfig(**extra, rope_parameters=rp)
                emb = LlamaRotaryEmbedding(cfg)
                if getattr(emb, "rope_type", params["rope_type"]) != params["rope_type"]:
                    raise ValueError("rope_parameters not honoured")
            except Exception:
                how = "rope_scaling"
                cfg = LlamaConfig(**extra, rope_theta=c["theta"], rope_scaling=params if params["rope_type"] != "default" else None)
                emb = LlamaRotaryEmbedding(cfg)
            seq = c.get("seq", 16)
            head_dim = base["hidden_size"] // base["num_attention_heads"]
            x = torch.zeros(1, seq, head_dim)
            pos = torch.arange(seq)[None]
            cos, sin = emb(x, pos)
            positions = [0, 1, 7, seq - 1]
            res.append(dict(name=c["name"], via=how, theta=c["theta"], head_dim=head_dim, partial=c.get("partial", 1.0),
                            max_pos=c["max_pos"], params=c["params"], seq=seq,
                            inv_freq=emb.inv_freq.float().tolist(), attention_scaling=float(emb.attention_scaling),
                            positions=positions, cos=[cos[0, q].tolist() for q in positions],
                            sin=[sin[0, q].tolist() for q in positions]))
        except Exception as e:
            traceback.print_exc()
            res.append(dict(name=c["name"], error=repr(e)))
    return res


meta = dict(torch=torch.__version__, transformers=transformers.__version__)
optim_path = os.path.join(out_root, "engine/optim/testdata/torch_goldens.json")
rope_path = os.path.join(out_root, "engine/backend/testdata/rope_goldens.json")
os.makedirs(os.path.dirname(optim_path), exist_ok=True)
os.makedirs(os.path.dirname(rope_path), exist_ok=True)
with open(optim_path, "w") as f:
    json.dump(dict(meta=meta, schedules=schedules(), adamw=adamw(), clip=clip()), f, indent=1)
with open(rope_path, "w") as f:
    json.dump(dict(meta=meta, cases=rope()), f, indent=1)
print("wrote", optim_path, rope_path)
