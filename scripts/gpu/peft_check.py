#!/usr/bin/env python3
"""Checks halo-shell's LoRA adapters against PEFT, both ways.

1. halo-shell -> PEFT: every case under engine/models/testdata/lora/ is an adapter halo-shell
   trained and saved (adapter_config.json + adapter_model.safetensors) with halo.json, our
   logprobs of its base's ids.json with the adapter applied. This loads the base named by
   base_model_name_or_path (a path relative to the repository root) with
   AutoModelForCausalLM.from_pretrained (float32, eager attention, CPU), applies the adapter
   with PeftModel.from_pretrained, and compares PEFT's logprobs with ours (within TOL). It
   writes PEFT's logprobs to peft.json in the case directory (commit them: the Go test
   TestLoRAGoldens then checks them on every run).
2. PEFT -> halo-shell: over each base checkpoint of engine/models/testdata/saved/ it builds
   an adapter with get_peft_model (LoraConfig as below, lora_B drawn at random so the adapter
   is not the identity), saves it with save_pretrained under OUT/peft_saved/<case>, and runs
   `HALO run logprobs --model BASE --adapter DIR --ids ...`, comparing with PEFT's logprobs.
   It also runs `HALO run merge-lora` on it and compares the merged checkpoint's logprobs,
   loaded in transformers, with PEFT's merge_and_unload.

Usage (from the repository root):
    python3 scripts/gpu/peft_check.py bin/halo-shell OUT_DIR
Writes OUT_DIR/peft_check.json; the exit status is 1 if any check fails.
"""
import json
import os
import subprocess
import sys

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

TOL = 1e-4
LORA_ROOT = "engine/models/testdata/lora"
SAVED_ROOT = "engine/models/testdata/saved"

# Adapters PEFT makes for direction 2: (case, base, LoraConfig keyword arguments).
PEFT_CASES = [
    ("qwen2_qv", "qwen2", dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"])),
    ("llama_tied_all_linear_rslora", "llama_tied", dict(r=2, lora_alpha=3, target_modules="all-linear", use_rslora=True)),
    ("mistral_mlp", "mistral_window", dict(r=3, lora_alpha=5, lora_dropout=0.1, target_modules=["gate_proj", "up_proj", "down_proj"])),
    ("qwen3_pattern", "qwen3_bf16", dict(r=2, lora_alpha=2, target_modules=r"model\.layers\.0\.self_attn\.(q|o)_proj")),
]


def load_base(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def logprobs(model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=x).logits.float(), dim=-1)
    return lp[0, :-1].gather(-1, x[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()


def max_diff(a, b):
    if len(a) != len(b):
        return float("inf")
    return max(abs(x - y) for x, y in zip(a, b))


def halo_logprobs(halo, model, ids, adapter=None):
    cmd = [halo, "run", "logprobs", "--model", model, "--ids", " ".join(map(str, ids))]
    if adapter:
        cmd += ["--adapter", adapter]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["logprobs"]


def halo_to_peft():
    results = []
    for name in sorted(os.listdir(LORA_ROOT)):
        d = os.path.join(LORA_ROOT, name)
        if not os.path.isfile(os.path.join(d, "adapter_config.json")):
            continue
        r = {"direction": "halo->peft", "case": name}
        try:
            cfg = json.load(open(os.path.join(d, "adapter_config.json")))
            ours = json.load(open(os.path.join(d, "halo.json")))
            model = PeftModel.from_pretrained(load_base(cfg["base_model_name_or_path"]), d)
            model.eval()
            got = logprobs(model, ours["input_ids"])
            r["max_abs_diff"] = max_diff(got, ours["logprobs"])
            r["ok"] = r["max_abs_diff"] <= TOL
            with open(os.path.join(d, "peft.json"), "w") as f:
                json.dump({"input_ids": ours["input_ids"], "logprobs": got, "peft_version": peft.__version__,
                           "transformers_version": transformers.__version__, "torch_version": torch.__version__}, f)
        except Exception as e:  # a failing case is reported, the others still run
            r["ok"], r["error"] = False, repr(e)
        results.append(r)
    return results


def peft_to_halo(halo, out):
    results = []
    for name, base, kw in PEFT_CASES:
        r = {"direction": "peft->halo", "case": name}
        try:
            base_dir = os.path.join(SAVED_ROOT, base)
            ids = json.load(open(os.path.join(base_dir, "ids.json")))["input_ids"]
            torch.manual_seed(1234)
            model = get_peft_model(load_base(base_dir), LoraConfig(task_type="CAUSAL_LM", **kw))
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.normal_(0, 0.2)
            model.eval()
            want = logprobs(model, ids)
            d = os.path.join(out, "peft_saved", name)
            model.save_pretrained(d)
            got = halo_logprobs(halo, base_dir, ids, adapter=d)
            r["max_abs_diff"] = max_diff(got, want)
            merged_dir = os.path.join(out, "merged", name)
            subprocess.run([halo, "run", "merge-lora", "--base", base_dir, "--adapter", d, "--out", merged_dir,
                            "--dtype", "f32"], check=True, capture_output=True, text=True)
            merged = logprobs(load_base(merged_dir), ids)
            peft_merged = logprobs(model.merge_and_unload(), ids)
            r["merged_max_abs_diff"] = max_diff(merged, peft_merged)
            r["ok"] = r["max_abs_diff"] <= TOL and r["merged_max_abs_diff"] <= TOL
        except Exception as e:
            r["ok"], r["error"] = False, repr(e)
        results.append(r)
    return results


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    halo, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.makedirs(out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    results = halo_to_peft() + peft_to_halo(halo, out)
    report = {"peft_version": peft.__version__, "transformers_version": transformers.__version__,
              "torch_version": torch.__version__, "tolerance": TOL, "results": results}
    with open(os.path.join(out, "peft_check.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
