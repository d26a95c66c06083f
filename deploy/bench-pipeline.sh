#!/usr/bin/env bash
# Pipeline stages on two GPUs against one GPU, through the whole serving path (coordinator,
# workers, CLI): one session's prefill (Append of a document) and decode (Generate N tokens,
# batch 1), timed by the client, for a whole-model worker on cuda:0, a two-stage pipeline over
# NCCL (cuda:0 + cuda:1) and the same pipeline over gRPC (HYLA_STAGE_NCCL=0). Prints one JSON
# line per configuration. Needs two GPUs; a benchmark, not a test (BENCHMARKS.md records runs).
#   HYLA_SOURCE_DIR=. HYLA_BIN_DIR=build/bin deploy/bench-pipeline.sh [DOC_BYTES] [DECODE_TOKENS]
# prefill_s: Append of the document and its first generated token (an Append answers once its
# pieces are queued on the device); decode_s: the DECODE_TOKENS after it.
# Batched decode: BENCH_SESSIONS=B (default 1: off) also times B sessions (a BENCH_BATCH_DOC_BYTES
# prompt each, default 512) generating DECODE_TOKENS each at once, after a warm-up round; the
# line then adds sessions, batch_decode_s and batch_decode_tok_s (B x DECODE_TOKENS / wall time,
# all sessions summed). The first stages run --micro-batches BENCH_MICRO_BATCHES (default 2; 1:
# off), added as micro_batches. Workers get --max-batch B (at least 64) and a message limit
# that lets a step of B sessions' logits travel over gRPC. BENCH_GRPC=0 skips the gRPC
# configuration; BENCH_MKARGS adds hyla-mkmodel options (e.g. "--intermediate 5632");
# BENCH_SNAPSHOT_EVERY=K gives every worker --snapshot-every K (default: the worker's default,
# 1024; 0 turns auto-snapshots off, to time the prefill without them). BENCH_MODEL=DIR serves a
# model made beforehand (its layer count in BENCH_LAYERS) instead of making one: a model of the
# 1.3B shapes takes minutes to make, and the same files then serve the in-process benchmarks.
# BENCH_PP_PIECE=N gives the pipeline's stages --prefill-piece N (the whole-model worker keeps
# its default), to compare piece sizes of a pipeline against one GPU at its own. BENCH_PP=0 times
# the whole-model worker alone (one GPU is enough), e.g. to compare worker settings between runs;
# BENCH_G1_ARGS adds options to that worker alone (e.g. "--tp 2").
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
DOC_BYTES=${1:-16384}
N=${2:-256}
e2e_init bench-pipeline
L=${BENCH_LAYERS:-8}
MODEL=${BENCH_MODEL:-$E2E_DIR/model}
if [ -z "${BENCH_MODEL:-}" ]; then
  # shellcheck disable=SC2086 # BENCH_MKARGS is a list of options
  e2e_make_model "$MODEL" "${BENCH_ARCH:-gla}" "$L" --hidden "${BENCH_HIDDEN:-2048}" --heads 16 --vocab 32000 --dtype bf16 ${BENCH_MKARGS:-}
