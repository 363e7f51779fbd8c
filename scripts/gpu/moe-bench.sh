#!/usr/bin/env bash
# The mixture-of-experts training benchmark: halo-shell against stock PyTorch + transformers,
# measured in one run on one GPU from the same initial weights on the same token rows, for
# several MoE shapes; optionally an expert-parallel sweep over several GPUs.
#
#   CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell     # on the build machine
#   scripts/gpu/moe-bench.sh OUTDIR [--cases LIST] [--steps N] [--warmup N] [--eps LIST]
#
# Each case is SHAPE:LAYERS:BATCHxSEQ, SHAPE one of bench_torch.py's MoE shapes
# (qwen3-30b-a3b, olmoe-1b-7b, mixtral-8x7b: the Hub configs of Qwen3-30B-A3B,
# OLMoE-1B-7B-0924 and Mixtral-8x7B; deepseek-v4-flash: DeepSeek-V4-Flash's attention with
# fewer experts, as bench_torch.py gives it) with LAYERS decoder layers. Default cases:
#
#   qwen3-30b-a3b:4:4x2048  qwen3-30b-a3b:8:2x4096  olmoe-1b-7b:16:4x2048  mixtral-8x7b:4:4x2048
#
# For each case, in OUTDIR/<shape>-<layers>l-<batch>x<seq>/ (one engine at a time, each in its
# own process so the GPU's memory is free again between them):
#
#   python3 scripts/gpu/bench_torch.py --shape S --layers L ...   builds the model with
#       transformers (random init, bf16, sdpa, its default experts implementation), saves it to
#       init/, writes tokens.jsonl, trains with fused AdamW and writes torch.json
#   bin/halo-shell run bench-train --model init --data tokens.jsonl --device cuda ...
#       trains the same weights on the same rows and writes halo.json
#
# then scripts/gpu/bench_compare.py OUTDIR --report moe-report.json --target-speed 1.5
# --target-memory 0.8 writes OUTDIR/moe-report.json: per case tokens_per_s_ratio and
# peak_memory_ratio (ours / stock), both loss curves and their differences, MFU on active
# parameters, both breakdowns and pass/fail against the targets (1.5x tokens/s at no more than
# 0.8x peak memory; the loss checks of bench_compare.py). The initial weights are deleted after
# each case unless KEEP_WEIGHTS=1.
#
# Options (defaults in brackets):
#   --cases LIST   comma-separated cases [the four above]
#   --steps N      timed optimizer steps [20]
#   --warmup N     leading steps left out of the medians [3]
#   --lr X         constant learning rate [1e-4]
#   --variants LIST  also train halo-shell once per variant in LIST on each case's weights and
#                  rows: a HALO_CUDA_GROUPED_GEMM value (wg-n256), or any switch setting written
#                  NAME=VALUE (HALO_MOE_PATH=composed), or several joined by '+'
#                  (wg-n256+HALO_MOE_EXPERT_OUTPUTS=keep); into halo-<variant>.json and .log
#                  beside halo.json ('=' written '-' in the file name), and write
#                  OUTDIR/variants.json: per case and variant the tokens/s, its ratio to the
#                  default run's, peak GiB and the largest loss difference from the default
#                  run [none]
#   --eps LIST     also run the expert-parallel sweep (EP sizes of 1, 2, 4, 8, at most the GPUs
#                  present) of the first case through halo-shell alone, into OUTDIR/ep/
#                  (moe-ep{N}.json, and moe_shape.py's summary moe-ep-report.json: tokens/s,
#                  peak memory per GPU and the dispatch and combine all-to-all shares) [none]
#
# HALO_BENCH_TRACE=1 also writes halo-shell's profiled step as a Chrome/Perfetto trace per case.
# HALO_BIN overrides the binary (bin/halo-shell), PYTHON the interpreter (python3),
# HALO_REVISION the source revision recorded in the report.
set -uo pipefail
usage="usage: moe-bench.sh OUTDIR [--cases LIST] [--steps N] [--warmup N] [--lr X] [--variants LIST] [--eps LIST]"
out=${1:?$usage}
shift
command_line="scripts/gpu/moe-bench.sh $out $*"
cases=qwen3-30b-a3b:4:4x2048,qwen3-30b-a3b:8:2x4096,olmoe-1b-7b:16:4x2048,mixtral-8x7b:4:4x2048
steps=20 warmup=3 lr=1e-4 eps="" variants=""
while [ $# -gt 0 ]; do
	case $1 in
	--cases) cases=${2-} ;;
	--steps) steps=${2-} ;;
	--warmup) warmup=${2-} ;;
	--lr) lr=${2-} ;;
	--eps) eps=${2-} ;;
	--variants) variants=${2-} ;;
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
positive() {
	case $2 in
	'' | *[!0-9]* | 0)
		echo "moe-bench.sh: $1 $2: give a positive whole number" >&2
		exit 2
		;;
	esac
}
positive --steps "$steps"
case $warmup in
'' | *[!0-9]*)
	echo "moe-bench.sh: --warmup $warmup: give a whole number" >&2
	exit 2
	;;
