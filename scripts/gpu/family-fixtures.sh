#!/usr/bin/env bash
# Makes, with transformers, every reference the family tests read, in one pass on a machine
# with torch and transformers 5.17 (the GPU machine; all of it runs on its CPU in float32):
#
#   engine/models/testdata/parity/CASE/     tiny random models and transformers' logprobs,
#                                           gradients and AdamW losses (make_fixtures.py)
#   engine/hf/config/testdata/transformers/ what transformers' config classes save and derive,
#                                           and check.json: our golden config.json files
#                                           loaded, re-saved and built by transformers
#                                           (make_reference.py)
#   engine/models/testdata/saved/*/transformers.json
#                                           transformers' logprobs of the checkpoints that
#                                           halo-shell saved (check_transformers.py)
#
# It writes them into this checkout and packs the new and changed files, paths relative to the
# repository root, into $OUT/family-fixtures.tgz.part-aa, -ab, ... (pieces of 15 MiB: the device
# returns at most 8 files of 16 MiB), with every script's output in $OUT/family-fixtures.log.
# Unpack at the repository root of the build machine with
# `cat family-fixtures.tgz.part-* | tar xz` and run `go test ./engine/models ./engine/hf/config`.
#
#   scripts/gpu/family-fixtures.sh [CASE ...]
#
# Without CASE names it makes every case of make_fixtures.py that has no directory under
# engine/models/testdata/parity yet. PYTHON overrides the interpreter (python3); OUT the output
# directory (out/family-fixtures).
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-python3}"
out="${OUT:-out/family-fixtures}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/family-fixtures.log"
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee "$log"
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
	# The cases of make_fixtures.py without a fixture directory yet (read without importing
	# torch: CASES is plain data).
	mapfile -t cases < <("$py" - <<'PY'
import os
src = open("scripts/gpu/make_fixtures.py").read()
ns = {}
exec(src[src.index("B, T = 2, 16"):src.index("MOE_FAMILIES")], ns)
for name, _, _ in ns["CASES"]:
    if not os.path.isdir(os.path.join("engine/models/testdata/parity", name)):
        print(name)
PY
)
fi
echo "cases: ${cases[*]}" | tee -a "$log"
work="$(mktemp -d /tmp/ff.XXXXXX)"
status=0
export PYTHONUNBUFFERED=1
echo "== make_fixtures.py" >>"$log"
"$py" scripts/gpu/make_fixtures.py "$work" "${cases[@]}" >>"$log" 2>&1 || status=1
parity=()
for c in "${cases[@]}"; do
	if [ -f "$work/$c/reference.json" ]; then
		rm -rf "engine/models/testdata/parity/$c"
		cp -r "$work/$c" "engine/models/testdata/parity/$c"
		parity+=("engine/models/testdata/parity/$c")
	fi
done
echo "== make_reference.py" >>"$log"
(cd engine/hf/config/testdata && "$py" make_reference.py >>"$log" 2>&1 &&
	"$py" make_reference.py check golden >transformers/check.json 2>>"$log") || status=1
echo "== check_transformers.py" >>"$log"
"$py" engine/models/testdata/saved/check_transformers.py engine/models/testdata/saved >>"$log" 2>&1 || status=1
tar czf - "${parity[@]}" engine/hf/config/testdata/transformers $(ls engine/models/testdata/saved/*/transformers.json) |
	split -b 15m - "$out/family-fixtures.tgz.part-"
ls -l "$out"
echo "family-fixtures.sh: ${#parity[@]} of ${#cases[@]} parity cases made; exit status $status (see $log)"
exit $status
