"""Times PyTorch's bf16 GEMMs for the projections of one transformer layer, as nn.Linear runs
them in training (forward x @ W^T, input gradient dy @ W, weight gradient dy^T @ x), at 16384
tokens: the baseline for TestGPULayerGEMMThroughput's figures of halo-shell's cuBLASLt GEMMs.

    python3 scripts/gpu/gemm_torch.py [--out FILE]

Prints one line per GEMM and per-layer sums; --out writes them as JSON. Median of 10 timed
repetitions of 5 calls each, with CUDA events, after 3 warm-up calls.
"""
import argparse
import json

import torch

SHAPES = {
    "gemm_qwen3_0.6b_layer_16384_tokens": [("q_proj", 2048, 1024), ("k_proj", 1024, 1024), ("v_proj", 1024, 1024),
                                           ("o_proj", 1024, 2048), ("gate_proj", 3072, 1024), ("up_proj", 3072, 1024),
                                           ("down_proj", 1024, 3072)],
    "gemm_llama3.2_1b_layer_16384_tokens": [("q_proj", 2048, 2048), ("k_proj", 512, 2048), ("v_proj", 512, 2048),
                                            ("o_proj", 2048, 2048), ("gate_proj", 8192, 2048), ("up_proj", 8192, 2048),
                                            ("down_proj", 2048, 8192)],
}


def timed(f, reps=5, rounds=10):
    for _ in range(3):
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(rounds):
        start.record()
        for _ in range(reps):
            f()
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end) / reps)
    ms.sort()
    return ms[len(ms) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--tokens", type=int, default=16384)
    a = ap.parse_args()
    M = a.tokens
    res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "tokens": M, "benches": {}}
    for bench, lins in SHAPES.items():
        vals, layer = {}, 0.0
        for name, O, I in lins:
            x = torch.randn(M, I, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(O, I, device="cuda", dtype=torch.bfloat16) * 0.02
            dy = torch.randn(M, O, device="cuda", dtype=torch.bfloat16)
            flops = 2.0 * M * O * I
            for kind, f in (("fwd", lambda: x @ w.t()), ("dx", lambda: dy @ w), ("dw", lambda: dy.t() @ x)):
                ms = timed(f)
                vals[f"{name}_{kind}_ms"] = ms
                vals[f"{name}_{kind}_tflops"] = flops / (ms * 1e-3) / 1e12
                layer += ms
                print(f"{bench} {name} {kind} M={M} O={O} I={I}: torch {ms:.3f} ms {flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s")
        vals["layer_all_gemms_ms"] = layer
        print(f"{bench}: torch per-layer GEMMs {layer:.3f} ms")
        res["benches"][bench] = vals
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
