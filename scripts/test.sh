#!/usr/bin/env bash
# Runs the tests like `go test` (default: every package) and ends with one line per skipped
# test and the reason it gave: the tests that need a GPU, a tool that is not installed or a
# file that is not fetched say so here instead of passing silently.
#
#   scripts/test.sh                 # go test ./...
#   scripts/test.sh -race ./tui/... # go test flags and packages (give the packages too)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- ./...
go build -o "${TMPDIR:-/tmp}/halo-testsummary" ./internal/testsummary
set +e
go test -json "$@" | "${TMPDIR:-/tmp}/halo-testsummary"
rc=$(( PIPESTATUS[0] > PIPESTATUS[1] ? PIPESTATUS[0] : PIPESTATUS[1] ))
set -e
exit "$rc"
