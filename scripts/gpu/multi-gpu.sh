#!/usr/bin/env bash
# Runs the multi-GPU suite on a machine with two or more NVIDIA GPUs and writes a JSON report:
#
#   1. scripts/gpu/nccl-tests.sh: NCCL collectives against the in-process communicator on 1..N
#      GPUs, and all-to-all / reduce-scatter / all-gather / all-reduce bandwidth from our profile
#      spans next to torch.distributed's at the same sizes, in the same run;
#   2. the trainer's GPU layout tests (engine/train TestGPU*): every layout on N GPUs against one
#      GPU for a dense and a MoE family, and live re-layouts with their times;
#   3. the launch command across nodes on GPUs (cmd/halo-shell TestGPULaunchAcrossNodes*: two
#      launch processes of one GPU each joined by the rendezvous into one NCCL world, against
#      one process on both GPUs);
#   4. scripts/gpu/moe-bench.sh when bin/halo-shell exists: a Qwen3-MoE shape trained with each
#      EP size the GPUs allow (tokens/s, peak memory per GPU, dispatch/combine share).
#
# Nothing is built on the GPU machine (no Go there). On the build machine:
#
#   CGO_ENABLED=0 go test -c -o bin/nccltest ./engine/comm/nccl
#   CGO_ENABLED=0 go test -c -o bin/traintest ./engine/train
#   CGO_ENABLED=0 go test -c -o bin/cmdtest ./cmd/halo-shell
#   CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell
#
# Binaries may travel compressed (bin/NAME.xz or bin/NAME.gz); they are unpacked first.
#   scripts/gpu/multi-gpu.sh OUTDIR [--skip nccl,train,launch,moe]
# OUTDIR receives multi-gpu-report.json and each part's own files (nccl/, train-layouts.json,
# train-test.log, launch-test.log, moe/). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
out=${1:?usage: multi-gpu.sh OUTDIR [--skip nccl,train,moe]}
shift
skip=""
while [ $# -gt 0 ]; do
	case $1 in
	--skip) skip=$2; shift ;;
	*) echo "multi-gpu.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
mkdir -p "$out"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
for f in bin/*.xz bin/*.gz; do
	[ -e "$f" ] || continue
	case $f in *.xz) xz -dkf "$f" ;; *) gzip -dkf "$f" ;; esac; chmod +x "${f%.*}"
done
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
nccl_rc=-1 train_rc=-1 launch_rc=-1 moe_rc=-1
if [[ ",$skip," != *,nccl,* ]]; then
	scripts/gpu/nccl-tests.sh "$out/nccl"
	nccl_rc=$?
fi
if [[ ",$skip," != *,train,* ]]; then
	if [ -x bin/traintest ]; then
		# The test binary runs in its package directory, as go test does (relative test data).
		(cd engine/train && HALO_GPU_LAYOUT_REPORT="$out/train-layouts.json" ../../bin/traintest \
			-test.run 'TestGPU' -test.v -test.count=1 -test.timeout=540s) > "$out/train-test.log" 2>&1
		train_rc=$?
		grep -E '^\s*(---|ok|FAIL|PASS)|took|max relative' "$out/train-test.log" | tail -n 40
	else
		echo "multi-gpu.sh: bin/traintest is missing: CGO_ENABLED=0 go test -c -o bin/traintest ./engine/train" >&2
	fi
fi
if [[ ",$skip," != *,launch,* ]] && [ -x bin/cmdtest ]; then
	(cd cmd/halo-shell && ../../bin/cmdtest -test.run '^TestGPULaunchAcrossNodes' -test.v -test.count=1 \
		-test.timeout=300s) > "$out/launch-test.log" 2>&1
	launch_rc=$?
	grep -E '^\s*(---|ok|FAIL|PASS)|relative difference' "$out/launch-test.log" | tail -n 20
fi
if [[ ",$skip," != *,moe,* ]] && [ -x scripts/gpu/moe-bench.sh ] && [ -x bin/halo-shell ]; then
	scripts/gpu/moe-bench.sh "$out/moe" --cases qwen3-30b-a3b:4:4x2048 --eps 1,2,4,8
	moe_rc=$?
fi
python3 - "$out" "$gpus" "$nccl_rc" "$train_rc" "$launch_rc" "$moe_rc" <<'PY'
import json, os, re, sys
out, gpus, nccl_rc, train_rc, launch_rc, moe_rc = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:])
def load(p):
    try:
        return json.load(open(os.path.join(out, p)))
    except Exception as e:
        return {"error": str(e)}
tests = {}
for name in ("train-test.log", "launch-test.log"):
    log = os.path.join(out, name)
    if not os.path.exists(log):
        continue
    for line in open(log, errors="replace"):
        m = re.match(r"\s*--- (PASS|FAIL|SKIP): (\S+)", line)
        if m:
            tests[m.group(2)] = m.group(1).lower()
rep = dict(gpus=gpus, nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
           exit=dict(nccl=nccl_rc, train=train_rc, launch=launch_rc, moe=moe_rc),
           nccl=load("nccl/nccl-report.json"), train_tests=tests, train_layouts=load("train-layouts.json"),
           moe=load("moe/moe-report.json"), moe_ep=load("moe/ep/moe-ep-report.json"),
           command="scripts/gpu/multi-gpu.sh OUTDIR (binaries: see the script's header)")
json.dump(rep, open(os.path.join(out, "multi-gpu-report.json"), "w"), indent=2)
print(json.dumps(dict(gpus=gpus, exit=rep["exit"], failed=[k for k, v in tests.items() if v == "fail"]), indent=1))
PY
[ "$nccl_rc" -le 0 ] && [ "$train_rc" -le 0 ] && [ "$launch_rc" -le 0 ] && [ "$moe_rc" -le 0 ]
