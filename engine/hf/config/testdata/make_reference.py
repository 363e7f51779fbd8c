#!/usr/bin/env python3
"""Produce reference outputs of Hugging Face transformers for the config package tests.

Run with transformers 5.17 installed:

    python3 make_reference.py            # write transformers/ next to this file
    python3 make_reference.py check DIR > transformers/check.json
                                         # load every DIR/*.json written by halo-shell

The first form reads every hub/*.json (config.json files as published on the Hub, written by
transformers 4.x) and writes, for each:

    transformers/saved/NAME.json   what save_pretrained writes after loading it (the 5.x dialect)
    transformers/full/NAME.json    to_dict(): every attribute with defaults resolved
    transformers/defaults/TYPE.json  TypeConfig().to_dict() for each supported model_type

The check form loads each config written by halo-shell with AutoConfig, saves it again with
save_pretrained and reports whether the bytes are identical, then builds the model on the meta
device to prove transformers accepts the shapes. It prints one JSON report on stdout.
"""
import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile

import transformers
from transformers import AutoConfig, CONFIG_MAPPING

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "olmoe",
            "olmo2", "olmo3", "phi3", "granite", "smollm3", "glm4", "qwen2_moe", "glm4_moe",
            "deepseek_v3", "glm4_moe_lite",
            "gemma3_text", "gpt_oss", "gemma4_text", "lfm2_moe", "qwen3_next", "qwen3_5_moe_text",
            "flex_olmo", "granitemoe", "hunyuan_v1_moe", "ernie4_5_moe", "minimax_m2",
            "laguna", "deepseek_v4", "phimoe", "cohere2_moe", "jetmoe"]
HERE = os.path.dirname(os.path.abspath(__file__))


def dump(obj, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def full_dict(cfg):
    return json.loads(cfg.to_json_string(use_diff=False))


def load_saved(path, workdir):
    os.makedirs(workdir, exist_ok=True)
    shutil.copy(path, os.path.join(workdir, "config.json"))
    cfg = AutoConfig.from_pretrained(workdir)
    out = os.path.join(workdir, "saved")
    cfg.save_pretrained(out)
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        return cfg, f.read()


def reference(out):
    from transformers import GenerationConfig

    report = {
        "transformers_version": transformers.__version__,
        "errors": {},
        "generation_params": sorted(GenerationConfig._get_default_generation_params().keys()),
    }
    for path in sorted(glob.glob(os.path.join(HERE, "hub", "*.json"))):
        name = os.path.basename(path)[: -len(".json")]
        with tempfile.TemporaryDirectory() as d:
            try:
                cfg, text = load_saved(path, os.path.join(d, "a"))
                os.makedirs(os.path.join(out, "saved"), exist_ok=True)
                with open(os.path.join(out, "saved", name + ".json"), "w", encoding="utf-8") as f:
                    f.write(text)
                dump(full_dict(cfg), os.path.join(out, "full", name + ".json"))
                _, again = load_saved(os.path.join(out, "saved", name + ".json"), os.path.join(d, "b"))
                report.setdefault("stable", {})[name] = again == text
            except Exception as e:  # record and go on: the report says which failed
                report["errors"][name] = repr(e)
    for mt in FAMILIES:
        try:
            cfg = CONFIG_MAPPING[mt]()
        except Exception as e:  # a model_type this transformers lacks: record it, go on
            report["errors"]["defaults:" + mt] = repr(e)
            continue
        dump(full_dict(cfg), os.path.join(out, "defaults", mt + ".json"))
        with tempfile.TemporaryDirectory() as d:
            cfg.save_pretrained(d)
            os.makedirs(os.path.join(out, "defaults_saved"), exist_ok=True)
            shutil.copy(os.path.join(d, "config.json"), os.path.join(out, "defaults_saved", mt + ".json"))
    dump(report, os.path.join(out, "report.json"))
    print(json.dumps(report, indent=2))


def check(directory):
    import torch
    from transformers import AutoModelForCausalLM

    report = {"transformers_version": transformers.__version__, "files": {}}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        name = os.path.basename(path)
        entry = {}
        with open(path, encoding="utf-8") as f:
            ours = f.read()
        entry["sha256"] = hashlib.sha256(ours.encode("utf-8")).hexdigest()
        with tempfile.TemporaryDirectory() as d:
            try:
                cfg, text = load_saved(path, d)
                entry["resaved_identical"] = text == ours
                if text != ours:
                    entry["resaved"] = text
                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(cfg)
                entry["parameters"] = sum(p.numel() for p in model.parameters())
                entry["class"] = type(model).__name__
                if entry["parameters"] < 5_000_000:
                    # A real model saved by transformers writes the same config.json.
                    model = AutoModelForCausalLM.from_config(cfg)
                    model_dir = os.path.join(d, "model")
                    model.save_pretrained(model_dir)
                    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
                        model_text = f.read()
                    entry["model_saved_identical"] = model_text == ours
                    if model_text != ours:
                        entry["model_saved"] = model_text
                    AutoModelForCausalLM.from_pretrained(model_dir)
                    entry["model_reloaded"] = True
            except Exception as e:
                entry["error"] = repr(e)
        report["files"][name] = entry
    print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        reference(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "transformers"))
