#!/usr/bin/env bash
# Expert-parallel training benchmark: a Qwen3-MoE model trained with EP = 1, 2, 4 and 8 (as
# many GPUs as the machine has), reporting tokens/s, peak memory per GPU and the share of the
# step spent in the dispatch and combine all-to-alls for each EP size.
#
#   CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell     # on the build machine
#   scripts/gpu/moe-bench.sh OUTDIR [--layers N] [--steps N] [--warmup N] [--seq-len N] [--batch N] [--eps LIST]
#
# 1. python3 scripts/gpu/moe_shape.py make builds a qwen3_moe model with transformers at random
#    init (seed 0, bf16) with the layer dimensions of Qwen/Qwen3-30B-A3B (hidden 2048, 32 heads,
#    4 KV heads, head_dim 128, 128 experts of width 768, top-8, norm_topk_prob, vocab 151936)
#    but --layers decoder layers, saves it to OUTDIR/init and writes OUTDIR/tokens.jsonl.
#    The full 48 layers do not fit: they hold about 30.5 B parameters (29 B of them experts);
#    at 8 bytes per parameter (bf16 weights, gradients and the two AdamW moments) EP=2 keeps
#    half the experts plus every dense weight, about 16 B parameters or 120 GiB, on each
#    139 GiB GPU before any activation, routing buffer or all-to-all buffer. Four layers hold
#    3.1 B parameters (about 23 GiB of state on one GPU).
# 2. For each EP size N the visible GPUs allow (nvidia-smi -L; 1 = one GPU cuda:0, N > 1 =
#    cuda:0-(N-1) with --ep N, so dp = N as well: the experts are split over the data ranks),
#    bin/halo-shell run bench-train trains --steps steps (the first --warmup left out of the
#    medians) plus one profiled step and writes OUTDIR/moe-ep{N}.json (its command line in
#    .cmd, exit status in .rc, output in .log).
#    --batch is the rows of a whole step; a step's rows are dealt one micro-batch per data
#    rank, so for EP N the batch is rounded up to a multiple of N (recorded in the report).
# 3. moe_shape.py summary writes OUTDIR/moe-report.json: per EP size tokens/s, step time, peak
#    GiB per GPU (list and max), dispatch and combine shares of the profiled step, losses, MFU
#    (active parameters) and the command line, or the error of a run that failed. A failed EP
#    size does not stop the others.
#
# Results are committed beside the dense benchmark's, under engine/bench/testdata/<gpu>-<date>/
# (moe-report.json, moe-ep*.json, moe-ep*.log, nvidia-smi.txt, nvidia-topo.txt).
#
# The routing runs on the host, so steps are slower than the GPUs alone would allow. The
# defaults (4 layers, batch 4 x 2048 tokens, 8 steps, 2 of warmup) keep EP=1 and EP=2 on two
# H200s within about 5 minutes. KEEP_WEIGHTS=1 keeps OUTDIR/init; REUSE_INIT=1 reuses an
# OUTDIR/init and OUTDIR/tokens.jsonl made before (with enough rows). HALO_BIN overrides the
# binary (bin/halo-shell), PYTHON the interpreter (python3).
set -uo pipefail
usage="usage: moe-bench.sh OUTDIR [--layers N] [--steps N] [--warmup N] [--seq-len N] [--batch N] [--eps LIST]"
out=${1:?$usage}
shift
command_line="scripts/gpu/moe-bench.sh $out $*"
layers=4 steps=8 warmup=2 seqlen=2048 batch=4 eps=""
while [ $# -gt 0 ]; do
	case $1 in
	--layers) layers=${2-} ;;
	--steps) steps=${2-} ;;
	--warmup) warmup=${2-} ;;
	--seq-len) seqlen=${2-} ;;
	--batch) batch=${2-} ;;
	--eps) eps=${2-} ;;
	*)
		echo "moe-bench.sh: unknown option $1; $usage" >&2
		exit 2
		;;
	esac
	if [ $# -lt 2 ] || [ -z "$2" ]; then
		echo "moe-bench.sh: $1 needs a value" >&2
		exit 2
	fi
	shift 2
done
for v in "layers=$layers" "steps=$steps" "seq-len=$seqlen" "batch=$batch"; do
	case ${v#*=} in
	'' | *[!0-9]* | 0)
		echo "moe-bench.sh: --${v%%=*} ${v#*=}: give a positive whole number" >&2
		exit 2
		;;
	esac
done
case $warmup in
'' | *[!0-9]*)
	echo "moe-bench.sh: --warmup $warmup: give a whole number" >&2
	exit 2
	;;
