# Call 4: jetmoe's transformers fixtures (parity, config reference, the saved checkpoint
# reloaded), then jetmoe on the H200 against the CPU and through run logprobs --device cuda on
# the fixture just made.
set -u
root=$PWD; out=$OUT; unset OUT; logs=/tmp/logs4; mkdir -p $logs bin
for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
OUT=$out/ff timeout 300 scripts/gpu/family-fixtures.sh jetmoe > $logs/ff.txt 2>&1; echo "fixtures rc=$?" > $logs/summary.txt
cp $out/ff/family-fixtures.log $logs/ 2>/dev/null
(cd engine/backend/cuda && HALO_CUDA_CACHE=/tmp/kc timeout 120 $root/bin/cudatest -test.v -test.run '^TestGPUFamiliesMatchCPU$/^jetmoe$' > $logs/family.log 2>&1; echo "family rc=$?" >> $logs/summary.txt)
grep -E "^(--- |    --- )|^FAIL|^ok|^PASS" $logs/family.log | head >> $logs/summary.txt
f=engine/models/testdata/parity/jetmoe
if [ -f $f/reference.json ]; then
  ids=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$f/reference.json'))['input_ids'][0])))")
  for dev in cuda cpu; do
    HALO_CUDA_CACHE=/tmp/kc timeout 60 bin/halo-shell run logprobs --device $dev --model $f --ids "$ids" > $logs/lp-$dev.json 2> $logs/lp-$dev.err
    python3 - $f/reference.json $logs/lp-$dev.json $dev >> $logs/summary.txt <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["logprobs"][0]
try:
    got = [float(x) for x in json.load(open(sys.argv[2]))["logprobs"]]
    print("jetmoe --device %s: max |logprob - transformers| = %.3g" % (sys.argv[3], max(abs(a - b) for a, b in zip(got, ref))))
except Exception as e:
    print("jetmoe --device %s: no logprobs: %s" % (sys.argv[3], e))
PY
  done
fi
(cd $logs && tar czf $out/logs.tgz .); cat $logs/summary.txt
