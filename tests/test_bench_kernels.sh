#!/usr/bin/env bash
# hyla-bench kernels --only mamba2 | statex | dla | nsa | seq on the CPU backend (--quick sizes): each mode
# runs to the end and prints its rows — the copy rate first, then SSD prefill and decode (state
# 128; statex: 512 and GLA at H 4 dk 256 dv 512 and the merged H 1 dk 1024 dv 2048, which the CPU
# backend takes), DLA decode at 1 and 30 states against the plain bases, DLA prefill and decode
# from its cache; decode rows carry their share of the copy rate; the CPU refuses no shape.
# hyla-bench e2e on a tiny model reports the runtime's scratch (no logits for a prompt fed without
# them), the model's prefill chunk (64; 256 for an SSE model) and, with --prefill-repeat 3, the
# median prefill with its fastest and slowest beside it.
# A bad option of kernels or e2e exits 2 naming it, the usage on stderr; --help prints it on
# stdout. Timings are not asserted. Skips (77) until hyla-bench exists.
set -uo pipefail
BIN=${HYLA_BIN_DIR:-build/bin}
[ -x "$BIN/hyla-bench" ] || { echo "SKIP: $BIN/hyla-bench not built"; exit 77; }
T=$(mktemp -d /tmp/hyla-bench-kernels.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
count() { grep -c "\"bench\":\"$1\"" "$T/$2.jsonl"; }
want() { # mode bench expected-count
  local n; n=$(count "$2" "$1")
  [ "$n" = "$3" ] || { echo "FAIL $1: $n '$2' rows, expected $3"; fail=1; }
}
for mode in mamba2 statex dla; do
  if ! "$BIN/hyla-bench" kernels --device cpu --quick --only $mode >"$T/$mode.jsonl" 2>"$T/$mode.err"; then
    echo "FAIL $mode: hyla-bench kernels exited non-zero"; cat "$T/$mode.err"; fail=1; continue
  fi
  want $mode copy_bandwidth 1
  grep -q '"error"' "$T/$mode.jsonl" && { echo "FAIL $mode: the CPU refused a shape"; grep '"error"' "$T/$mode.jsonl"; fail=1; }
  grep '_decode"' "$T/$mode.jsonl" | grep -qv '"of_copy"' && [ $mode != dla ] && { echo "FAIL $mode: a decode row without of_copy"; fail=1; }
done
want mamba2 ssd_prefill 1
want mamba2 ssd_decode 2
grep -q '"N":128,' "$T/mamba2.jsonl" || { echo "FAIL mamba2: no state-128 rows"; fail=1; }
want statex ssd_prefill 1
want statex ssd_decode 2
grep -q '"N":512,' "$T/statex.jsonl" || { echo "FAIL statex: no state-512 rows"; fail=1; }
want statex gla_prefill 2
want statex gla_decode 4
grep -q '"dk":1024,"dv":2048,' "$T/statex.jsonl" || { echo "FAIL statex: no merged GLA rows"; fail=1; }
want dla dla_decode 6      # two bases x (1 state, 30 merging, 30 opening)
want dla gdn_decode 1
want dla ssd_decode 1
want dla dla_prefill 4     # two bases x two lengths
want dla dla_decode_after_prefill 4
grep '"bench":"dla_decode"' "$T/dla.jsonl" | grep '"m":30,' | grep -qv '"m_after":30.0' &&
  { echo "FAIL dla: a full cache did not stay full"; fail=1; }
# --only nsa: the NSA rows of the sparse group alone (2 contexts x windows 512 and 0, decode and
# prefill), no other mixer's
if "$BIN/hyla-bench" kernels --device cpu --quick --only nsa >"$T/nsa.jsonl" 2>"$T/nsa.err"; then
  want nsa sparse_decode 4
  want nsa sparse_prefill 4
  grep -v '"mixer":"nsa"' "$T/nsa.jsonl" | grep -q . && { echo "FAIL nsa: rows of another mixer"; fail=1; }
else
  echo "FAIL nsa: hyla-bench kernels exited non-zero"; cat "$T/nsa.err"; fail=1
fi
# --only seq: one GLA and one GDN row per --ctx length (the rows compare-fla.sh sets beside FLA's)
if "$BIN/hyla-bench" kernels --device cpu --quick --only seq >"$T/seq.jsonl" 2>"$T/seq.err"; then
  want seq seq_gla 1
  want seq seq_gdn 1
  grep -q '"tokens":2048,"H":18,"dk":128,"dv":128,' "$T/seq.jsonl" || { echo "FAIL seq: not 2048 tokens of 18 heads of 128"; fail=1; }
else
  echo "FAIL seq: hyla-bench kernels exited non-zero"; cat "$T/seq.err"; fail=1
fi
# --help tells of the new modes; an unknown mode is refused
"$BIN/hyla-bench" kernels --help >"$T/help"
for m in mamba2 statex dla nsa seq; do grep -q "$m" "$T/help" || { echo "FAIL: --help does not name $m"; fail=1; }; done
"$BIN/hyla-bench" kernels --device cpu --only bogus >/dev/null 2>"$T/err" && { echo "FAIL: --only bogus accepted"; fail=1; }
grep -q "unknown --only" "$T/err" || { echo "FAIL: no message for an unknown --only"; fail=1; }
# a bad option: exit 2, the option named and the usage on stderr, nothing on stdout (which
# carries the JSON lines); --help: the usage on stdout, exit 0
for sub in kernels e2e; do
  rc=0; "$BIN/hyla-bench" $sub --bogus >"$T/out" 2>"$T/err" || rc=$?
  [ $rc = 2 ] || { echo "FAIL $sub --bogus: exit $rc, want 2"; fail=1; }
  grep -q -- "unknown option or missing value: --bogus" "$T/err" && grep -q "usage: hyla-bench $sub" "$T/err" ||
    { echo "FAIL $sub --bogus: stderr lacks the option or the usage"; fail=1; }
  [ -s "$T/out" ] && { echo "FAIL $sub --bogus: wrote to stdout"; fail=1; }
  "$BIN/hyla-bench" $sub --help 2>/dev/null | grep -q "usage: hyla-bench $sub" || { echo "FAIL $sub --help"; fail=1; }
done
# a list or a number that is not one (parsed as 0 before: a benchmark of nothing): exit 2 naming it
for a in "e2e --prefill abc" "e2e --prefill 64,,128" "e2e --batch 0" "e2e --steps x" "e2e --tp 0" "e2e --prefill-repeat 17" "e2e --turn 0" "kernels --ctx 1,-2" \
         "restore --repeat 0" "restore --chunk-bytes 10"; do
  set -- $a
  m=(--model "$T"); [ "$1" = kernels ] && m=()
  rc=0; "$BIN/hyla-bench" "$1" "${m[@]}" "$2" "$3" >/dev/null 2>"$T/err" || rc=$?
  [ $rc = 2 ] && grep -q -- "$2: '$3' is not" "$T/err" || { echo "FAIL $a: exit $rc, '$(cat "$T/err")'"; fail=1; }
done
# e2e reports the runtime's scratch: a prompt fed without logits reserves none, a decode step its batch's rows
if [ -x "$BIN/hyla-mkmodel" ] && "$BIN/hyla-mkmodel" --arch gdn --layers 2 --hidden 128 --heads 2 --head-dim 64 \
     --intermediate 256 --vocab 1000 --out "$T/m" >/dev/null 2>&1; then
  "$BIN/hyla-bench" e2e --model "$T/m" --prefill 256 --batch 2 --ctx 16 --steps 2 >"$T/e2e.jsonl" 2>"$T/e2e.err" ||
    { echo "FAIL e2e: hyla-bench e2e exited non-zero"; cat "$T/e2e.err"; fail=1; }
  grep '"e2e_prefill"' "$T/e2e.jsonl" | grep -q '"scratch_mb":[0-9.]*,"logits_scratch_mb":0.00' ||
    { echo "FAIL e2e: the prefill line does not show scratch without logits"; grep e2e_prefill "$T/e2e.jsonl"; fail=1; }
  # the model's prefill chunk: 64 here, 256 for an SSE model (its prefill_window)
  grep '"e2e_prefill"' "$T/e2e.jsonl" | grep -q '"prefill_chunk":64' ||
    { echo "FAIL e2e: the prefill line does not name the prefill chunk 64"; grep e2e_prefill "$T/e2e.jsonl"; fail=1; }
  if "$BIN/hyla-mkmodel" --arch sse --layers 2 --hidden 128 --heads 2 --head-dim 64 --out "$T/sse" >/dev/null 2>&1; then
    "$BIN/hyla-bench" e2e --model "$T/sse" --prefill 300 --batch 1 --ctx 4 --steps 1 2>/dev/null |
      grep '"e2e_prefill"' | grep -q '"prefill_chunk":256' ||
      { echo "FAIL e2e: an SSE model's prefill line does not name the prefill chunk 256"; fail=1; }
  fi
  grep '"e2e_decode"' "$T/e2e.jsonl" | grep -q '"logits_scratch_mb":0.01' ||
    { echo "FAIL e2e: the decode line does not show 2 rows of logits (8 KB)"; grep e2e_decode "$T/e2e.jsonl"; fail=1; }
  # the copy rate measured first, and each decode line's share of it (of_copy)
  grep -q '"bench":"copy_bandwidth"' "$T/e2e.jsonl" ||
    { echo "FAIL e2e: no copy_bandwidth line"; cat "$T/e2e.jsonl"; fail=1; }
  grep '"e2e_decode"' "$T/e2e.jsonl" | grep -q '"copy_gbps":[0-9.]*,"of_copy":[0-9.]*' ||
    { echo "FAIL e2e: the decode line does not compare with the copy rate"; grep e2e_decode "$T/e2e.jsonl"; fail=1; }
  # --prefill-repeat: the median of N prefills, with the fastest and slowest beside it; --turn N:
  # the next N tokens fed to the prefilled session, one e2e_turn line per prompt at its context
  "$BIN/hyla-bench" e2e --model "$T/m" --prefill 64,128 --prefill-repeat 3 --turn 40 --batch 1 --ctx 4 --steps 1 \
    >"$T/rep.jsonl" 2>"$T/rep.err" || { echo "FAIL e2e --prefill-repeat: exit non-zero"; cat "$T/rep.err"; fail=1; }
  python3 - "$T/rep.jsonl" <<'PY' || fail=1
import json, sys
d = list(map(json.loads, open(sys.argv[1])))
p = [x for x in d if x.get("bench") == "e2e_prefill"]
t = [x for x in d if x.get("bench") == "e2e_turn"]
ok = len(p) == 2 and all(x.get("repeat") == 3 and x["s_min"] <= x["s"] + 5e-4 and x["s"] <= x["s_max"] + 5e-4 for x in p)
okt = [(x["ctx"], x["tokens"]) for x in t] == [(64, 40), (128, 40)] and all(x["s_min"] <= x["s"] <= x["s_max"] for x in t)
print("" if ok else "FAIL e2e --prefill-repeat 3: %s" % p, end="" if ok else "\n")
print("" if okt else "FAIL e2e --turn 40: %s" % t, end="" if okt else "\n")
sys.exit(0 if ok and okt else 1)
PY
else
  echo "FAIL e2e: hyla-mkmodel did not make the tiny model"; fail=1
fi
[ $fail = 0 ] && echo "test_bench_kernels: ok"
exit $fail
