#!/usr/bin/env python3
"""Load checkpoints saved by halo-shell with transformers and record transformers' logprobs.

For every case directory under the given root that holds config.json, model weights and
ids.json ({"input_ids": [...]}) this loads the model with AutoModelForCausalLM.from_pretrained
(float32, eager attention, on the CPU) and writes transformers.json next to it:
{"input_ids": [...], "logprobs": [log p(ids[t] | ids[:t]) for t >= 1], "transformers_version",
"torch_version", "missing_or_unexpected": [...]}. The Go test
TestSavedCheckpointsLoadInTransformers compares these with halo-shell's own logprobs.

Usage: python3 check_transformers.py ROOT
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

torch.use_deterministic_algorithms(True)


def torch_linear_attention(model):
    """Run gated delta-net layers (qwen3_next, qwen3_5_moe_text) on transformers' torch
    fallbacks, whatever kernels the machine has: the model runs on the CPU."""
    import importlib
    mod = importlib.import_module(type(model).__module__)
    chunk = getattr(mod, "torch_chunk_gated_delta_rule", None)
    recurrent = getattr(mod, "torch_recurrent_gated_delta_rule", None)
    for m in model.modules():
        if hasattr(m, "causal_conv1d_fn"):
            m.causal_conv1d_fn = None
        if chunk is not None and hasattr(m, "chunk_gated_delta_rule"):
            m.chunk_gated_delta_rule = chunk
        if recurrent is not None and hasattr(m, "recurrent_gated_delta_rule"):
            m.recurrent_gated_delta_rule = recurrent


def main(root):
    summary = []
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.exists(os.path.join(d, "ids.json")):
            continue
        ids = json.load(open(os.path.join(d, "ids.json")))["input_ids"]
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        except Exception as e:  # record it and go on with the other cases (no transformers.json)
            summary.append({"case": name, "error": repr(e)})
            continue
        if model.config.model_type in ("qwen3_next", "qwen3_5_moe_text"):
            torch_linear_attention(model)
        model.eval()
        x = torch.tensor([ids])
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=x).logits.float(), dim=-1)
        vals = lp[0, :-1].gather(-1, x[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()
        problems = sorted(set(info.get("missing_keys", [])) | set(info.get("unexpected_keys", [])))
        out = {"input_ids": ids, "logprobs": vals, "transformers_version": transformers.__version__,
               "torch_version": torch.__version__, "missing_or_unexpected": problems}
        with open(os.path.join(d, "transformers.json"), "w") as f:
            json.dump(out, f)
        summary.append({"case": name, "class": type(model).__name__, "problems": problems})
    print(json.dumps(summary, indent=1))
    return 1 if any(s.get("problems") or s.get("error") for s in summary) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