esac
# Parse every case before any work, so a typo costs nothing.
names=() shapes=() layers=() batches=() seqlens=()
for c in ${cases//,/ }; do
	IFS=: read -r s l bs <<<"$c"
	b=${bs%x*} t=${bs#*x}
	case $s in
	qwen3-30b-a3b | olmoe-1b-7b | mixtral-8x7b | deepseek-v4-flash) ;;
	*)
		echo "moe-bench.sh: case $c: unknown shape '$s' (qwen3-30b-a3b, olmoe-1b-7b, mixtral-8x7b or deepseek-v4-flash)" >&2
		exit 2
		;;
	esac
	if [ "$bs" = "$b" ] || [ -z "$l" ]; then
		echo "moe-bench.sh: case $c: write SHAPE:LAYERS:BATCHxSEQ, e.g. qwen3-30b-a3b:4:4x2048" >&2
		exit 2
	fi
	positive "case $c layers" "$l"
	positive "case $c batch" "$b"
	positive "case $c sequence length" "$t"
	names+=("$s-${l}l-${b}x$t") shapes+=("$s") layers+=("$l") batches+=("$b") seqlens+=("$t")
done
# variant_env V prints the environment assignments of variant V, one per line.
variant_env() {
	local part
	for part in ${1//+/ }; do
		case $part in
		HALO_*=*) echo "$part" ;;
		*=*)
			echo "moe-bench.sh: variant $1: $part is not a HALO_* switch setting" >&2
			return 1
			;;
		*) echo "HALO_CUDA_GROUPED_GEMM=$part" ;;
		esac
	done
}
for v in ${variants//,/ }; do
	case $v in
	*[!A-Za-z0-9_.=+-]*)
		echo "moe-bench.sh: --variants: $v: use letters, digits and . _ - = + only" >&2
		exit 2
		;;
	esac
	variant_env "$v" >/dev/null || exit 2
