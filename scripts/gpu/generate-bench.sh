#!/usr/bin/env bash
# The sampling benchmark: models.GenerateBatch on the CUDA backend against stock transformers'
# generate, the Qwen3-0.6B shape in bf16, 64 prompts x 32 tokens, 256 new tokens each,
# temperature 1 over the whole vocabulary, measured in one run on one GPU (issue target: 2x).
#
#   CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda   # on the build machine
#   scripts/gpu/generate-bench.sh OUTDIR                              # on the GPU machine
#
# OUTDIR receives torch-generate.json (scripts/gpu/generate_torch.py), cuda-generate.json
# (the test binary's report: TestGPUGenerateBatchMatchesUncached, a correctness check of the
# batched KV cache on the GPU, and TestGPUGenerateThroughput), generate-test.log and
# generate-report.json with the ratio. PYTHON overrides the interpreter (python3),
# CUDATEST_BIN the test binary (bin/cudatest).
set -uo pipefail
out=${1:?usage: generate-bench.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${CUDATEST_BIN:-$root/bin/cudatest}
[ -e "$bin" ] && bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
"${PYTHON:-python3}" "$root/scripts/gpu/generate_torch.py" --out "$out/torch-generate.json"
(cd "$root/engine/backend/cuda" && HALO_CUDA_REPORT="$out/cuda-generate.json" \
	HALO_CUDA_REPORT_COMMAND="scripts/gpu/generate-bench.sh OUTDIR" \
	"$bin" -test.v -test.run 'TestGPUGenerate' -test.timeout 300s) 2>&1 | tee "$out/generate-test.log"
rc=${PIPESTATUS[0]}
"${PYTHON:-python3}" - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
torch = json.load(open(os.path.join(out, "torch-generate.json")))
rep = json.load(open(os.path.join(out, "cuda-generate.json")))
ours = next(b for b in rep.get("benchmarks", []) if b["name"].startswith("generate_qwen3_0.6b"))["values"]
res = {"halo_new_tokens_per_s": ours["new_tokens_per_s"], "torch_new_tokens_per_s": torch["new_tokens_per_s"],
       "ratio": ours["new_tokens_per_s"] / torch["new_tokens_per_s"], "target_ratio": 2.0,
       "checks": rep.get("checks", []), "torch": torch}
res["pass"] = res["ratio"] >= 2.0
json.dump(res, open(os.path.join(out, "generate-report.json"), "w"), indent=1)
print(json.dumps({k: res[k] for k in ("halo_new_tokens_per_s", "torch_new_tokens_per_s", "ratio", "pass")}))
PY
exit "$rc"
