# Call 3: MoE bench on the OLMoE and Mixtral shapes with bf16 CE logits and cuBLASLt grouped
# GEMMs as variants, then the Mixtral forward diagnosis at 4 layers.
set -u
T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
out=$OUT; unset OUT; logs=/tmp/logs3; mkdir -p $logs bin; touch $logs/summary.txt
[ -f bin/halo-shell ] || { xz -dc binx/halo-shell.xz > bin/halo-shell; chmod +x bin/halo-shell; }
pack() { (cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/ 2>/dev/null; }
for c in mixtral-8x7b:4:4x2048 olmoe-1b-7b:16:4x2048; do
  to=$(( $(left) - 5 )); [ $to -gt 80 ] || break
  case $c in mixtral*) V=HALO_CE_LOGITS=bf16+HALO_CE_DWEIGHT=direct,cublas ;; *) V=HALO_CE_LOGITS=bf16+HALO_CE_DWEIGHT=direct,HALO_GRAD_ZERO=fill ;; esac
  n=$(echo $c | tr : -); HALO_REVISION=$(cat binx/rev.txt) timeout $to scripts/gpu/moe-bench.sh /tmp/m3/$n --cases $c --steps 20 --warmup 3 --variants $V > $logs/moe-$n.txt 2>&1
  echo "moe-bench $c rc=$? at $(( $(date +%s) - T0 ))s" >> $logs/summary.txt; grep -A3 "^shape " $logs/moe-$n.txt >> $logs/summary.txt; cat /tmp/m3/$n/variants.json >> $logs/summary.txt 2>/dev/null
  (cd /tmp/m3 && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf $out/moe3.tgz -T -); pack
done
to=$(( $(left) - 5 ))
if [ $to -gt 60 ]; then timeout $to python3 scripts/gpu/moe_forward_diag.py --shape mixtral-8x7b --layers 4 --batch 4 --seq-len 2048 --steps 20 --out /tmp/d3 --halo bin/halo-shell > $logs/diag.txt 2>&1; echo "diag rc=$?" >> $logs/summary.txt; cp /tmp/d3/diag.json $out/diag-mixtral-4l.json 2>/dev/null; fi
pack; cat $logs/summary.txt
