# Device call 1: grouped GEMM variants (correctness, throughput), MoE GPU tests, MoE bench 4L.
set -u
T0=$(date +%s); LIMIT=${LIMIT:-580}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; logs=/tmp/logs1; mkdir -p $logs bin
for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
export HALO_CUDA_CACHE=/tmp/kc
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
t() { # label timeout regex [env]
  local to=$2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "### $1 skipped (time)" >> $logs/summary.txt; return; }
  echo "### $1" >> $logs/tests.log; local s=$(date +%s)
  (cd $root/engine/backend/cuda && env ${4:-X=1} timeout $to $root/bin/cudatest -test.v -test.run "$3" -test.timeout $(( to - 3 ))s >> $logs/tests.log 2>&1)
  echo "### $1 rc=$? $(( $(date +%s) - s ))s" | tee -a $logs/summary.txt >> $logs/tests.log
}
nvidia-smi -L > $logs/summary.txt
t nvrtc 150 '^TestNVRTCCompilesEveryArch$'
grep -E "FAIL|error" $logs/tests.log | head -20 >> $logs/summary.txt; pack
for v in wg wg-n128 wg-n256 wg-n128x2 wg-tma; do t "gg-$v" 60 'TestGPUGroupedGEMM$' HALO_CUDA_GROUPED_GEMM=$v; done
grep -E "^ +--- FAIL|FAIL:|panic" $logs/tests.log | head -30 >> $logs/summary.txt; pack
ok=""; for v in wg wg-n128 wg-n256 wg-n128x2 wg-tma; do grep -q "gg-$v rc=0" $logs/summary.txt && ok="$ok $v"; done
echo "passed:$ok" >> $logs/summary.txt; echo "$ok" > $logs/passed
for v in $ok; do t "tput-$v" 75 'TestGPUGroupedGEMMThroughput' HALO_CUDA_GROUPED_GEMM=$v; done
grep -E "TFLOP/s" $logs/tests.log | sed 's/^ *//' | sort -u >> $logs/tput.txt; pack
t moe-train 150 'TestGPUMoETrainingMatchesCPU|TestGPUMoERoute|TestGPUFamiliesMatchCPU'
grep -E "^(--- |    --- )(FAIL|PASS)" $logs/tests.log | grep -v GroupedGEMM | tail -60 >> $logs/summary.txt; pack
vl=$(echo $ok | tr ' ' '\n' | grep -v '^wg$' | paste -sd, -)
to=$(( $(left) - 5 ))
if [ $to -gt 60 ]; then
  HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m1 --cases qwen3-30b-a3b:4:4x2048 --steps 20 --warmup 3 ${vl:+--variants $vl} > $logs/moe1.txt 2>&1
  echo "moe-bench-4l rc=$? (variants $vl)" >> $logs/summary.txt
  (cd /tmp/m1 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe1.tgz -T -)
fi
pack; cat $logs/summary.txt; grep -E "tok/s|tokens/s" $logs/moe1.txt | tail -8
