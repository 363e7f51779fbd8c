# Call 2: the two DeepSeek-V4 op tests whose bounds call 1 showed too tight, then the MoE bench
# on the deepseek-v4-flash shape (halo-shell's device path against stock transformers in the
# same script, bf16, one GPU).
set -u
T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
root=$PWD; out=$OUT; unset OUT; logs=/tmp/logs2; mkdir -p $logs bin
for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
nvidia-smi -L > $logs/summary.txt
(cd engine/backend/cuda && HALO_CUDA_CACHE=/tmp/kc timeout 120 $root/bin/cudatest -test.v -test.run '^TestGPU(DSV4|WindowPool|IndexScores|SinkAttention)' > $logs/ops.log 2>&1; echo "ops rc=$?" >> $logs/summary.txt)
grep -E "^(--- |    --- )FAIL|^FAIL|^ok|^PASS" $logs/ops.log >> $logs/summary.txt; pack
to=$(( $(left) - 10 ))
HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m2 --cases deepseek-v4-flash:4:1x2048 --steps 8 --warmup 2 > $logs/moe.txt 2>&1
echo "moe-bench rc=$? at $(( $(date +%s) - T0 ))s" >> $logs/summary.txt
tail -30 $logs/moe.txt >> $logs/summary.txt
(cd /tmp/m2 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe.tgz -T -); pack
cat $logs/summary.txt
