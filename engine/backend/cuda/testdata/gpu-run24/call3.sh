# Call 3: the grouped GEMM under auto with every variant (call 2 gave it too little time), and
# the cohere2_moe parity fixtures (transformers on the CPU, beside it).
set -u
T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; unset OUT; logs=/tmp/logs3; mkdir -p $logs bin
for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
nvidia-smi -L > $logs/summary.txt
( s=$(date +%s); OUT=/tmp/ff timeout 240 scripts/gpu/family-fixtures.sh cohere2_moe cohere2_moe_sigmoid > $logs/ff.txt 2>&1; echo "ff rc=$? $(( $(date +%s) - s ))s" >> $logs/summary.txt; cp /tmp/ff/family-fixtures.log $logs/; cp /tmp/ff/family-fixtures.tgz.part-* $out/ ) &
( s=$(date +%s); cd engine/backend/cuda && HALO_CUDA_CACHE=/tmp/kcg timeout 250 $root/bin/cudatest -test.v -test.run '^TestGPUGroupedGEMM$' -test.timeout 245s > $logs/gg.log 2>&1; echo "gg rc=$? $(( $(date +%s) - s ))s" >> $logs/summary.txt ) &
wait
grep -E "^(--- |    --- )FAIL|panic:|^FAIL|^--- PASS" $logs/gg.log | head -20 >> $logs/summary.txt
pack; cat $logs/summary.txt
