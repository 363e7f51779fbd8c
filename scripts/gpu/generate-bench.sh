#!/usr/bin/env bash
# The sampling benchmark: models.GenerateBatch on the CUDA backend against stock transformers'
# generate, the Qwen3-0.6B shape in bf16 with the same weights, 64 prompts x 32 tokens (the same
# ids), 256 new tokens each, temperature 1 over the whole vocabulary, no stop token, measured in
# one run on one GPU (issue target: at least 2x transformers' new tokens/s).
#
#   CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda   # on the build machine
#   scripts/gpu/generate-bench.sh OUTDIR                              # on the GPU machine
#
# 1. scripts/gpu/generate_torch.py builds the model with transformers (random init, seed 1),
#    saves it to OUTDIR/weights, times generate and writes OUTDIR/torch-generate.json.
# 2. The test binary loads OUTDIR/weights (HALO_GENERATE_BENCH_MODEL) and runs the decoding op
#    tests against the CPU (TestGPUDecodeAttentionMatchesCPU, TestGPUSampleTokensMatchesCPU),
#    the decoders' correctness and host-wait checks (TestGPUGenerate*, TestGPUDecodeStepHostWaits)
#    and TestGPUGenerateThroughput (device decoder, then the host decoder for comparison);
#    its report is OUTDIR/cuda-generate.json, its log OUTDIR/generate-test.log.
# 3. OUTDIR/generate-report.json gathers both engines' tokens/s, the ratio, pass/fail against
#    the target, the host waits per decoding step and every check.
#
# The weights are deleted at the end unless KEEP_WEIGHTS=1. PYTHON overrides the interpreter
# (python3), CUDATEST_BIN the test binary (bin/cudatest).
set -uo pipefail
out=${1:?usage: generate-bench.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${CUDATEST_BIN:-$root/bin/cudatest}
[ -e "$bin" ] && bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
py=${PYTHON:-python3}
"$py" "$root/scripts/gpu/generate_torch.py" --out "$out/torch-generate.json" --save "$out/weights" 2>&1 | tee "$out/torch-generate.log"
trc=${PIPESTATUS[0]}
weights=
[ "$trc" = 0 ] && weights=$out/weights
(cd "$root/engine/backend/cuda" && HALO_CUDA_REPORT="$out/cuda-generate.json" \
	HALO_CUDA_REPORT_COMMAND="scripts/gpu/generate-bench.sh OUTDIR" HALO_GENERATE_BENCH_MODEL="$weights" \
	"$bin" -test.v -test.run 'TestGPU(Generate|DecodeAttention|DecodeStep|SampleTokens)' -test.timeout 540s) 2>&1 | tee "$out/generate-test.log"
rc=${PIPESTATUS[0]}
"$py" - "$out" "$trc" "$rc" <<'PY'
import json, os, sys
out, trc, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{name}: {e}"}
torch, rep = load("torch-generate.json"), load("cuda-generate.json")
bench = {b["name"]: b["values"] for b in rep.get("benchmarks", [])}
ours = bench.get("generate_qwen3_0.6b_shape_b64_p32_new256_bf16", {})
host = bench.get("generate_qwen3_0.6b_shape_b64_p32_new256_bf16_host_decoder", {})
res = {"halo_new_tokens_per_s": ours.get("new_tokens_per_s"), "torch_new_tokens_per_s": torch.get("new_tokens_per_s"),
       "halo_host_decoder_new_tokens_per_s": host.get("new_tokens_per_s"),
       "halo_host_waits_per_step": ours.get("host_waits_per_step"), "target_ratio": 2.0,
       "same_weights": trc == 0, "torch_rc": trc, "test_rc": rc,
       "checks": rep.get("checks", []), "ops": rep.get("ops", []), "torch": torch, "halo": ours, "halo_host_decoder": host}
if res["halo_new_tokens_per_s"] and res["torch_new_tokens_per_s"]:
    res["ratio"] = res["halo_new_tokens_per_s"] / res["torch_new_tokens_per_s"]
else:
    res["ratio"] = None
res["pass"] = bool(res["ratio"] and res["ratio"] >= 2.0 and trc == 0 and rc == 0 and all(c.get("pass") for c in res["checks"]))
with open(os.path.join(out, "generate-report.json"), "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps({k: res[k] for k in ("halo_new_tokens_per_s", "torch_new_tokens_per_s", "ratio",
                                      "halo_host_decoder_new_tokens_per_s", "halo_host_waits_per_step", "pass")}))
PY
[ "${KEEP_WEIGHTS:-}" = 1 ] || rm -rf "$out/weights"
[ "$rc" = 0 ] && rc=$trc
exit "$rc"
