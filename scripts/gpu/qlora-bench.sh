#!/usr/bin/env bash
# The LoRA and QLoRA benchmark on the Qwen3-4B shape (r 16, alpha 32, all-linear, no dropout,
# gradient checkpointing, batch 1 x 4096 tokens), measured in one run on one GPU from the same
# initial weights on the same token rows:
#
#   CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell     # on the build machine
#   scripts/gpu/qlora-bench.sh OUTDIR                             # on the GPU machine
#
# 1. python3 scripts/gpu/lora_torch.py: transformers builds the model (random init, bf16, sdpa),
#    saves it to OUTDIR/init, writes OUTDIR/tokens.jsonl and trains bf16 LoRA with PEFT
#    -> OUTDIR/torch-peft.json (the baseline's tokens/s and peak memory).
# 2. bin/halo-shell run bench-train on the same weights and rows, each in its own process, with
#    fp32 adapters and AdamW state (--optim adamw_torch), as PEFT upcasts adapters over a bf16 base:
#      lora        bf16 LoRA                                          -> OUTDIR/halo-lora.json
#      qlora       the base's linears in NF4 (double quantisation)    -> OUTDIR/halo-qlora.json
#      qlora-sm86  QLoRA with HALO_CUDA_ARCH=sm_86 (the RTX 3090/4090 code paths) under a
#                  22 GiB device memory cap                           -> OUTDIR/halo-qlora-sm86.json
# 3. OUTDIR/qlora-report.json: the figures, the ratios and each target's pass/fail:
#      QLoRA peak allocated <= 6.5 GiB; QLoRA trains under the cap on the sm_86 paths;
#      bf16 LoRA tokens/s >= 1.5x PEFT's at a peak <= 0.7x PEFT's.
#
# Options: --steps N [10] --warmup N [2] --batch N [1] --seq-len N [4096] --layers N (smoke runs)
#          --r N [16] --alpha X [32] --cap-gib X [22]
# Smoke run (a minute): scripts/gpu/qlora-bench.sh /tmp/q --steps 3 --seq-len 512 --layers 2
# HALO_BIN overrides the binary, PYTHON the interpreter; HALO_REVISION the revision recorded.
set -uo pipefail
out=${1:?usage: qlora-bench.sh OUTDIR [--steps N] [--warmup N] [--batch N] [--seq-len N] [--layers N] [--r N] [--alpha X] [--cap-gib X]}
shift
command_line="scripts/gpu/qlora-bench.sh $out $*"
steps=10 warmup=2 batch=1 seqlen=4096 layers=0 r=16 alpha=32 cap=22
while [ $# -gt 0 ]; do
	case $1 in
	--steps) steps=$2 ;;
	--warmup) warmup=$2 ;;
	--batch) batch=$2 ;;
	--seq-len) seqlen=$2 ;;
	--layers) layers=$2 ;;
	--r) r=$2 ;;
	--alpha) alpha=$2 ;;
	--cap-gib) cap=$2 ;;
	*)
		echo "qlora-bench.sh: unknown option $1" >&2
		exit 2
		;;
	esac
	shift 2 || {
		echo "qlora-bench.sh: $1 needs a value" >&2
		exit 2
	}
done
bin=${HALO_BIN:-bin/halo-shell}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$bin" ]; then
	echo "qlora-bench.sh: $bin not found: build it with CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell" >&2
	exit 2
fi
mkdir -p "$out"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
export HALO_CUDA_CACHE=${HALO_CUDA_CACHE:-$out/kernel-cache}
export PYTHONUNBUFFERED=1
layer_flag=()
[ "$layers" != 0 ] && layer_flag=(--layers "$layers")
echo "== torch + PEFT, bf16 LoRA"
"$py" "$here/lora_torch.py" --out "$out" --steps "$steps" --warmup "$warmup" --batch "$batch" --seq-len "$seqlen" \
	--r "$r" --alpha "$alpha" "${layer_flag[@]}" 2>&1 | tee "$out/torch-peft.log"
if [ ! -f "$out/init/config.json" ]; then
	echo "== the baseline wrote no weights; halo-shell needs them"
	exit 1
