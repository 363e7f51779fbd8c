# Call 3: the sink softmax and every DeepSeek-V4 op test, deepseek_v4 through the CUDA ops
# (now with the dense sink attention) against the CPU's host tape and against transformers'
# fixture, then the deepseek-v4-flash bench (engine/bench/testdata/h200-2026-12-02d-dsv4).
set -u
T0=$(date +%s)
root=$PWD; out=$OUT; logs=/tmp/logs3; mkdir -p $logs bin
for f in cudatest halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
nvidia-smi -L > $logs/summary.txt
(cd engine/backend/cuda && HALO_CUDA_CACHE=/tmp/kc timeout 150 $root/bin/cudatest -test.v \
  -test.run '^TestGPU(DSV4|WindowPool|IndexScores|SinkAttention|SinkSoftmax)|^TestGPUFamiliesMatchCPU$/^deepseek_v4$' > $logs/ops.log 2>&1
 echo "ops+family rc=$? $(( $(date +%s) - T0 ))s" >> $logs/summary.txt)
grep -E "^(--- |    --- )(FAIL|PASS)|^FAIL|^ok|^PASS|ms|GB/s" $logs/ops.log | head -40 >> $logs/summary.txt
f=engine/models/testdata/parity/deepseek_v4
ids=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$f/reference.json'))['input_ids'][0])))")
HALO_CUDA_CACHE=/tmp/kc timeout 60 bin/halo-shell run logprobs --device cuda --model $f --ids "$ids" > $logs/lp.json 2> $logs/lp.err
python3 - $f/reference.json $logs/lp.json >> $logs/summary.txt <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["logprobs"][0]
got = [float(x) for x in json.load(open(sys.argv[2]))["logprobs"]]
print("deepseek_v4 --device cuda: max |logprob - transformers| = %.3g" % max(abs(a - b) for a, b in zip(got, ref)))
PY
(cd $logs && tar czf $out/logs.tgz .)
OUT=$out bash engine/bench/testdata/h200-2026-12-02d-dsv4/call.sh >> $logs/summary.txt 2>&1
(cd $logs && tar czf $out/logs.tgz .); cp $logs/summary.txt $out/
cat $logs/summary.txt
