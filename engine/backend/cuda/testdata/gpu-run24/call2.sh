# Call 2: the same streams after the arena alignment, grouped-GEMM output check and CE defaults,
# then the MoE bench on its four cases with the new defaults (no variants).
set -u
T0=$(date +%s); LIMIT=${LIMIT:-575}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; unset OUT; logs=/tmp/logs2; mkdir -p $logs bin
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
( t b parity 240 '^TestGPUModelParity$'; t b stages 80 'TestGPUGatedDelta|TestGPUGeGLU|TestGPUShortConv|TestGPURMSNorm'; t b ce 60 'TestGPUCrossEntropy' X=1 'Throughput'; t b ce-f32 60 'TestGPUCrossEntropy' 'HALO_CE_LOGITS=f32 HALO_CE_DWEIGHT=f32' 'Throughput'; t b ce-tp 40 'TestGPUCrossEntropyThroughput' ) &
( t c gg 60 '^TestGPUGroupedGEMM$|TestGPUGroupedGEMMDoesNotSynchronise';
  t c rest 240 '^TestGPU' X=1 'Families|Latent|MoETraining|Gemma4MoE|MoERoute|MoEPermute|MoECombine|ModelParity|GatedDelta|GeGLU|ShortConv|RMSNorm|CrossEntropy|GroupedGEMM|Throughput|Sweep|TileSweep' ) &
wait
for s in a b c; do grep -E "^(--- |    --- |        --- )FAIL|panic:|^FAIL" $logs/t-$s.log | head -40 >> $logs/summary.txt; done; pack
for c in qwen3-30b-a3b:8:2x4096 qwen3-30b-a3b:4:4x2048 olmoe-1b-7b:16:4x2048 mixtral-8x7b:4:4x2048; do
  to=$(( $(left) - 5 )); [ $to -gt 80 ] || break
  n=$(echo $c | tr : -); HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m2/$n --cases $c --steps 20 --warmup 3 > $logs/moe-$n.txt 2>&1
  echo "moe-bench $c rc=$? at $(( $(date +%s) - T0 ))s" >> $logs/summary.txt; grep -A3 "^shape " $logs/moe-$n.txt >> $logs/summary.txt
  (cd /tmp/m2 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe.tgz -T -); pack
done
pack; cat $logs/summary.txt
