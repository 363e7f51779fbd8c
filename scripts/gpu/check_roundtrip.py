#!/usr/bin/env python3
"""Checks that checkpoints written by halo-shell load in transformers and agree with halo-shell.

Each subdirectory of ROOT is a checkpoint written by halo-shell (config.json, *.safetensors,
optionally a tokenizer) holding halo_logprobs.json: {"ids": [...], "logprobs": [...]} as printed
by `halo-shell run logprobs`. This loads every checkpoint with transformers'
AutoModelForCausalLM.from_pretrained (float32, CPU, eager attention), recomputes the logprobs of
the same ids and reports the largest absolute difference. It also re-saves each model with
transformers into ROOT/<name>.resaved so the other direction can be checked by halo-shell.

Usage: python3 check_roundtrip.py ROOT REPORT.json   (exit status 1 if any check fails)
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

TOL = 1e-4


def main():
    root, report_path = sys.argv[1], sys.argv[2]
    results = []
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        ref_path = os.path.join(d, "halo_logprobs.json")
        if not os.path.isfile(ref_path):
            continue
        r = {"case": name}
        try:
            ref = json.load(open(ref_path))
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
            model.eval()
            ids = torch.tensor([ref["ids"]])
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
            got = lp[0, :-1].gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
            want = torch.tensor(ref["logprobs"])
            r["model_type"] = model.config.model_type
            r["n_params"] = sum(p.numel() for p in model.parameters())
            r["max_abs_diff"] = (got - want).abs().max().item()
            r["ok"] = r["max_abs_diff"] <= TOL
            model.save_pretrained(d + ".resaved", safe_serialization=True)
        except Exception as e:  # report every case, do not stop at the first failure
            r["ok"] = False
            r["error"] = repr(e)
        print(json.dumps(r), flush=True)
        results.append(r)
    report = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
              "tolerance": TOL, "results": results}
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)
    return 0 if results and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