done
if [ ${#names[@]} -eq 0 ]; then
	echo "moe-bench.sh: --cases is empty" >&2
	exit 2
fi
bin=${HALO_BIN:-bin/halo-shell}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$bin" ]; then
	echo "moe-bench.sh: $bin not found: build it with CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell" >&2
	exit 2
fi
mkdir -p "$out"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
export HALO_CUDA_CACHE=${HALO_CUDA_CACHE:-$out/kernel-cache}
export PYTHONUNBUFFERED=1
start=$SECONDS
for i in "${!names[@]}"; do
	d=$out/${names[$i]}
	rm -rf "$d"
	mkdir -p "$d"
	common=(--steps "$steps" --warmup "$warmup" --batch "${batches[$i]}" --seq-len "${seqlens[$i]}" --lr "$lr"
		--beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0 --max-grad-norm 1.0)
	echo "== ${names[$i]}: torch"
	"$py" "$here/bench_torch.py" --shape "${shapes[$i]}" --layers "${layers[$i]}" --out "$d" "${common[@]}" 2>&1 | tee "$d/torch.log"
	if [ "${PIPESTATUS[0]}" -ne 0 ] || [ ! -f "$d/init/config.json" ]; then
		echo "== ${names[$i]}: the baseline failed; skipping halo-shell (it needs the baseline's weights and rows)"
		continue
	fi
	echo "== ${names[$i]}: halo-shell"
	trace_flag=()
	[ "${HALO_BENCH_TRACE:-0}" = 1 ] && trace_flag=(--trace "$d/halo-trace.json")
	"$bin" run bench-train --model "$d/init" --data "$d/tokens.jsonl" --device cuda --optim adamw_bf16_nearest \
		"${common[@]}" "${trace_flag[@]}" --out "$d/halo.json" 2>&1 | tee "$d/halo.log"
	[ "${PIPESTATUS[0]}" -ne 0 ] && echo "== ${names[$i]}: halo-shell failed (see $d/halo.log)"
	for v in ${variants//,/ }; do
		mapfile -t venv < <(variant_env "$v")
		tag=${v//=/-}
		echo "== ${names[$i]}: halo-shell, ${venv[*]}"
		env "${venv[@]}" "$bin" run bench-train --model "$d/init" --data "$d/tokens.jsonl" --device cuda \
			--optim adamw_bf16_nearest "${common[@]}" --out "$d/halo-$tag.json" >"$d/halo-$tag.log" 2>&1 ||
			echo "== ${names[$i]}: ${venv[*]} failed (see $d/halo-$tag.log)"
		tail -1 "$d/halo-$tag.log"
	done
	if [ -n "$eps" ] && [ "$i" = 0 ]; then
		mkdir -p "$out/ep"
		cp -r "$d/init" "$out/ep/init" && cp "$d/tokens.jsonl" "$out/ep/tokens.jsonl"
	fi
	[ "${KEEP_WEIGHTS:-0}" = 1 ] || rm -rf "$d/init"
	echo "== ${names[$i]}: done at $((SECONDS - start)) s"
done
if [ -n "$variants" ]; then
	"$py" - "$out" "$variants" "${names[@]}" <<'PY'
import json, os, sys
out, variants, names = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
rows = []
for name in names:
    base = load(os.path.join(out, name, "halo.json"))
    for v in variants:
        r = load(os.path.join(out, name, "halo-%s.json" % v.replace("=", "-")))
        row = {"case": name, "variant": v, "ok": r is not None}
        if r is not None:
            row["tokens_per_s"] = r["tokens_per_s"]
            row["peak_allocated_gib"] = r["memory"]["peak_allocated_gib"]
            if base is not None:
                row["tokens_per_s_vs_default"] = r["tokens_per_s"] / base["tokens_per_s"]
                row["loss_max_abs_diff_vs_default"] = max(abs(a - b) for a, b in zip(r["losses"], base["losses"]))
        rows.append(row)
with open(os.path.join(out, "variants.json"), "w") as f:
    json.dump({"variants": rows}, f, indent=1)
for row in rows:
    print(json.dumps(row))
PY
fi
rev=${HALO_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
"$py" "$here/bench_compare.py" "$out" --command "$command_line" --revision "$rev" \
	--report moe-report.json --target-speed 1.5 --target-memory 0.8

# The expert-parallel sweep: halo-shell alone on the first case's weights and rows.
[ -z "$eps" ] && exit 0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ ! -f "$out/ep/init/config.json" ]; then
	echo "== EP sweep: the first case left no weights; not run"
	exit 1
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
		echo "== EP $n needs $n GPUs; nvidia-smi lists $gpus: not run" | tee "$out/ep/moe-ep$n.log"
		echo 2 >"$out/ep/moe-ep$n.rc"
		continue
	fi
	b=$(((batches[0] + n - 1) / n * n))
	if [ "$n" = 1 ]; then
		where=(--device cuda:0)
	else
		where=(--devices "cuda:0-$((n - 1))" --ep "$n")
	fi
	cmd=("$bin" run bench-train --model "$out/ep/init" --data "$out/ep/tokens.jsonl" "${where[@]}"
		--steps "$steps" --warmup "$warmup" --batch "$b" --seq-len "${seqlens[0]}" --out "$out/ep/moe-ep$n.json")
	echo "${cmd[*]}" >"$out/ep/moe-ep$n.cmd"
	echo "== EP $n: ${cmd[*]}"
	NCCL_NVLS_ENABLE=0 "${cmd[@]}" 2>&1 | tee "$out/ep/moe-ep$n.log"
	echo "${PIPESTATUS[0]}" >"$out/ep/moe-ep$n.rc"
done
[ "${KEEP_WEIGHTS:-0}" = 1 ] || rm -rf "$out/ep/init"
"$py" "$here/moe_shape.py" summary "$out/ep" --eps "$eps" --command "$command_line"