esac
bin=${HALO_BIN:-bin/halo-shell}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$bin" ]; then
	echo "moe-bench.sh: $bin not found: build it with CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell" >&2
	exit 2
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ -z "$eps" ]; then
	for n in 1 2 4 8; do
		[ "$n" -le "$gpus" ] && eps="$eps,$n"
	done
	eps=${eps#,}
fi
if [ -z "$eps" ]; then
	echo "moe-bench.sh: nvidia-smi lists no GPU; nothing to run" >&2
	exit 2
fi
for n in ${eps//,/ }; do
	case $n in
	1 | 2 | 4 | 8) ;;
	*)
		echo "moe-bench.sh: --eps $eps: EP sizes are 1, 2, 4 or 8" >&2
		exit 2
		;;
	esac
	if [ "$n" -gt "$gpus" ]; then
		echo "moe-bench.sh: EP $n needs $n GPUs; nvidia-smi lists $gpus" >&2
		exit 2
	fi
done
# Rows for the largest step (the batch rounded up to a multiple of each EP size), timed steps
# and the profiled one.
maxbatch=$batch
for n in ${eps//,/ }; do
	b=$(((batch + n - 1) / n * n))
	[ "$b" -gt "$maxbatch" ] && maxbatch=$b
done
rows=$(((steps + 1) * maxbatch))

mkdir -p "$out"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
nvidia-smi topo -m >"$out/nvidia-topo.txt" 2>&1 || true
export NCCL_NVLS_ENABLE=0
export HALO_CUDA_CACHE=${HALO_CUDA_CACHE:-$out/kernel-cache}
export PYTHONUNBUFFERED=1
start=$SECONDS
echo "== $gpus GPUs; EP sizes $eps; $layers layers, batch $batch x $seqlen tokens, $steps steps ($warmup warmup)"
if [ "${REUSE_INIT:-0}" = 1 ] && [ -f "$out/init/config.json" ] && [ -f "$out/tokens.jsonl" ]; then
	echo "== reusing $out/init and $out/tokens.jsonl"
else
	echo "== making the model and $rows token rows"
	"$py" "$here/moe_shape.py" make --out "$out" --layers "$layers" --rows "$rows" --seq-len "$seqlen" 2>&1 | tee "$out/make.log"
	if [ "${PIPESTATUS[0]}" -ne 0 ] || [ ! -f "$out/init/config.json" ]; then
		echo "== making the model failed (see $out/make.log)"
		for n in ${eps//,/ }; do
			echo "not run: making the model failed (see make.log)" >"$out/moe-ep$n.log"
			echo 1 >"$out/moe-ep$n.rc"
		done
		"$py" "$here/moe_shape.py" summary "$out" --eps "$eps" --command "$command_line"
		exit 1
	fi
fi
echo "== model ready at $((SECONDS - start)) s"
for n in ${eps//,/ }; do
	b=$(((batch + n - 1) / n * n))
	if [ "$n" = 1 ]; then
		where=(--device cuda:0)
	else
		where=(--devices "cuda:0-$((n - 1))" --ep "$n")
	fi
	cmd=("$bin" run bench-train --model "$out/init" --data "$out/tokens.jsonl" "${where[@]}"
		--steps "$steps" --warmup "$warmup" --batch "$b" --seq-len "$seqlen" --out "$out/moe-ep$n.json")
	rm -f "$out/moe-ep$n.json"
	echo "${cmd[*]}" >"$out/moe-ep$n.cmd"
	echo "== EP $n: ${cmd[*]}"
	"${cmd[@]}" 2>&1 | tee "$out/moe-ep$n.log"
	rc=${PIPESTATUS[0]}
	echo "$rc" >"$out/moe-ep$n.rc"
	if [ "$rc" -ne 0 ]; then
		echo "== EP $n failed (exit $rc; see $out/moe-ep$n.log)"
	fi
	echo "== EP $n done at $((SECONDS - start)) s"
done
[ "${KEEP_WEIGHTS:-0}" = 1 ] || rm -rf "$out/init"
"$py" "$here/moe_shape.py" summary "$out" --eps "$eps" --command "$command_line"
