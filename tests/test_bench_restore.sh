#!/usr/bin/env bash
# hyla-bench restore on the CPU backend with tiny models (gdn: recurrent state only; sse-h: with
# attention KV): the subcommand runs end to end through a real RocksDB store, prints one JSON
# line per context, and its checks hold — the session restored from the store continues with
# the original's logits bit for bit, and prefilling the same tokens again gives the same state.
# Timings are not asserted. Skips (77) until hyla-bench and hyla-mkmodel exist.
set -uo pipefail
BIN=${HYLA_BIN_DIR:-build/bin}
[ -x "$BIN/hyla-bench" ] && [ -x "$BIN/hyla-mkmodel" ] || { echo "SKIP: $BIN/hyla-bench or hyla-mkmodel not built"; exit 77; }
T=$(mktemp -d /tmp/hyla-bench-restore.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
for arch in gdn sse-h; do
  "$BIN/hyla-mkmodel" --arch $arch --layers 2 --hidden 64 --heads 2 --head-dim 32 --partitions 2 --topk 1 \
    --kv-heads 2 --intermediate 128 --vocab 300 --seed 3 --out "$T/m_$arch" >/dev/null 2>&1 ||
    { echo "FAIL $arch: hyla-mkmodel"; fail=1; continue; }
  mkdir -p "$T/store"
  if ! "$BIN/hyla-bench" restore --model "$T/m_$arch" --device cpu --ctx 70,130 --store "$T/store" --repeat 1 \
      --decode-steps 2 >"$T/out_$arch.jsonl" 2>"$T/err_$arch"; then
    echo "FAIL $arch: hyla-bench restore exited non-zero"; cat "$T/err_$arch"; fail=1; continue
  fi
  n=$(grep -c '"bench":"restore"' "$T/out_$arch.jsonl")
  [ "$n" = 2 ] || { echo "FAIL $arch: $n result lines, expected 2"; fail=1; }
  [ "$(grep -c '"same_logits":true' "$T/out_$arch.jsonl")" = 2 ] || { echo "FAIL $arch: restored logits differ"; fail=1; }
  [ "$(grep -c '"reprefill_same_state":true' "$T/out_$arch.jsonl")" = 2 ] || { echo "FAIL $arch: re-prefill state differs"; fail=1; }
  grep -q '"ctx":130,' "$T/out_$arch.jsonl" || { echo "FAIL $arch: no line for ctx 130"; fail=1; }
  [ "$(grep -c '"restore_tail_s":[0-9]' "$T/out_$arch.jsonl")" = 2 ] || { echo "FAIL $arch: no restore_tail_s"; fail=1; }
  [ -z "$(ls -A "$T/store")" ] || { echo "FAIL $arch: the bench left its store behind"; fail=1; }
  if [ $arch = sse-h ]; then
    grep -q '"kv_bytes":0,' "$T/out_$arch.jsonl" && { echo "FAIL sse-h: no KV in the snapshot"; fail=1; }
  fi
done
# HYLA_LOG=debug: each restore logs its read span and import end, and the codec its threads' times
mkdir -p "$T/store"
HYLA_LOG=debug "$BIN/hyla-bench" restore --model "$T/m_gdn" --device cpu --ctx 70 --store "$T/store" --repeat 1 \
  --decode-steps 2 >/dev/null 2>"$T/err_debug" || { echo "FAIL: hyla-bench restore with HYLA_LOG=debug"; fail=1; }
grep -q "restore bench: read .* import end" "$T/err_debug" || { echo "FAIL: no restore timing line at debug"; fail=1; }
grep -q "codec decode .* fetch .* decode" "$T/err_debug" || { echo "FAIL: no codec thread timings at debug"; fail=1; }
# a bad option is refused with the usage
"$BIN/hyla-bench" restore --bogus >/dev/null 2>"$T/err" && { echo "FAIL: --bogus accepted"; fail=1; }
grep -q "usage: hyla-bench restore" "$T/err" || { echo "FAIL: no usage on a bad option"; fail=1; }
[ $fail = 0 ] && echo "test_bench_restore: ok"
exit $fail