fi
common=(run bench-train --model "$out/init" --data "$out/tokens.jsonl" --device cuda --steps "$steps" --warmup "$warmup"
	--batch "$batch" --seq-len "$seqlen" --lr 1e-4 --lora-r "$r" --lora-alpha "$alpha" --gradient-checkpointing
	--optim adamw_torch)
echo "== halo-shell, bf16 LoRA"
"$bin" "${common[@]}" --out "$out/halo-lora.json" 2>&1 | tee "$out/halo-lora.log"
echo "== halo-shell, QLoRA"
"$bin" "${common[@]}" --load-in-4bit --out "$out/halo-qlora.json" 2>&1 | tee "$out/halo-qlora.log"
echo "== halo-shell, QLoRA on the sm_86 paths under a $cap GiB cap"
HALO_CUDA_ARCH=sm_86 "$bin" "${common[@]}" --load-in-4bit --max-device-memory-gib "$cap" \
	--out "$out/halo-qlora-sm86.json" 2>&1 | tee "$out/halo-qlora-sm86.log"
[ "${KEEP_WEIGHTS:-0}" = 1 ] || rm -rf "$out/init"
rev=${HALO_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
"$py" - "$out" "$command_line" "$rev" "$cap" <<'PY'
import json, os, sys
out, command, rev, cap = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError) as e:
        return {"error": str(e)}
def fig(r):
    if "error" in r:
        return {"error": r["error"]}
    m = r.get("memory", {})
    return {"tokens_per_s": r.get("tokens_per_s"), "peak_allocated_gib": m.get("peak_allocated_gib"),
            "losses": r.get("losses") or [s.get("loss") for s in r.get("steps", [])]}
torch_r, lora, qlora, sm86 = (load(n) for n in ("torch-peft.json", "halo-lora.json", "halo-qlora.json", "halo-qlora-sm86.json"))
rep = {"command": command, "revision": rev, "gpu": torch_r.get("gpu"), "versions": torch_r.get("versions"),
       "settings": torch_r.get("settings"),
       "torch_peft_lora": fig(torch_r), "halo_lora": fig(lora), "halo_qlora": fig(qlora),
       "halo_qlora_sm86_capped": dict(fig(sm86), cap_gib=cap)}
checks = []
def ok(v):
    return v is not None
q = rep["halo_qlora"].get("peak_allocated_gib")
checks.append({"target": "QLoRA peak allocated <= 6.5 GiB", "value": q, "pass": ok(q) and q <= 6.5})
s = rep["halo_qlora_sm86_capped"]
checks.append({"target": f"QLoRA trains on the sm_86 paths under a {cap:g} GiB cap", "value": s.get("tokens_per_s"),
               "pass": "error" not in s and ok(s.get("tokens_per_s"))})
ht, tt = rep["halo_lora"].get("tokens_per_s"), rep["torch_peft_lora"].get("tokens_per_s")
hm, tm = rep["halo_lora"].get("peak_allocated_gib"), rep["torch_peft_lora"].get("peak_allocated_gib")
speed = ht / tt if ok(ht) and ok(tt) and tt else None
mem = hm / tm if ok(hm) and ok(tm) and tm else None
checks.append({"target": "bf16 LoRA tokens/s >= 1.5x torch+PEFT", "value": speed, "pass": ok(speed) and speed >= 1.5})
checks.append({"target": "bf16 LoRA peak <= 0.7x torch+PEFT", "value": mem, "pass": ok(mem) and mem <= 0.7})
rep["checks"] = checks
json.dump(rep, open(os.path.join(out, "qlora-report.json"), "w"), indent=1)
for k in ("torch_peft_lora", "halo_lora", "halo_qlora", "halo_qlora_sm86_capped"):
    f = rep[k]
    print(f"{k:24s} tok/s {f.get('tokens_per_s')}  peak {f.get('peak_allocated_gib')} GiB  {f.get('error', '')}")
for c in checks:
    print(("PASS " if c["pass"] else "FAIL ") + c["target"] + f" ({c['value']})")
PY
