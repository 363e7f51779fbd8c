#!/usr/bin/env bash
# Executes every lecture notebook (notebooks/NN-*.ipynb) headless on this machine's GPU and
# writes the executed notebooks, with their measurements, plots and verdicts, to
# notebooks/executed/<gpu>/ (<gpu> from nvidia-smi without the vendor, e.g. h200 for an NVIDIA
# H200), plus verdicts.txt there: every verdict line of every notebook and how long each
# notebook took. Lectures 08-11 lay runs out over two devices: GPUs when the machine has two or
# more, otherwise two simulated CPU devices (their verdicts say which).
#
#   CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell     # on the build machine
#   scripts/gpu/lectures.sh                                       # on the GPU machine, repo root
#
# Notebooks run with python3's nbclient where it has nbclient and nbformat, else with
# `halo-shell notebook run` (the same kernel over the same wire protocol; no Python needed), and
# the verdicts are read with `halo-shell notebook outputs`. Each notebook's kernel starts a session of
# its own (a private session directory per notebook, so that no notebook waits for control
# held by the previous one's kernel), which opens the first GPU ("auto") for its measurements;
# the script stops it after the notebook.
# HALO_BIN overrides the binary (bin/halo-shell); PYTHON the interpreter (python3); EXECUTOR
# picks nbclient or halo (default: nbclient when PYTHON has it); CELL_TIMEOUT bounds one cell
# under halo (default 10m); NOTEBOOKS_OUT the output directory (notebooks/executed/<gpu>; a
# name of its own, so that an OUT set by the environment for other outputs is not taken for it).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"
bin="${HALO_BIN:-bin/halo-shell}"
py="${PYTHON:-python3}"
[ -x "$bin" ] || { echo "lectures.sh: $bin not found: build it first (CGO_ENABLED=0 go build -o bin/halo-shell ./cmd/halo-shell)" >&2; exit 1; }
executor="${EXECUTOR:-}"
if [ -z "$executor" ]; then
  if "$py" -c 'import nbclient, nbformat' >/dev/null 2>&1; then executor=nbclient; else executor=halo; fi
fi
case "$executor" in
  nbclient) "$py" -c 'import nbclient, nbformat' >/dev/null 2>&1 || { echo "lectures.sh: EXECUTOR=nbclient but $py lacks nbclient/nbformat (pip install nbclient nbformat, or EXECUTOR=halo)" >&2; exit 1; } ;;
  halo) ;;
  *) echo "lectures.sh: EXECUTOR=$executor: want nbclient or halo" >&2; exit 1 ;;
esac
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr '[:upper:] ' '[:lower:]-' | tr -cd 'a-z0-9-')"
gpu="${gpu#nvidia-}"
[ -n "$gpu" ] || { echo "lectures.sh: no GPU found by nvidia-smi; the notebooks would measure the CPU (run them with kernel/lectures_test.go instead)" >&2; exit 1; }
out="${NOTEBOOKS_OUT:-notebooks/executed/$gpu}"
mkdir -p "$out"
work="$(mktemp -d /tmp/hl.XXXXXX)"
export JUPYTER_PATH="$work/prefix/share/jupyter" JUPYTER_DATA_DIR="$work/data" JUPYTER_RUNTIME_DIR="$work/runtime" \
  JUPYTER_CONFIG_DIR="$work/config" JUPYTER_PLATFORM_DIRS=1 HALO_SESSION_DIR="$work/s" PYDEVD_DISABLE_FILE_VALIDATION=1
cleanup() {
  "$bin" session stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" kernel install --prefix "$work/prefix" >/dev/null
summary="$out/verdicts.txt"
{ echo "# lectures on $gpu, $(date -u +%Y-%m-%dT%H:%M:%SZ), revision $(git rev-parse --short HEAD 2>/dev/null || echo unknown), executed by $executor"; } >"$summary"
status=0
for nb in notebooks/[0-9][0-9]-*.ipynb; do
  name="$(basename "$nb" .ipynb)"
  export HALO_SESSION_DIR="$work/s-$name"
  start=$(date +%s%N)
  if [ "$executor" = nbclient ]; then
    run=("$py" kernel/testdata/run_notebook.py "$nb" "$out/$name.ipynb" "$root")
  else
    run=("$bin" notebook run "$nb" --out "$out/$name.ipynb" --dir "$root" --timeout "${CELL_TIMEOUT:-10m}" --verbose)
  fi
  if "${run[@]}"; then
    result=ok
  else
    result=FAILED
    status=1
  fi
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  secs=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  "$bin" session stop >/dev/null 2>&1 || true
  echo "## $name: $result in ${secs}s" | tee -a "$summary"
  if [ -f "$out/$name.ipynb" ]; then
    { "$bin" notebook outputs "$out/$name.ipynb" | grep '^verdict: ' || true; } | tee -a "$summary"
  fi
done
if grep -q '^verdict: unknown' "$summary"; then status=1; fi
echo "executed notebooks and verdicts.txt in $out"
exit $status
