#!/usr/bin/env bash
# Runs the CUDA backend's GPU test suite and benchmarks on a machine with an NVIDIA GPU and
# writes a JSON report. The test binary is built elsewhere (no Go is needed on the GPU machine):
#
#   CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda     # on the build machine
#   scripts/gpu/cuda-tests.sh OUTDIR                                      # on the GPU machine
#
# OUTDIR receives cuda-report.json (ops against the CPU oracle, checks, benchmark figures),
# cuda-test.log (the verbose test output) and nvidia-smi.txt. When bin/halo-shell exists (built
# with CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell) it also writes cuda-info.txt
# (library discovery, kernel build with ptxas resource usage) and cli-logprobs.json (the
# transformers parity fixtures through `halo-shell run logprobs --device cuda` and --device cpu).
#
# It may be run from any directory: the halo-shell steps run at the repository root, the test
# binary in engine/backend/cuda (its package directory, as `go test` would); OUTDIR and
# CUDATEST_BIN are taken relative to the caller's directory.
set -uo pipefail
out=${1:?usage: cuda-tests.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${CUDATEST_BIN:-$root/bin/cudatest}
[ -e "$bin" ] && bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
cd "$root"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
export HALO_CUDA_REPORT="$out/cuda-report.json"
export HALO_CUDA_REPORT_COMMAND="CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda && scripts/gpu/cuda-tests.sh OUTDIR"
export HALO_CUDA_CACHE=${HALO_CUDA_CACHE:-$(mktemp -d)}
if [ -x bin/halo-shell ]; then
	HALO_CUDA_NVRTC_LOG=1 HALO_CUDA_PTXAS_VERBOSE=1 HALO_CUDA_CACHE=$(mktemp -d) \
		bin/halo-shell run cuda-info --compile > "$out/cuda-info.txt" 2>&1
	grep -E '^cuda:|^usable|^kernels|Compiling entry|registers|spill' "$out/cuda-info.txt" | grep -B1 -A1 -E 'mma|usable|kernels' | head -40
	python3 - "$out/cli-logprobs.json" <<'PY'
import json, subprocess, sys, glob, os
res = []
for ref_path in sorted(glob.glob("engine/models/testdata/parity/*/reference.json")):
    d = os.path.dirname(ref_path)
    ref = json.load(open(ref_path))
    ids = " ".join(str(i) for i in ref["input_ids"][0])
    row = {"fixture": os.path.basename(d)}
    for dev in ("cuda", "cpu"):
        p = subprocess.run(["bin/halo-shell", "run", "logprobs", "--device", dev, "--model", d, "--ids", ids],
                           capture_output=True, text=True)
        if p.returncode != 0:
            row[dev + "_error"] = p.stderr.strip()[-300:]
            continue
        lp = [float(x) for x in json.loads(p.stdout)["logprobs"]]
        row[dev + "_max_abs_diff_vs_transformers"] = max(abs(a - b) for a, b in zip(lp, ref["logprobs"][0]))
    res.append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)
for r in res: print(r)
PY
fi
(cd engine/backend/cuda && "$bin" -test.v -test.timeout ${CUDATEST_TIMEOUT:-540s} "${@:2}") 2>&1 | tee "$out/cuda-test.log"
rc=${PIPESTATUS[0]}
grep -E '^(--- FAIL|FAIL|ok|PASS)' "$out/cuda-test.log" | tail -40
exit "$rc"
