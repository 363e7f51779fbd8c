#!/usr/bin/env bash
# Tests the non-Hopper code paths (A100 = sm_80, RTX 3090 = sm_86, RTX 4090 = sm_89) on a Hopper
# GPU and writes the logs under OUTDIR. Test binaries are built elsewhere (no Go is needed on the
# GPU machine):
#
#   CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda      # on the build machine
#   CGO_ENABLED=0 go test -c -o bin/traintest ./engine/train            # (optional)
#   scripts/gpu/consumer-arch.sh OUTDIR                                 # on the GPU machine
#
# 1. TestNVRTCCompilesEveryArch (native): every kernel file compiled by NVRTC for sm_80, sm_86,
#    sm_89 and sm_90 (ptxas included) and as PTX for compute_86 -> OUTDIR/nvrtc-archs.log.
# 2. The op tests against the CPU oracle with HALO_CUDA_ARCH=sm_86 (kernels built as PTX for
#    sm_86, no warpgroup attention, the 99 KiB shared-memory limit enforced), and
#    TestGPUEmulatedArch, which checks that the emulation is in effect -> OUTDIR/sm_86.log.
#    sm_89 compiles the same source to the same paths (no kernel reads __CUDA_ARCH__), and sm_80
#    differs only in its larger shared-memory limit, so sm_86 stands for all three.
# 3. With bin/traintest: TestLoRAOnGPUMatchesCPU and TestQLoRAOnGPUMatchesCPU under HALO_CUDA_ARCH=sm_86 -> OUTDIR/train-sm_86.log.
#
# ARCH overrides the emulated architecture (sm_86); CUDATEST_TIMEOUT the test binary's timeout.
set -uo pipefail
out=${1:?usage: consumer-arch.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
arch=${ARCH:-sm_86}
if [ ! -x bin/cudatest ]; then
	echo "consumer-arch.sh: bin/cudatest not found: build it with CGO_ENABLED=0 go test -c -o bin/cudatest ./engine/backend/cuda" >&2
	exit 2
fi
export HALO_CUDA_CACHE=${HALO_CUDA_CACHE:-$(mktemp -d)}
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
rc=0
(cd engine/backend/cuda && ../../../bin/cudatest -test.v -test.timeout 300s -test.run '^TestNVRTCCompilesEveryArch$') \
	>"$out/nvrtc-archs.log" 2>&1 || rc=1
tail -3 "$out/nvrtc-archs.log"
ops='^(TestGPUEmulatedArch|TestGPUGEMM|TestGPULinear|TestGPURMSNorm|TestGPURMSNormVectorised|TestGPUEmbedding|TestGPURoPE|TestGPUSwiGLU|TestGPUSwiGLUPacked|TestGPUCrossEntropy|TestGPUCrossEntropyPaths|TestGPUCrossEntropyScratch|TestGPUAttention|TestGPUAttentionTiles|TestGPUAttentionDecode|TestGPUAdamW|TestGPUElementwise|TestGPUAddVectorised|TestGPUDequantNF4|TestGPUDropout|TestGPUGroupedGEMM|TestGPUMoERoute|TestGPUMoERouteBackward|TestGPUMoEPermute|TestGPUMoECombine|TestGPUModelParity|TestGPUEmptyUnclearedMatchesAlloc|TestGPUKernelCache)$'
(cd engine/backend/cuda && HALO_CUDA_ARCH=$arch ../../../bin/cudatest -test.v -test.timeout ${CUDATEST_TIMEOUT:-420s} -test.run "$ops") \
	>"$out/$arch.log" 2>&1 || rc=1
grep -E '^(--- FAIL|--- SKIP|FAIL|ok|PASS)' "$out/$arch.log" | tail -30
if [ -x bin/traintest ]; then
	(cd engine/train && HALO_CUDA_ARCH=$arch ../../bin/traintest -test.v -test.timeout 300s -test.run '^(TestLoRAOnGPUMatchesCPU|TestQLoRAOnGPUMatchesCPU)$') \
		>"$out/train-$arch.log" 2>&1 || rc=1
	tail -3 "$out/train-$arch.log"
fi
exit "$rc"
