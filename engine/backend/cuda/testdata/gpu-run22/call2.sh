# Device call 2: grouped GEMM variants alone (correctness, throughput), then MoE bench cases.
set -u
T0=$(date +%s); LIMIT=${LIMIT:-580}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; logs=/tmp/logs2; mkdir -p $logs bin
rm -f bin/cudatest; for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
export HALO_CUDA_CACHE=/tmp/kc
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
t() { # label timeout regex [env]
  local to=$2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "### $1 skipped (time)" >> $logs/summary.txt; return; }
  echo "### $1" >> $logs/tests.log; local s=$(date +%s)
  (cd $root/engine/backend/cuda && env ${4:-X=1} timeout $to $root/bin/cudatest -test.v -test.run "$3" -test.timeout $(( to - 3 ))s >> $logs/tests.log 2>&1)
  echo "### $1 rc=$? $(( $(date +%s) - s ))s" | tee -a $logs/summary.txt >> $logs/tests.log
}
touch $logs/summary.txt
for v in ${GG:-wg wg-n128 wg-n256 wg-n128x2 wg-tma}; do t "gg-$v" 90 'TestGPUGroupedGEMM$' HALO_CUDA_GROUPED_GEMM=$v; done
grep -E "^ +--- FAIL|FAIL:|panic|running tests" -A3 $logs/tests.log | head -60 >> $logs/summary.txt; pack
ok=""; for v in wg wg-n128 wg-n256 wg-n128x2 wg-tma; do grep -q "gg-$v rc=0" $logs/summary.txt && ok="$ok $v"; done
echo "passed:$ok" >> $logs/summary.txt
for v in $ok; do t "tput-$v" 60 'TestGPUGroupedGEMMThroughput' HALO_CUDA_GROUPED_GEMM=$v; done
grep -E "TFLOP/s" $logs/tests.log | sed 's/^ *//' | sort -u >> $logs/tput.txt; pack
vl=$(echo $ok | tr ' ' '\n' | grep -v '^wg$' | paste -sd, -)
for c in ${CASES:-qwen3-30b-a3b:8:2x4096 olmoe-1b-7b:16:4x2048 mixtral-8x7b:4:4x2048}; do
  to=$(( $(left) - 5 )); [ $to -gt 60 ] || break
  n=$(echo $c | cut -d: -f1); HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m2/$n --cases $c --steps 20 --warmup 3 ${vl:+--variants $vl} > $logs/moe-$n.txt 2>&1
  echo "moe-bench $c rc=$? (variants $vl)" >> $logs/summary.txt; grep -A3 "^shape " $logs/moe-$n.txt >> $logs/summary.txt
  (cd /tmp/m2 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe2.tgz -T -); pack
done
pack; cat $logs/summary.txt; cat $logs/tput.txt | head -60
