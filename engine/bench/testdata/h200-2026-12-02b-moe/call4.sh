set -u
T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
out=$OUT; unset OUT; logs=/tmp/logs4; mkdir -p $logs bin; touch $logs/summary.txt
[ -f bin/halo-shell ] || { xz -dc binx/halo-shell.xz > bin/halo-shell; chmod +x bin/halo-shell; }
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
for c in qwen3-30b-a3b:8:2x4096 olmoe-1b-7b:16:4x2048 mixtral-8x7b:4:4x2048; do
  to=$(( $(left) - 5 )); [ $to -gt 80 ] || break
  n=$(echo $c | cut -d: -f1); HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m4/$n --cases $c --steps 20 --warmup 3 --variants wg-p > $logs/moe-$n.txt 2>&1
  echo "moe-bench $c rc=$?" >> $logs/summary.txt; grep -A3 "^shape " $logs/moe-$n.txt >> $logs/summary.txt
  (cd /tmp/m4 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe4.tgz -T -); pack
done
to=$(( $(left) - 5 ))
if [ $to -gt 60 ]; then s=$(date +%s); timeout $to scripts/gpu/lectures.sh > $logs/lectures.txt 2>&1; echo "lectures rc=$? $(( $(date +%s) - s ))s" >> $logs/summary.txt; tar czf $out/executed.tgz notebooks/executed/h200; fi
pack; cat $logs/summary.txt
