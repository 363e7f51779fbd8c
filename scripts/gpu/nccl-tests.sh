#!/usr/bin/env bash
# Runs the NCCL communicator's GPU tests and its bandwidth measurement on a machine with NVIDIA
# GPUs, then the same collectives at the same sizes through torch.distributed (NCCL backend, one
# process per GPU) for comparison, and writes a JSON report. Nothing is built here (no Go on the
# GPU machine); the test binary comes from the build machine:
#
#   CGO_ENABLED=0 go test -c -o bin/nccltest ./engine/comm/nccl     # on the build machine
#   scripts/gpu/nccl-tests.sh OUTDIR                                 # on the GPU machine
#
# OUTDIR receives nccl-report.json ({"tests": pass/fail/skip per test, "halo": our bandwidth,
# "torch": torch.distributed's, "ratio": ours over torch's bus bandwidth per op and size}),
# nccl-test.log (the verbose test output), torch.log, torch_bandwidth.py (the comparison as run)
# and nvidia-smi.txt (topology included).
# Sizes are bytes of bf16 buffers (HALO_NCCL_SIZES, comma-separated). NVLink multicast stays off:
# NCCL_NVLS_ENABLE=0 is exported unless the caller set it.
set -uo pipefail
out=${1:?usage: nccl-tests.sh OUTDIR}
bin=${NCCLTEST_BIN:-bin/nccltest}
py=${PYTHON:-$( [ -x /opt/torch/.venv/bin/python ] && echo /opt/torch/.venv/bin/python || echo python3 )}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export HALO_NCCL_SIZES=${HALO_NCCL_SIZES:-1048576,16777216,134217728}
export HALO_NCCL_REPORT="$out/halo-bandwidth.json"
{ nvidia-smi; nvidia-smi topo -m; } > "$out/nvidia-smi.txt" 2>&1 || true

if [ ! -x "$bin" ]; then
	echo "nccl-tests.sh: $bin is missing: build it with CGO_ENABLED=0 go test -c -o bin/nccltest ./engine/comm/nccl" >&2
	exit 2
fi
"$bin" -test.v -test.count=1 -test.timeout=540s > "$out/nccl-test.log" 2>&1
test_rc=$?
tail -n 30 "$out/nccl-test.log"

nranks=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$nranks" -ge 1 ] || nranks=1
# The comparison runs from a file: spawned worker processes import the main module by path.
cat > "$out/torch_bandwidth.py" <<'PY'
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, n, sizes, iters, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=torch.device("cuda", rank))
    rows = []
    for size in sizes:
        elems = size // 2 // n * n
        per = elems // n
        a = torch.zeros(elems, dtype=torch.bfloat16, device="cuda")
        b = torch.zeros(elems, dtype=torch.bfloat16, device="cuda")
        ops = [
            ("all_to_all", (n - 1) / n, lambda: dist.all_to_all_single(b, a, [per] * n, [per] * n)),
            ("reduce_scatter", (n - 1) / n, lambda: dist.reduce_scatter_tensor(b[:per], a)),
            ("all_gather", (n - 1) / n, lambda: dist.all_gather_into_tensor(b, a[:per])),
            ("all_reduce", 2 * (n - 1) / n, lambda: dist.all_reduce(a)),
        ]
        for name, factor, fn in ops:
            fn(); torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # Time each call on its own, as the Go side does (events around one collective).
            total = 0.0
            for _ in range(iters):
                s.record(); fn(); e.record(); e.synchronize()
                total += s.elapsed_time(e) * 1e3
            us = total / iters
            alg = elems * 2 / (us * 1e-6) / 1e9
            rows.append(dict(op=name, bytes=elems * 2, ranks=n, time_us=us, algbw_gbs=alg, busbw_gbs=alg * factor))
    if rank == 0:
        q.put(rows)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    path, n = sys.argv[1], int(sys.argv[2])
    sizes = [int(x) for x in os.environ["HALO_NCCL_SIZES"].split(",")]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29600 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, n, sizes, 20, port, q)) for r in range(n)]
    for p in procs: p.start()
    rows = q.get(timeout=500)
    for p in procs: p.join()
    rep = dict(torch=torch.__version__, nccl=".".join(map(str, torch.cuda.nccl.version())), ranks=n, iters=20,
               dtype="bf16", nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"), results=rows)
    json.dump(rep, open(path, "w"), indent=2)
    for r in rows:
        print("%-15s %11d B  %9.1f us  busbw %7.2f GB/s" % (r["op"], r["bytes"], r["time_us"], r["busbw_gbs"]))
PY
"$py" "$out/torch_bandwidth.py" "$out/torch-bandwidth.json" "$nranks" > "$out/torch.log" 2>&1
torch_rc=$?
cat "$out/torch.log" | tail -n 20

"$py" - "$out" "$test_rc" "$torch_rc" <<'PY'
import json, os, re, sys
out, test_rc, torch_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:
        return {"error": str(e)}
tests = {}
for line in open(os.path.join(out, "nccl-test.log"), errors="replace"):
    m = re.match(r"\s*--- (PASS|FAIL|SKIP): (\S+)", line)
    if m:
        tests[m.group(2)] = m.group(1).lower()
halo, torch_ = load("halo-bandwidth.json"), load("torch-bandwidth.json")
ratio = {}
tb = {(r["op"], r["bytes"]): r for r in torch_.get("results", [])}
for r in halo.get("results", []):
    t = tb.get((r["op"], r["bytes"]))
    if t and t["busbw_gbs"] > 0:
        ratio["%s/%d" % (r["op"], r["bytes"])] = r["busbw_gbs"] / t["busbw_gbs"]
rep = dict(test_exit=test_rc, torch_exit=torch_rc, tests=tests, halo=halo, torch=torch_, busbw_ratio_halo_over_torch=ratio,
           nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
           command="CGO_ENABLED=0 go test -c -o bin/nccltest ./engine/comm/nccl && scripts/gpu/nccl-tests.sh OUTDIR")
json.dump(rep, open(os.path.join(out, "nccl-report.json"), "w"), indent=2)
print(json.dumps(dict(test_exit=test_rc, torch_exit=torch_rc, failed=[k for k, v in tests.items() if v == "fail"], ratio=ratio), indent=1))
PY
exit $test_rc
