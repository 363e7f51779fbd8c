#!/usr/bin/env bash
# Builds the release halo-shell binary: pure Go, no C toolchain (CGO_ENABLED=0; the CUDA
# driver, NVRTC, cuBLASLt and NCCL are loaded at run time), without file-system paths
# (-trimpath) or symbol and debug tables (-s -w). It is static but for glibc, which purego
# links for dlopen. The Dockerfile's build stage runs it, and so does CI; it checks what it
# built.
#
#   scripts/build-static.sh [OUT]     # default bin/halo-shell-static
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/halo-shell-static}
mkdir -p "$(dirname "$out")"
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out" ./cmd/halo-shell

# The binary must say it was built that way (go records no -ldflags under -trimpath).
info=$(go version -m "$out")
for want in 'CGO_ENABLED=0' '-trimpath=true'; do
	grep -qF -- "$want" <<<"$info" || { echo "build-static: $out lacks build setting $want:" >&2; echo "$info" >&2; exit 1; }
done
# Without cgo the binary still links the C library dynamically: purego's dlopen of the CUDA
# libraries needs it. It must need nothing beyond glibc, which every image it runs on has.
if command -v ldd >/dev/null 2>&1; then
	extra=$(ldd "$out" | awk '{print $1}' | grep -v -E '^(linux-vdso\.so\.1|libc\.so\.6|libdl\.so\.2|libpthread\.so\.0|/lib64/ld-linux-x86-64\.so\.2|/lib/ld-linux-aarch64\.so\.1)$' || true)
	if [ -n "$extra" ]; then
		echo "build-static: $out needs libraries beyond glibc: $extra" >&2
		exit 1
	fi
fi
"$out" --help >/dev/null
echo "built $out ($(du -h "$out" | cut -f1); CGO_ENABLED=0 -trimpath -ldflags='-s -w'; needs only glibc)"
