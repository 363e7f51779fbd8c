#!/bin/sh
# Regenerates the Go code for halo/v1/session.proto. Needs protoc (Debian: protobuf-compiler);
# the plugins are pinned in tools/go.mod and run with `go tool`. The generated code is committed,
# so building the project never needs this script.
set -eu
cd "$(dirname "$0")"
tools="$(cd ../../tools && pwd)"
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
(cd "$tools" && go build -o "$bin/" google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/v2/cmd/protoc-gen-connect-go)
PATH="$bin:$PATH" protoc -I . \
  --go_out=. --go_opt=paths=source_relative \
  --connect-go_out=. --connect-go_opt=paths=source_relative \
  halo/v1/session.proto
