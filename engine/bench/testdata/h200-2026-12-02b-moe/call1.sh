# Call 1: GPU correctness of the unrun kernels/families (3 parallel streams), then MoE bench 4L.
set -u
T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; logs=/tmp/logs1; mkdir -p $logs bin
for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
t() { # stream label timeout regex [env]
  local to=$3; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "### $2 skipped (time)" >> $logs/summary.txt; return; }
  echo "### $2" >> $logs/t-$1.log; local s=$(date +%s)
  (cd $root/engine/backend/cuda && env HALO_CUDA_CACHE=/tmp/kc$1 ${5:-X=1} timeout $to $root/bin/cudatest -test.v -test.run "$4" -test.timeout $(( to - 3 ))s >> $logs/t-$1.log 2>&1)
  echo "### $2 rc=$? $(( $(date +%s) - s ))s" | tee -a $logs/summary.txt >> $logs/t-$1.log
}
nvidia-smi -L > $logs/summary.txt
( t a families 240 '^TestGPUFamiliesMatchCPU$'; t a latent 90 '^TestGPULatentModelsMatchCPU$'; t a moe-train 120 'TestGPUMoETrainingMatchesCPU|TestGPUMoERoute|TestGPUMoEPermute|TestGPUMoECombine' ) &
( t b parity 240 '^TestGPUModelParity$'; t b convdelta 90 'TestGPUShortConv|TestGPUGatedDelta|TestGPURMSNorm|TestGPUGeGLU|TestGPUSwiGLUClamped|TestGPUCrossEntropySoftcap' ) &
( t c nvrtc 60 '^TestNVRTCCompilesEveryArch$'; t c attn 200 '^TestGPUAttention$|TestGPUAttentionDecode|TestGPUAttentionSinks|TestGPUDecodeAttentionMatchesCPU'; t c gg-tma 70 '^TestGPUGroupedGEMM$' HALO_CUDA_GROUPED_GEMM=wg-tma; t c gg-auto 70 '^TestGPUGroupedGEMM$' ) &
wait
for s in a b c; do grep -E "^(--- |    --- |        --- )FAIL|panic:|^FAIL" $logs/t-$s.log | head -40 >> $logs/summary.txt; done; pack
t c wide 60 'TestGPUAttentionWideThroughput'
to=$(( $(left) - 5 ))
if [ $to -gt 90 ]; then
  HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m1 --cases qwen3-30b-a3b:4:4x2048 --steps 20 --warmup 3 --variants wg-tma > $logs/moe1.txt 2>&1
  echo "moe-bench-4l rc=$?" >> $logs/summary.txt; grep -A3 "^shape " $logs/moe1.txt >> $logs/summary.txt
  (cd /tmp/m1 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe1.tgz -T -)
fi
pack; cat $logs/summary.txt
