#!/usr/bin/env bash
# The GPU run of the training methods (issue 22), in one call on the GPU machine:
#
#   CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda     # on the build machine
#   CGO_ENABLED=0 go test -c -o bin/traintest ./engine/train
#   CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell
#   scripts/gpu/methods-gpu.sh OUTDIR                                   # on the GPU machine
#
# 1. methods/: the torch references of the preference and reward losses
#    (scripts/gpu/methods_ref.py, written into engine/train/testdata/methods of this tree and
#    copied to OUTDIR/methods to be committed), then TestMethodsMatchTorchGoldens against them
#    (bin/traintest, run in engine/train; methods-golden.log).
# 2. generate/: the sampling benchmark against transformers' generate on the same weights
#    (scripts/gpu/generate-bench.sh; generate/generate-report.json holds the ratio).
# 3. grpo-cuda/: `halo-shell launch grpo examples/grpo-arithmetic.yaml --device=cuda` (the
#    run's metrics.jsonl and log; the model it writes is deleted).
#
# OUTDIR/methods-gpu-report.json gathers each part's exit status with the benchmark's figures
# and the last GRPO step. A part whose binary is missing is recorded as skipped. PYTHON
# overrides the interpreter (python3).
set -uo pipefail
out=${1:?usage: methods-gpu.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
cd "$root"

golden_rc=skipped ref_rc=skipped gen_rc=skipped grpo_rc=skipped
"$py" scripts/gpu/methods_ref.py --out engine/train/testdata/methods > "$out/methods-ref.log" 2>&1
ref_rc=$?
if [ "$ref_rc" = 0 ]; then
	rm -rf "$out/methods" && cp -r engine/train/testdata/methods "$out/methods"
	if [ -x bin/traintest ]; then
		(cd engine/train && ../../bin/traintest -test.v -test.run 'TestMethodsMatchTorchGoldens' -test.timeout 300s) > "$out/methods-golden.log" 2>&1
		golden_rc=$?
	fi
fi
tail -5 "$out/methods-ref.log"

if [ -x bin/cudatest ]; then
	scripts/gpu/generate-bench.sh "$out/generate"
	gen_rc=$?
fi

if [ -x bin/halo-shell ]; then
	bin/halo-shell launch grpo examples/grpo-arithmetic.yaml --device=cuda --output_dir="$out/grpo-cuda" \
		--save_steps=0 > "$out/grpo-cuda.log" 2>&1
	grpo_rc=$?
	tail -12 "$out/grpo-cuda.log"
	# Keep the metrics and the log, not the weights.
	find "$out/grpo-cuda" -name '*.safetensors' -delete 2>/dev/null
fi

"$py" - "$out" "$ref_rc" "$golden_rc" "$gen_rc" "$grpo_rc" <<'PY'
import json, os, sys
out = sys.argv[1]
rc = dict(zip(["methods_ref", "methods_golden_test", "generate_bench", "grpo_cuda"], sys.argv[2:]))
res = {"exit_status": rc}
try:
    with open(os.path.join(out, "generate", "generate-report.json")) as f:
        g = json.load(f)
    res["generate"] = {k: g.get(k) for k in ("halo_new_tokens_per_s", "torch_new_tokens_per_s", "ratio",
                                             "halo_host_decoder_new_tokens_per_s", "halo_host_waits_per_step", "pass")}
    res["generate"]["failed_checks"] = [c["name"] for c in g.get("checks", []) if not c.get("pass")]
except (OSError, ValueError) as e:
    res["generate"] = {"error": str(e)}
try:
    with open(os.path.join(out, "grpo-cuda", "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    res["grpo_cuda"] = {"steps": len(rows), "first": rows[0] if rows else None, "last": rows[-1] if rows else None}
except (OSError, ValueError) as e:
    res["grpo_cuda"] = {"error": str(e)}
with open(os.path.join(out, "methods-gpu-report.json"), "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps({"exit_status": rc, "generate": res["generate"]}))
PY
for r in "$ref_rc" "$golden_rc" "$gen_rc" "$grpo_rc"; do
	[ "$r" = 0 ] || [ "$r" = skipped ] || exit 1
done
exit 0
