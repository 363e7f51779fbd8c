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
# It writes them into this checkout and packs the new and changed files into
# $OUT/family-fixtures.tar.gz (paths relative to the repository root; the device returns at
# most 8 files of 16 MiB), with the scripts' logs beside it. Unpack it at the repository root
# of the build machine with `tar xzf family-fixtures.tar.gz` and run
# `go test ./engine/models ./engine/hf/config`.
#
#   scripts/gpu/family-fixtures.sh [CASE ...]   # parity cases (default: the families below)
#
# PYTHON overrides the interpreter (python3); OUT the output directory (out/family-fixtures).
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-python3}"
out="${OUT:-out/family-fixtures}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee "$out/versions.txt"
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
	cases=(olmo2 olmo3 phi3_longrope granite smollm3 glm4 qwen2_moe glm4_moe deepseek_v3 deepseek_v3_qproj glm4_moe_lite gemma3_text gpt_oss)
fi
work="$(mktemp -d /tmp/ff.XXXXXX)"
status=0
export PYTHONUNBUFFERED=1
"$py" scripts/gpu/make_fixtures.py "$work" "${cases[@]}" >"$out/make_fixtures.log" 2>&1 || status=1
parity=()
for c in "${cases[@]}"; do
	if [ -f "$work/$c/reference.json" ]; then
		rm -rf "engine/models/testdata/parity/$c"
		cp -r "$work/$c" "engine/models/testdata/parity/$c"
		parity+=("engine/models/testdata/parity/$c")
	fi
done
(cd engine/hf/config/testdata && "$py" make_reference.py >"$out/make_reference.log" 2>&1 &&
	"$py" make_reference.py check golden >transformers/check.json 2>>"$out/make_reference.log") || status=1
"$py" engine/models/testdata/saved/check_transformers.py engine/models/testdata/saved >"$out/check_saved.log" 2>&1 || status=1
tar czf "$out/family-fixtures.tar.gz" "${parity[@]}" engine/hf/config/testdata/transformers \
	$(ls engine/models/testdata/saved/*/transformers.json)
ls -l "$out"
echo "family-fixtures.sh: ${#parity[@]} of ${#cases[@]} parity cases made; exit status $status (see the logs in $out)"
exit $status
