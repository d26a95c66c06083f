#!/usr/bin/env bash
# Pipeline stages on two GPUs against one GPU, through the whole serving path (coordinator,
# workers, CLI): one session's prefill (Append of a document) and decode (Generate N tokens,
# batch 1), timed by the client, for a whole-model worker on cuda:0, a two-stage pipeline over
# NCCL (cuda:0 + cuda:1) and the same pipeline over gRPC (HYLA_STAGE_NCCL=0). Prints one JSON
# line per configuration. Needs two GPUs; a benchmark, not a test (BENCHMARKS.md records runs).
#   HYLA_SOURCE_DIR=. HYLA_BIN_DIR=build/bin deploy/bench-pipeline.sh [DOC_BYTES] [DECODE_TOKENS]
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
DOC_BYTES=${1:-16384}
N=${2:-256}
e2e_init bench-pipeline
L=${BENCH_LAYERS:-8}
e2e_make_model "$E2E_DIR/model" "${BENCH_ARCH:-gla}" "$L" --hidden "${BENCH_HIDDEN:-2048}" --heads 16 --vocab 32000 --dtype bf16
e2e_start_coordinator coordinator || e2e_done
e2e_start_worker g1 "$E2E_DIR/model" --device cuda:0 || e2e_done
e2e_start_worker p0 "$E2E_DIR/model" --device cuda:0 --layers 0:$((L / 2)) || e2e_done
e2e_start_worker p1 "$E2E_DIR/model" --device cuda:1 --layers $((L / 2)):$L || e2e_done
H() { e2e_hyla -q "$@"; }
doc="$E2E_DIR/doc.txt"
head -c "$DOC_BYTES" /dev/urandom | base64 -w 100 | head -c "$DOC_BYTES" >"$doc"
now() { date +%s.%N; }
bench() { # bench NAME ON
  local s t0 t1 t2
  s=$(H create --temperature 0 --on "$2") || e2e_fail "$1: create"
  H append "$s" "$doc" >/dev/null && H generate "$s" -n 8 --ignore-eos >/dev/null # warm-up (graphs, links)
  s=$(H create --temperature 0 --on "$2") || e2e_fail "$1: create"
  t0=$(now)
  H append "$s" "$doc" >/dev/null || e2e_fail "$1: append"
  t1=$(now)
  H generate "$s" -n "$N" --ids --ignore-eos >"$E2E_DIR/$1.ids" || e2e_fail "$1: generate"
  t2=$(now)
  awk -v n="$1" -v d="$DOC_BYTES" -v k="$N" -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN {
    printf "{\"config\":\"%s\",\"prefill_tokens\":%d,\"prefill_s\":%.3f,\"prefill_tok_s\":%.0f,\"decode_tokens\":%d,\"decode_s\":%.3f,\"decode_tok_s\":%.1f}\n",
      n, d, b - a, d / (b - a), k, c - b, k / (c - b) }'
}
e2e_wait_for "$E2E_TIMEOUT" sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | grep -E 'p0[ ,]+p1' | grep -qw yes" ||
  e2e_fail "p0 + p1 not assembled"
bench one_gpu g1
bench pp2_nccl p0
e2e_kill p0 KILL
export HYLA_STAGE_NCCL=0
e2e_start_worker q0 "$E2E_DIR/model" --device cuda:0 --layers 0:$((L / 2)) || e2e_done
unset HYLA_STAGE_NCCL
# p1 stays listed under the dead p0's group until a session is placed on q0 (the placement pairs them)
bench pp2_grpc q0
cmp -s "$E2E_DIR/one_gpu.ids" "$E2E_DIR/pp2_nccl.ids" && cmp -s "$E2E_DIR/one_gpu.ids" "$E2E_DIR/pp2_grpc.ids" ||
  e2e_fail "the three configurations gave different greedy tokens"
e2e_done