fi
B=${BENCH_SESSIONS:-1}
MB=${BENCH_MICRO_BATCHES:-2}
WF=(--max-batch $((B > 64 ? B : 64)) --max-message-bytes 268435456)
[ -n "${BENCH_SNAPSHOT_EVERY:-}" ] && WF+=(--snapshot-every "$BENCH_SNAPSHOT_EVERY")
PF=()
[ -n "${BENCH_PP_PIECE:-}" ] && PF=(--prefill-piece "$BENCH_PP_PIECE")
e2e_start_coordinator coordinator --heartbeat-ms 500 --dead-after-ms 2000 || e2e_done
# shellcheck disable=SC2086 # BENCH_G1_ARGS is a list of options
e2e_start_worker g1 "$MODEL" --device cuda:0 "${WF[@]}" ${BENCH_G1_ARGS:-} || e2e_done
PP=${BENCH_PP:-1}
[ "$PP" = 0 ] || e2e_start_worker p0 "$MODEL" --device cuda:0 --layers 0:$((L / 2)) --micro-batches "$MB" "${WF[@]}" "${PF[@]}" || e2e_done
[ "$PP" = 0 ] || e2e_start_worker p1 "$MODEL" --device cuda:1 --layers $((L / 2)):$L "${WF[@]}" "${PF[@]}" || e2e_done
H() { e2e_hyla -q "$@"; }
doc="$E2E_DIR/doc.txt"
head -c "$DOC_BYTES" /dev/urandom | base64 -w 100 | head -c "$DOC_BYTES" >"$doc"
bdoc="$E2E_DIR/batch-doc.txt"
head -c "${BENCH_BATCH_DOC_BYTES:-512}" "$doc" >"$bdoc"
now() { date +%s.%N; }
batch_round() { # batch_round NAME TOKENS ID...: the sessions generate TOKENS each at once
  local name=$1 n=$2 i=0 s pids=()
  shift 2
  for s in "$@"; do
    H generate "$s" -n "$n" --ids --ignore-eos >"$E2E_DIR/$name.b$i.ids" &
    pids+=($!)
    i=$((i + 1))
  done
  for s in "${pids[@]}"; do wait "$s" || return 1; done
}
batch_bench() { # batch_bench NAME ON: prints ',"sessions":B,...' (nothing when B is 1)
  local i s ids=() t0 t1
  [ "$B" -gt 1 ] || return 0
  for i in $(seq 1 "$B"); do
    s=$(H create --temperature 0 --on "$2") || e2e_fail "$1: create (batch)"
    H append "$s" "$bdoc" >/dev/null || e2e_fail "$1: append (batch)"
    ids+=("$s")
  done
  batch_round "$1-warm" 8 "${ids[@]}" || e2e_fail "$1: batch warm-up"
  t0=$(now)
  batch_round "$1" "$N" "${ids[@]}" || e2e_fail "$1: batch generate"
  t1=$(now)
  for i in $(seq 0 $((B - 1))); do cat "$E2E_DIR/$1.b$i.ids"; done >"$E2E_DIR/$1.batch.ids"
  awk -v b="$B" -v k="$N" -v a="$t0" -v c="$t1" 'BEGIN {
    printf ",\"sessions\":%d,\"batch_decode_s\":%.3f,\"batch_decode_tok_s\":%.1f", b, c - a, b * k / (c - a) }'
}
bench() { # bench NAME ON
  local s t0 t1 t2
  s=$(H create --temperature 0 --on "$2") || e2e_fail "$1: create"
  H append "$s" "$doc" >/dev/null && H generate "$s" -n 8 --ignore-eos >/dev/null # warm-up (graphs, links)
  s=$(H create --temperature 0 --on "$2") || e2e_fail "$1: create"
  t0=$(now)
  # Append answers once the document is queued on the device, not computed: the prefill is timed
  # to its first generated token (which waits for the prompt's last logits)
  H append "$s" "$doc" >/dev/null || e2e_fail "$1: append"
  H generate "$s" -n 1 --ids --ignore-eos >"$E2E_DIR/$1.first.ids" || e2e_fail "$1: first token"
  t1=$(now)
  H generate "$s" -n "$N" --ids --ignore-eos >"$E2E_DIR/$1.ids" || e2e_fail "$1: generate"
  t2=$(now)
  local extra
  extra=$(batch_bench "$1" "$2") || e2e_fail "$1: batched decode"
  awk -v n="$1" -v d="$DOC_BYTES" -v k="$N" -v a="$t0" -v b="$t1" -v c="$t2" -v m="$MB" -v x="$extra" 'BEGIN {
    printf "{\"config\":\"%s\",\"prefill_tokens\":%d,\"prefill_s\":%.3f,\"prefill_tok_s\":%.0f,\"decode_tokens\":%d,\"decode_s\":%.3f,\"decode_tok_s\":%.1f,\"micro_batches\":%d%s}\n",
      n, d, b - a, d / (b - a), k, c - b, k / (c - b), m, x }'
}
if [ "$PP" = 0 ]; then
  bench one_gpu g1
  e2e_done
fi
e2e_wait_for "$E2E_TIMEOUT" sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | grep -E 'p0[ ,]+p1' | grep -qw yes" ||
  e2e_fail "p0 + p1 not assembled"
bench one_gpu g1
bench pp2_nccl p0
if [ "${BENCH_GRPC:-1}" = 0 ]; then
  cmp -s "$E2E_DIR/one_gpu.ids" "$E2E_DIR/pp2_nccl.ids" || e2e_fail "one GPU and PP = 2 over NCCL gave different greedy tokens"
  [ "$B" -le 1 ] || cmp -s "$E2E_DIR/one_gpu.batch.ids" "$E2E_DIR/pp2_nccl.batch.ids" ||
    e2e_fail "one GPU and PP = 2 over NCCL gave different greedy tokens in the batch"
  e2e_done
fi
e2e_kill p0 KILL
# until the coordinator has declared p0 dead, it may still place p1's group's stage 0 there
p0_dead() { e2e_hyla status | grep -qE '^p0 +dead'; }
e2e_wait_for "$E2E_TIMEOUT" p0_dead || e2e_fail "the coordinator did not declare the killed p0 dead"
export HYLA_STAGE_NCCL=0
e2e_start_worker q0 "$MODEL" --device cuda:0 --layers 0:$((L / 2)) --micro-batches "$MB" "${WF[@]}" "${PF[@]}" || e2e_done
unset HYLA_STAGE_NCCL
# p1 stays listed under the dead p0's group until a session is placed on q0 (the placement pairs them)
bench pp2_grpc q0
cmp -s "$E2E_DIR/one_gpu.ids" "$E2E_DIR/pp2_nccl.ids" && cmp -s "$E2E_DIR/one_gpu.ids" "$E2E_DIR/pp2_grpc.ids" ||
  e2e_fail "the three configurations gave different greedy tokens"
[ "$B" -le 1 ] || { cmp -s "$E2E_DIR/one_gpu.batch.ids" "$E2E_DIR/pp2_nccl.batch.ids" &&
  cmp -s "$E2E_DIR/one_gpu.batch.ids" "$E2E_DIR/pp2_grpc.batch.ids"; } ||
  e2e_fail "the three configurations gave different greedy tokens in the batch"
e2e_done
