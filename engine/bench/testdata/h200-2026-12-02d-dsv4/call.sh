# The MoE bench on the deepseek-v4-flash shape: halo-shell's device path for deepseek_v4
# against stock transformers (eager attention, bf16) in the same script, one H200.
# Run from the repository root on the GPU machine with bin/ (or binx/) carried; DIR is where
# the reports go ($OUT/moe by default).
set -u
out=${OUT:-/tmp}; unset OUT
mkdir -p bin
for f in halo-shell; do [ -f bin/$f ] || { xz -dc binx/$f.xz > bin/$f; chmod +x bin/$f; }; done
dir=${1:-/tmp/dsv4}
HALO_REVISION=$(cat binx/rev.txt 2>/dev/null || echo unknown) timeout ${LIMIT:-540} \
	scripts/gpu/moe-bench.sh "$dir" --cases deepseek-v4-flash:4:1x2048 --steps ${STEPS:-8} --warmup 2 > "$out/moe.txt" 2>&1
echo "moe-bench rc=$?" >> "$out/moe.txt"
(cd "$dir" && find . -name init -prune -o -name kernel-cache -prune -o -type f -print | tar czf "$out/moe.tgz" -T -)
tail -14 "$out/moe.txt"
