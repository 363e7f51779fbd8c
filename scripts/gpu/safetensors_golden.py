#!/usr/bin/env python3
"""Reference files for engine/hf/safetensors, made by the Python safetensors library and transformers.

Run from the repository root on a machine with torch, safetensors and transformers:

    python3 scripts/gpu/safetensors_golden.py OUTDIR

It writes:

  OUTDIR/reference/<case>.safetensors
      safetensors.torch.save_file() of every case in engine/hf/safetensors/testdata/cases.json
      (the same tensors and metadata the Go writer's golden test serializes).
  OUTDIR/reference/sharded/
      a tiny random LlamaForCausalLM in bfloat16 saved by transformers' save_pretrained with a
      small max_shard_size: model-0000i-of-0000n.safetensors + model.safetensors.index.json (and
      config.json), plus order.json: {"max_shard_size": bytes, "state_dict_order": [names]}, so
      the Go test can re-save the same tensors in the same order and compare every byte.
  OUTDIR/report.json
      library versions, per case whether it was written, and whether the Go writer's committed
      goldens (engine/hf/safetensors/testdata/golden) load in Python with the same values.

Copy OUTDIR/reference/* into engine/hf/safetensors/testdata/reference/ and commit it; the Go
tests then require byte equality with these files.
"""
import json
import os
import sys

import safetensors
import torch
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "engine", "hf", "safetensors", "testdata")

DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}

MAX_SHARD = "3KB"  # transformers reads KB as 1000 bytes
MAX_SHARD_BYTES = 3000


def tensor_of(spec):
    dt = getattr(torch, DTYPES[spec["dtype"]])
    data = bytes.fromhex(spec["hex"])
    if not data:
        return torch.empty(spec["shape"], dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=dt).reshape(spec["shape"]).clone()


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write_cases(out, report):
    cases = json.load(open(os.path.join(PKG, "cases.json")))
    for c in cases:
        r = {"case": c["case"]}
        try:
            tensors = {s["name"]: tensor_of(s) for s in c["tensors"]}
            save_file(tensors, os.path.join(out, c["case"] + ".safetensors"), metadata=c["metadata"])
            r["written"] = True
        except Exception as e:  # report and go on: one dtype the library lacks must not hide the rest
            r["written"] = False
            r["error"] = repr(e)
        r.update(check_go_golden(c))
        report["cases"].append(r)


def check_go_golden(c):
    """Loads the Go writer's golden file for case c with the Python library and compares values."""
    path = os.path.join(PKG, "golden", c["case"] + ".safetensors")
    if not os.path.exists(path):
        return {"go_golden": "missing"}
    try:
        with safe_open(path, framework="pt") as f:
            md = f.metadata()
            want_md = c["metadata"]
            if (md or {}) != (want_md or {}):
                return {"go_golden": "metadata differs: %r vs %r" % (md, want_md)}
            if sorted(f.keys()) != sorted(s["name"] for s in c["tensors"]):
                return {"go_golden": "names differ: %r" % sorted(f.keys())}
            for s in c["tensors"]:
                t = f.get_tensor(s["name"])
                if str(t.dtype) != "torch." + DTYPES[s["dtype"]] or list(t.shape) != s["shape"]:
                    return {"go_golden": "tensor %r is %s %s" % (s["name"], t.dtype, list(t.shape))}
                if raw_bytes(t) != bytes.fromhex(s["hex"]):
                    return {"go_golden": "tensor %r bytes differ" % s["name"]}
        return {"go_golden": "ok"}
    except Exception as e:
        return {"go_golden": "error: %r" % (e,)}


def write_sharded(out, report):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    d = os.path.join(out, "sharded")
    model.save_pretrained(d, max_shard_size=MAX_SHARD)
    order = list(model.state_dict().keys())
    json.dump({"max_shard_size": MAX_SHARD_BYTES, "state_dict_order": order},
              open(os.path.join(d, "order.json"), "w"), indent=2)
    report["sharded"] = sorted(os.listdir(d))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.join(sys.argv[1], "reference")
    os.makedirs(out, exist_ok=True)
    report = {"safetensors": safetensors.__version__, "torch": torch.__version__, "cases": []}
    try:
        import transformers
        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    write_cases(out, report)
    try:
        write_sharded(out, report)
    except Exception as e:
        report["sharded_error"] = repr(e)
    json.dump(report, open(os.path.join(sys.argv[1], "report.json"), "w"), indent=2)
    print(json.dumps(report, indent=2))
    bad = [c for c in report["cases"] if not c.get("written") or c.get("go_golden") != "ok"]
    sys.exit(1 if bad or "sharded_error" in report else 0)


if __name__ == "__main__":
    main()
