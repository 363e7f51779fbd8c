#!/usr/bin/env bash
# The training benchmark: halo-shell against stock PyTorch + transformers, measured in one run
# on one GPU, from the same initial weights on the same token rows.
#
#   CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell     # on the build machine
#   scripts/gpu/bench.sh OUTDIR                                   # on the GPU machine
#
# For each shape (Qwen3-0.6B, Llama-3.2-1B; one at a time, each engine in its own process so
# the GPU's memory is free again between them) it runs
#
#   python3 scripts/gpu/bench_torch.py --shape S --out OUTDIR/S ...   builds the model with
#       transformers (random init, bf16, sdpa), saves it to OUTDIR/S/init, writes the token rows
#       to OUTDIR/S/tokens.jsonl, trains with fused AdamW and writes OUTDIR/S/torch.json
#   bin/halo-shell run bench-train --model OUTDIR/S/init --data OUTDIR/S/tokens.jsonl
#       --device cuda ... --out OUTDIR/S/halo.json
#
# then scripts/gpu/bench_compare.py OUTDIR writes OUTDIR/bench-report.json (ratios, loss
# curves and their differences, pass/fail against the targets, breakdowns, versions, GPU) and
# prints a table. The initial weights are deleted after each shape unless KEEP_WEIGHTS=1.
#
# Options (defaults in brackets) go to both engines:
#   --shapes LIST    comma-separated [qwen3-0.6b,llama-3.2-1b]
#   --steps N        timed optimizer steps [20]
#   --warmup N       leading steps left out of the medians [3]
#   --batch N        rows per step [4]
#   --seq-len N      tokens per row [4096]
#   --layers N       override num_hidden_layers, for a quick smoke run [the model's]
#   --lr X           constant learning rate [1e-4; at 3e-4 the Llama shape spikes in both engines]
#   --beta1 X --beta2 X --eps X --weight-decay X   AdamW [0.9, 0.95, 1e-8, 0]
#   --max-grad-norm X  gradient clipping, 0 for none [1.0]
# and to halo-shell only:
#   --optim NAME     adamw_bf16_nearest (torch's update rule for bf16 weights), adamw_bf16 or
#                    adamw_torch [adamw_bf16_nearest]
#
# Smoke run (about a minute): scripts/gpu/bench.sh /tmp/b --shapes qwen3-0.6b --steps 4 --seq-len 512 --layers 2
# HALO_BENCH_TRACE=1 also writes halo-shell's profiled step as a Chrome/Perfetto trace
# (OUTDIR/S/halo-trace.json: every op timed on the GPU). HALO_BIN overrides the binary (bin/halo-shell); PYTHON the interpreter (python3); HALO_REVISION
# the source revision recorded in the report (default: git rev-parse HEAD, which is stale or
# missing in a copied tree).
set -uo pipefail
out=${1:?usage: bench.sh OUTDIR [--shapes LIST] [--steps N] [--warmup N] [--batch N] [--seq-len N] [--layers N] [--lr X] [--beta1 X] [--beta2 X] [--eps X] [--weight-decay X] [--max-grad-norm X] [--optim NAME]}
shift
command_line="scripts/gpu/bench.sh $out $*"
shapes=qwen3-0.6b,llama-3.2-1b
steps=20 warmup=3 batch=4 seqlen=4096 layers=0 lr=1e-4 gradnorm=1.0 optim=adamw_bf16_nearest
beta1=0.9 beta2=0.95 eps=1e-8 wd=0
while [ $# -gt 0 ]; do
	case $1 in
	--shapes) shapes=$2 ;;
	--steps) steps=$2 ;;
	--warmup) warmup=$2 ;;
	--batch) batch=$2 ;;
	--seq-len) seqlen=$2 ;;
	--layers) layers=$2 ;;
	--lr) lr=$2 ;;
	--beta1) beta1=$2 ;;
	--beta2) beta2=$2 ;;
	--eps) eps=$2 ;;
	--weight-decay) wd=$2 ;;
	--max-grad-norm) gradnorm=$2 ;;
	--optim) optim=$2 ;;
	*)
		echo "bench.sh: unknown option $1" >&2
		exit 2
		;;
	esac
	shift 2 || {
		echo "bench.sh: $1 needs a value" >&2
		exit 2
	}
done
bin=${HALO_BIN:-bin/halo-shell}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$bin" ]; then
	echo "bench.sh: $bin not found: build it with CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell" >&2
	exit 2
fi
mkdir -p "$out"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
export HALO_CUDA_CACHE=${HALO_CUDA_CACHE:-$out/kernel-cache}
export PYTHONUNBUFFERED=1
common=(--steps "$steps" --warmup "$warmup" --batch "$batch" --seq-len "$seqlen" --lr "$lr" --beta1 "$beta1"
	--beta2 "$beta2" --eps "$eps" --weight-decay "$wd" --max-grad-norm "$gradnorm")
start=$SECONDS
for shape in ${shapes//,/ }; do
	d=$out/$shape
	rm -rf "$d"
	mkdir -p "$d"
	echo "== $shape: torch"
	layer_flag=()
	[ "$layers" != 0 ] && layer_flag=(--layers "$layers")
	"$py" "$here/bench_torch.py" --shape "$shape" --out "$d" "${common[@]}" "${layer_flag[@]}" 2>&1 | tee "$d/torch.log"
	if [ "${PIPESTATUS[0]}" -ne 0 ] || [ ! -f "$d/init/config.json" ]; then
		echo "== $shape: the baseline failed; skipping halo-shell (it needs the baseline's weights and rows)"
		continue
	fi
	echo "== $shape: halo-shell"
	trace_flag=()
	[ "${HALO_BENCH_TRACE:-0}" = 1 ] && trace_flag=(--trace "$d/halo-trace.json")
	"$bin" run bench-train --model "$d/init" --data "$d/tokens.jsonl" --device cuda --optim "$optim" \
		"${common[@]}" "${trace_flag[@]}" --out "$d/halo.json" 2>&1 | tee "$d/halo.log"
	[ "${PIPESTATUS[0]}" -ne 0 ] && echo "== $shape: halo-shell failed (see $d/halo.log)"
	[ "${KEEP_WEIGHTS:-0}" = 1 ] || rm -rf "$d/init"
	echo "== $shape: done at $((SECONDS - start)) s"
done
rev=${HALO_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
"$py" "$here/bench_compare.py" "$out" --command "$command_line" --revision "$rev"
