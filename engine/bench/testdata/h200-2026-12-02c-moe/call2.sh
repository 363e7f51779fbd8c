# Call 2: MoE bench with the new defaults (HALO_GRAD_ZERO=lazy, HALO_ATTN_QK=recompute) and the
# old behaviours and opt-in switches as variants, Qwen3-30B-A3B shape at 4 and 8 layers.
set -u
T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
out=$OUT; unset OUT; logs=/tmp/logs2; mkdir -p $logs bin; touch $logs/summary.txt
[ -f bin/halo-shell ] || { xz -dc binx/halo-shell.xz > bin/halo-shell; chmod +x bin/halo-shell; }
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
V=${VARIANTS:-HALO_GRAD_ZERO=fill,HALO_ATTN_QK=keep,wg-p256,HALO_CE_LOGITS=bf16+HALO_CE_DWEIGHT=direct}
for c in ${CASES:-qwen3-30b-a3b:4:4x2048 qwen3-30b-a3b:8:2x4096}; do
  to=$(( $(left) - 5 )); [ $to -gt 80 ] || break
  n=$(echo $c | tr : -); HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m2/$n --cases $c --steps 20 --warmup 3 --variants $V > $logs/moe-$n.txt 2>&1
  echo "moe-bench $c rc=$? at $(( $(date +%s) - T0 ))s" >> $logs/summary.txt; grep -A3 "^shape " $logs/moe-$n.txt >> $logs/summary.txt; cat /tmp/m2/$n/variants.json >> $logs/summary.txt 2>/dev/null
  (cd /tmp/m2 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe2.tgz -T -); pack
done
pack; cat $logs/summary.txt
