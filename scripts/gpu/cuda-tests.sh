#!/usr/bin/env bash
# Runs the CUDA backend's GPU test suite and benchmarks on a machine with an NVIDIA GPU and
# writes a JSON report. The test binary is built elsewhere (no Go is needed on the GPU machine):
#
#   CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda     # on the build machine
#   scripts/gpu/cuda-tests.sh OUTDIR                                      # on the GPU machine
#
# OUTDIR receives cuda-report.json (ops against the CPU oracle, checks, benchmark figures),
# cuda-test.log (the verbose test output) and nvidia-smi.txt.
set -uo pipefail
out=${1:?usage: cuda-tests.sh OUTDIR}
bin=${CUDATEST_BIN:-bin/cudatest}
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
export HALO_CUDA_REPORT="$out/cuda-report.json"
export HALO_CUDA_REPORT_COMMAND="CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda && scripts/gpu/cuda-tests.sh OUTDIR"
export HALO_CUDA_CACHE=${HALO_CUDA_CACHE:-$(mktemp -d)}
"$bin" -test.v -test.timeout ${CUDATEST_TIMEOUT:-540s} "${@:2}" 2>&1 | tee "$out/cuda-test.log"
rc=${PIPESTATUS[0]}
grep -E '^(--- FAIL|FAIL|ok|PASS)' "$out/cuda-test.log" | tail -40
exit "$rc"
