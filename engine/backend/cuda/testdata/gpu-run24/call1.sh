# Call 1: GPU correctness of what was built on the CPU since run 23 (new defaults
# HALO_GRAD_ZERO=lazy, HALO_ATTN_QK=recompute; gated-delta stages; Gemma 4 MoE on the device path;
# wg-p256 and cublas grouped GEMMs; bf16 CE logits), 3 parallel streams, then the rest of the suite.
set -u
T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; unset OUT; logs=/tmp/logs1; mkdir -p $logs bin
for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
t() { # stream label timeout regex [env] [skip]
  local to=$3; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "### $2 skipped (time)" >> $logs/summary.txt; return; }
  echo "### $2" >> $logs/t-$1.log; local s=$(date +%s)
  (cd $root/engine/backend/cuda && env HALO_CUDA_CACHE=/tmp/kc$1 ${5:-X=1} timeout $to $root/bin/cudatest -test.v -test.run "$4" -test.skip "${6:-^$}" -test.timeout $(( to - 3 ))s >> $logs/t-$1.log 2>&1)
  echo "### $2 rc=$? $(( $(date +%s) - s ))s" | tee -a $logs/summary.txt >> $logs/t-$1.log
}
nvidia-smi -L > $logs/summary.txt
( t a families 260 '^TestGPUFamiliesMatchCPU$'; t a moe-train 150 'TestGPUMoETrainingMatchesCPU|TestGPUGemma4MoETrainingMatchesCPU|TestGPUMoERoute|TestGPUMoEPermute|TestGPUMoECombine'; t a latent 90 '^TestGPULatentModelsMatchCPU$' ) &
( t b parity 240 '^TestGPUModelParity$'; t b stages 80 'TestGPUGatedDelta|TestGPUGeGLU|TestGPUShortConv|TestGPURMSNorm'; t b ce-bf16 60 'TestGPUCrossEntropy' 'HALO_CE_LOGITS=bf16 HALO_CE_DWEIGHT=direct' 'Throughput'; t b ce-bf16-tp 40 'TestGPUCrossEntropyThroughput' 'HALO_CE_LOGITS=bf16 HALO_CE_DWEIGHT=direct' ) &
( t c gg-p256 80 '^TestGPUGroupedGEMM$' HALO_CUDA_GROUPED_GEMM=wg-p256; t c gg-cublas 80 '^TestGPUGroupedGEMM' HALO_CUDA_GROUPED_GEMM=cublas; t c gg-p256-tp 60 '^TestGPUGroupedGEMMThroughput$' HALO_CUDA_GROUPED_GEMM=wg-p256;
  t c rest 240 '^TestGPU' X=1 'Families|Latent|MoETraining|Gemma4MoE|MoERoute|MoEPermute|MoECombine|ModelParity|GatedDelta|GeGLU|ShortConv|RMSNorm|CrossEntropy|GroupedGEMM|Throughput|Sweep|TileSweep' ) &
wait
for s in a b c; do grep -E "^(--- |    --- |        --- )FAIL|panic:|^FAIL" $logs/t-$s.log | head -40 >> $logs/summary.txt; done; pack
t c gg-tp 50 '^TestGPUGroupedGEMMThroughput$'
t c train-tp 60 '^TestGPUTrainStepThroughput$'
pack; cat $logs/summary.txt
