#!/usr/bin/env bash
# Decode beside prefill through the serving path: one whole-model worker (a coordinator, the CLI),
# NS sessions (512-byte prompts, greedy) generating NT tokens each at once while ND documents of
# DB bytes are appended one after another, each to its first token. Prints one JSON line:
# decode_s / decode_tok_s (all NS x NT tokens, as the clients see them) and appends_s (the ND
# documents, appended while the sessions decode). A benchmark, not a test (BENCHMARKS.md).
#   HYLA_SOURCE_DIR=. HYLA_BIN_DIR=build/bin deploy/bench-mixed.sh MODEL_DIR [DEVICE]
# Environment: NS (default 128), NT (256), ND (4), DB (16384); the worker's own (HYLA_DECODE_LANES,
# HYLA_LOG) pass through.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
MODEL=${1:?usage: bench-mixed.sh MODEL_DIR [DEVICE]}
DEV=${2:-cuda:0}
NS=${NS:-128}
NT=${NT:-256}
ND=${ND:-4}
DB=${DB:-16384}
e2e_init bench-mixed
e2e_start_coordinator coordinator --heartbeat-ms 500 --dead-after-ms 2000 || e2e_done
e2e_start_worker g1 "$MODEL" --device "$DEV" --max-batch $((NS > 64 ? NS : 64)) --max-message-bytes 268435456 || e2e_done
H() { e2e_hyla -q "$@"; }
head -c 512 /dev/zero | tr '\0' 'a' >"$E2E_DIR/p.txt"
head -c "$DB" /dev/urandom | base64 -w 100 | head -c "$DB" >"$E2E_DIR/doc.txt"
ids=()
for _ in $(seq 1 "$NS"); do
  s=$(H create --temperature 0) && H append "$s" "$E2E_DIR/p.txt" >/dev/null || e2e_fail "a session"
  ids+=("$s")
done
pids=()
for s in "${ids[@]}"; do H generate "$s" -n 8 --ignore-eos >/dev/null & pids+=($!); done # warm-up
wait "${pids[@]}"
now() { date +%s.%N; }
t0=$(now)
pids=()
for s in "${ids[@]}"; do H generate "$s" -n "$NT" --ignore-eos >/dev/null & pids+=($!); done
sleep 0.3
ta=$(now)
for _ in $(seq 1 "$ND"); do
  s=$(H create --temperature 0) && H append "$s" "$E2E_DIR/doc.txt" >/dev/null && H generate "$s" -n 1 --ignore-eos >/dev/null ||
    e2e_fail "a document"
done
tb=$(now)
for p in "${pids[@]}"; do wait "$p" || e2e_fail "a generate"; done
t1=$(now)
awk -v a="$t0" -v b="$t1" -v c="$ta" -v d="$tb" -v n="$NS" -v k="$NT" -v nd="$ND" -v db="$DB" 'BEGIN {
  printf "{\"bench\":\"mixed\",\"sessions\":%d,\"tokens\":%d,\"decode_s\":%.3f,\"decode_tok_s\":%.0f,\"docs\":%d,\"doc_tokens\":%d,\"appends_s\":%.3f}\n",
    n, k, b - a, n * k / (b - a), nd, db, d - c }'
e2e_done
