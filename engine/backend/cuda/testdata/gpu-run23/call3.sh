# Call 3: wg-p correctness and throughput, family fixtures (CPU, beside), forward diagnosis, MoE bench 4L.
set -u
T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; unset OUT; logs=/tmp/logs3; mkdir -p $logs bin
rm -f bin/cudatest bin/halo-shell; for f in cudatest halo-shell; do xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; done
touch $logs/summary.txt
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
t() { # label timeout regex [env]
  local to=$2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "### $1 skipped (time)" >> $logs/summary.txt; return; }
  echo "### $1" >> $logs/tests.log; local s=$(date +%s)
  (cd $root/engine/backend/cuda && env HALO_CUDA_CACHE=/tmp/kc ${4:-X=1} timeout $to $root/bin/cudatest -test.v -test.run "$3" -test.timeout $(( to - 3 ))s >> $logs/tests.log 2>&1)
  echo "### $1 rc=$? $(( $(date +%s) - s ))s" | tee -a $logs/summary.txt >> $logs/tests.log
}
( s=$(date +%s); OUT=/tmp/ff timeout 200 scripts/gpu/family-fixtures.sh granitemoe ernie4_5_moe phimoe > $logs/ff.txt 2>&1; echo "ff rc=$? $(( $(date +%s) - s ))s" >> $logs/summary.txt; cp /tmp/ff/family-fixtures.log $logs/; cp /tmp/ff/family-fixtures.tgz.part-* $out/ ) &
t gg-wg-p 80 '^TestGPUGroupedGEMM$' HALO_CUDA_GROUPED_GEMM=wg-p
grep -E "^ +--- FAIL|FAIL:|panic" -A3 $logs/tests.log | head -40 >> $logs/summary.txt; pack
for v in wg-p wg-n128x2; do t "tput-$v" 60 'TestGPUGroupedGEMMThroughput' HALO_CUDA_GROUPED_GEMM=$v; done
grep -E "TFLOP/s" $logs/tests.log | sed 's/^ *//' | sort -u > $logs/tput.txt; pack
for sh in mixtral-8x7b qwen3-30b-a3b; do
  to=$(( $(left) - 150 )); [ $to -gt 40 ] || break; [ $to -gt 120 ] && to=120
  s=$(date +%s); PYTHONUNBUFFERED=1 timeout $to python3 scripts/gpu/moe_forward_diag.py --shape $sh --layers 1 --batch 2 --seq-len 2048 --steps 20 --out /tmp/diag-$sh --halo bin/halo-shell > $logs/diag-$sh.txt 2>&1
  echo "diag $sh rc=$? $(( $(date +%s) - s ))s" >> $logs/summary.txt; cp /tmp/diag-$sh/diag.json $out/diag-$sh.json 2>/dev/null; grep -E "^(torch|halo)|^\{" $logs/diag-$sh.txt >> $logs/summary.txt; rm -rf /tmp/diag-$sh
done
pack
if grep -q "gg-wg-p rc=0" $logs/summary.txt; then
  to=$(( $(left) - 10 ))
  if [ $to -gt 90 ]; then
    HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m3 --cases qwen3-30b-a3b:4:4x2048 --steps 20 --warmup 3 --variants wg-p > $logs/moe3.txt 2>&1
    echo "moe-bench-4l rc=$?" >> $logs/summary.txt; grep -A3 "^shape " $logs/moe3.txt >> $logs/summary.txt; cat /tmp/m3/variants.json >> $logs/summary.txt
    (cd /tmp/m3 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe3.tgz -T -)
  fi
fi
wait; pack; cat $logs/summary.txt; cat $logs/tput.txt
