# Call 1: DeepSeek-V4 on the device. The CUDA DeepSeek-V4 ops against the CPU backend, the
# deepseek_v4 family through them against the CPU's float64 host tape (TestGPUFamiliesMatchCPU),
# and the transformers parity fixtures of deepseek_v4 and cohere2_moe through
# `halo-shell run logprobs --device cuda` and --device cpu.
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
( t a dsv4-ops 200 "${OPS:-^TestGPU(DSV4|WindowPool|IndexScores|SinkAttention)}" ) &
( t b family 200 '^TestGPUFamiliesMatchCPU$/^(deepseek_v4|cohere2_moe)$' ) &
( for d in deepseek_v4 cohere2_moe cohere2_moe_sigmoid; do
    f=engine/models/testdata/parity/$d
    ids=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$f/reference.json'))['input_ids'][0])))")
    for dev in cuda cpu; do
      s=$(date +%s)
      HALO_CUDA_CACHE=/tmp/kcc timeout 120 bin/halo-shell run logprobs --device $dev --model $f --ids "$ids" > $logs/lp-$d-$dev.json 2> $logs/lp-$d-$dev.err
      rc=$?
      python3 - "$f/reference.json" "$logs/lp-$d-$dev.json" "$d $dev rc=$rc $(( $(date +%s) - s ))s" >> $logs/summary.txt <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["logprobs"][0]
try:
    got = [float(x) for x in json.load(open(sys.argv[2]))["logprobs"]]
    print(sys.argv[3], "max |logprob - transformers| = %.3g over %d tokens" % (max(abs(a - b) for a, b in zip(got, ref)), len(got)))
except Exception as e:
    print(sys.argv[3], "no logprobs:", e)
PY
    done
  done ) &
wait
for s in a b; do grep -E "^(--- |    --- |        --- )FAIL|panic:|^FAIL" $logs/t-$s.log | head -40 >> $logs/summary.txt; done
pack; cat $logs/summary.txt
