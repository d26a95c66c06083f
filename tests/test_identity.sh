#!/usr/bin/env bash
# The identity that matters most, through real processes: generating 64 tokens in one run
# equals generating 32, saving the state, loading it in a new process and generating 32 more
# (greedy and seeded sampling, sse-h, gla-h, lalte, lansa, mamba2-h, dla-gdn and dla-mamba2; through a state file and,
# when the statestore is built in, through RocksDB). Also: same seed -> same tokens; the prefill piece size changes
# nothing; a damaged or foreign state file is refused with a message that says what is wrong.
set -euo pipefail
BIN=${HYLA_BIN_DIR:-build/bin}
T=$(mktemp -d /tmp/hyla-identity.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
PROMPT="It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, it was the epoch of belief."
for arch in sse-h gla-h lalte lansa mamba2-h dla-gdn dla-mamba2; do
  extra=() # lalte: a window small enough that the prompt evicts, retains and replaces tokens
  [ $arch = lalte ] && extra=(--window 16 --sink 2 --budget 6)
  [ $arch = lansa ] && extra=(--window 16 --block-size 8 --block-counts 4) # selection among blocks
  [ ${arch#dla-} != $arch ] && extra=(--dla-capacity 4 --dla-threshold 1.4) # fills the cache; merges and opens
  [ $arch = sse-h ] && extra=(--prefill-window 64) # the model's prefill chunk 64: pieces of 64 below
  "$BIN/hyla-mkmodel" --arch $arch --layers 4 --hidden 64 --heads 4 --seed 3 "${extra[@]}" --out "$T/$arch" 2>/dev/null
  for temp in 0 0.9; do
    run() { "$BIN/hyla-run" --model "$T/$arch" --ids --ignore-eos --quiet --temperature $temp --seed 11 "$@"; }
    full=$(run --prompt "$PROMPT" --max-tokens 64)
    again=$(run --prompt "$PROMPT" --max-tokens 64)
    # the prompt (139 tokens) in forward passes of 64 tokens instead of one: the same tokens
    p64=$(run --prompt "$PROMPT" --max-tokens 64 --prefill-piece 64)
    [ "$full" = "$p64" ] || { echo "FAIL $arch T=$temp: --prefill-piece 64 gave other tokens"; fail=1; }
    # a piece size that is not a multiple of 64 is refused, naming the flag (hyla-run, hyla-worker)
    if run --prompt "$PROMPT" --max-tokens 4 --prefill-piece 100 >/dev/null 2>"$T/err"; then
      echo "FAIL $arch: --prefill-piece 100 accepted by hyla-run"; fail=1
    fi
    grep -q -- "--prefill-piece" "$T/err" || { echo "FAIL $arch: hyla-run's refusal does not name --prefill-piece"; fail=1; }
    if [ -x "$BIN/hyla-worker" ]; then
      if timeout 20 "$BIN/hyla-worker" --model "$T/$arch" --listen 127.0.0.1:0 --next-stage 127.0.0.1:1 \
          --prefill-piece 100 >/dev/null 2>"$T/err"; then
        echo "FAIL $arch: --prefill-piece 100 accepted by hyla-worker"; fail=1
      fi
      grep -q -- "--prefill-piece" "$T/err" || { echo "FAIL $arch: hyla-worker's refusal does not name --prefill-piece"; fail=1; }
      if timeout 20 "$BIN/hyla-worker" --model "$T/$arch" --listen 127.0.0.1:0 --next-stage 127.0.0.1:1 \
          --max-message-bytes 1000 >/dev/null 2>"$T/err"; then
        echo "FAIL $arch: --max-message-bytes 1000 accepted by hyla-worker"; fail=1
      fi
      grep -q -- "--max-message-bytes" "$T/err" || { echo "FAIL $arch: hyla-worker's refusal does not name --max-message-bytes"; fail=1; }
    fi
    a=$(run --prompt "$PROMPT" --max-tokens 32 --save-state "$T/s.hyla")
    b=$("$BIN/hyla-run" --model "$T/$arch" --ids --ignore-eos --quiet --load-state "$T/s.hyla" --max-tokens 32)
    [ "$(echo $full | wc -w)" = 64 ] || { echo "FAIL $arch T=$temp: expected 64 ids, got: $full"; fail=1; }
    [ "$full" = "$again" ] || { echo "FAIL $arch T=$temp: same seed, different tokens"; fail=1; }
    if [ "$full" != "$a $b" ]; then
      echo "FAIL $arch T=$temp: file resume differs"; echo "  full:    $full"; echo "  resumed: $a $b"; fail=1
    fi
    if "$BIN/hyla-run" --help | grep -q -- "--store"; then
      a=$(run --prompt "$PROMPT" --max-tokens 32 --store "$T/db" --save-state "s-$arch-$temp")
      b=$("$BIN/hyla-run" --model "$T/$arch" --ids --ignore-eos --quiet --store "$T/db" --load-state "s-$arch-$temp" --max-tokens 32)
      [ "$full" = "$a $b" ] || { echo "FAIL $arch T=$temp: RocksDB resume differs"; fail=1; }
    fi
    if "$BIN/hyla-run" --help | grep -q -- "--session"; then
      # --store DIR --session ID: the first run starts the session, the second resumes it
      a=$(run --prompt "$PROMPT" --max-tokens 32 --store "$T/db2" --session "c-$arch-$temp")
      b=$("$BIN/hyla-run" --model "$T/$arch" --ids --ignore-eos --quiet --store "$T/db2" --session "c-$arch-$temp" --max-tokens 32)
      [ "$full" = "$a $b" ] || { echo "FAIL $arch T=$temp: --store --session resume differs"; fail=1; }
    fi
    echo "ok $arch temperature=$temp"
  done
done
# SSE's default prefill window (256): the model's prefill chunk is 256, so --prefill-piece 64 is
# refused naming the flag and the window, pieces of 256 give the tokens of one piece (a prompt
# of ~700 tokens), and a pipeline stage whose message limit cannot carry one chunk is refused
"$BIN/hyla-mkmodel" --arch sse-h --layers 4 --hidden 64 --heads 4 --seed 3 --out "$T/sse-w" 2>/dev/null
LONG="$PROMPT $PROMPT $PROMPT $PROMPT $PROMPT"
w() { "$BIN/hyla-run" --model "$T/sse-w" --ids --ignore-eos --quiet --seed 11 "$@"; }
if w --prompt "$PROMPT" --max-tokens 4 --prefill-piece 64 >/dev/null 2>"$T/err"; then
  echo "FAIL sse-h (window 256): --prefill-piece 64 accepted"; fail=1
fi
grep -q -- "--prefill-piece" "$T/err" && grep -q "prefill_window" "$T/err" ||
  { echo "FAIL sse-h (window 256): the refusal of --prefill-piece 64 names neither flag nor window: $(cat "$T/err")"; fail=1; }
[ "$(w --prompt "$LONG" --max-tokens 16)" = "$(w --prompt "$LONG" --max-tokens 16 --prefill-piece 256)" ] ||
  { echo "FAIL sse-h (window 256): --prefill-piece 256 gave other tokens"; fail=1; }
if [ -x "$BIN/hyla-worker" ]; then
  if timeout 20 "$BIN/hyla-worker" --model "$T/sse-w" --layers 0:2 --listen 127.0.0.1:0 --next-stage 127.0.0.1:1 \
      --max-message-bytes 65536 >/dev/null 2>"$T/err"; then
    echo "FAIL sse-h (window 256): a stage that cannot carry a prefill chunk was started"; fail=1
  fi
  grep -q -- "--max-message-bytes" "$T/err" && grep -q "prefill chunk" "$T/err" ||
    { echo "FAIL sse-h (window 256): the stage's refusal is unclear: $(cat "$T/err")"; fail=1; }
fi
echo "ok sse-h prefill window 256"
# a continuation prompt after a resume is fed after the pending token: same as one run with the joined prompt
p1="The first half of a document, "; p2="and the second half of it."
one=$("$BIN/hyla-run" --model "$T/sse-h" --ids --quiet --ignore-eos --prompt "$p1$p2" --max-tokens 8)
"$BIN/hyla-run" --model "$T/sse-h" --ids --quiet --prompt "$p1" --max-tokens 0 --save-state "$T/p.hyla" >/dev/null
two=$("$BIN/hyla-run" --model "$T/sse-h" --ids --quiet --ignore-eos --load-state "$T/p.hyla" --prompt "$p2" --max-tokens 8)
[ "$one" = "$two" ] || { echo "FAIL: prompt continued after resume differs: $one vs $two"; fail=1; }
# refusals
cp "$T/s.hyla" "$T/bad.hyla"
size=$(stat -c %s "$T/bad.hyla")
printf '\xff\xff\xff\xff' | dd of="$T/bad.hyla" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
if err=$("$BIN/hyla-run" --model "$T/gla-h" --load-state "$T/bad.hyla" --max-tokens 1 2>&1 >/dev/null); then
  echo "FAIL: a corrupted state file was accepted"; fail=1
else
  echo "$err" | grep -qiE "checksum|corrupt|mismatch" || { echo "FAIL: corrupt-state message unclear: $err"; fail=1; }
fi
if err=$("$BIN/hyla-run" --model "$T/sse-h" --load-state "$T/s.hyla" --max-tokens 1 2>&1 >/dev/null); then
  echo "FAIL: a gla-h state was accepted by an sse-h model"; fail=1
else
  echo "$err" | grep -q "another model" || { echo "FAIL: foreign-state message unclear: $err"; fail=1; }
fi
if "$BIN/hyla-run" --model "$T/nope" --prompt x --max-tokens 1 2>"$T/err" >/dev/null; then
  echo "FAIL: missing model accepted"; fail=1
else
  grep -q "config.json" "$T/err" || { echo "FAIL: missing-model message unclear: $(cat "$T/err")"; fail=1; }
fi
# numeric options that are not numbers in range exit 2 naming them (they were read as 0 before)
for a in "--temperature x" "--temperature -1" "--top-p 2" "--top-k 1.5" "--seed -1" "--seed 18446744073709551616"; do
  set -- $a
  rc=0
  "$BIN/hyla-run" --model "$T/sse-h" --prompt x --max-tokens 1 --quiet "$1" "$2" >/dev/null 2>"$T/err" || rc=$?
  [ $rc = 2 ] && grep -q -- "$1 must be" "$T/err" || { echo "FAIL: hyla-run $a: exit $rc, $(cat "$T/err")"; fail=1; }
done
# --prefill-window is an SSE key: another arch refuses it, naming it
rc=0
"$BIN/hyla-mkmodel" --arch gdn --layers 2 --hidden 64 --heads 2 --prefill-window 256 --out "$T/bad-model" >/dev/null 2>"$T/err" || rc=$?
[ $rc = 2 ] && grep -q -- "--prefill-window" "$T/err" || { echo "FAIL: hyla-mkmodel --prefill-window on gdn: exit $rc, $(cat "$T/err")"; fail=1; }
for a in "--layers abc" "--heads 0" "--short-conv 2" "--vocab 1" "--dla-threshold x"; do
  set -- $a
  rc=0
  "$BIN/hyla-mkmodel" --arch gdn --layers 2 --hidden 64 --heads 2 --out "$T/bad-model" "$1" "$2" >/dev/null 2>"$T/err" || rc=$?
  [ $rc = 2 ] && grep -q -- "$1 must be" "$T/err" || { echo "FAIL: hyla-mkmodel $a: exit $rc, $(cat "$T/err")"; fail=1; }
done
[ $fail = 0 ] && echo "test_identity: ok"
exit $fail
