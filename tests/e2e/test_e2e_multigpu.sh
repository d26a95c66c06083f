#!/usr/bin/env bash
# Pipeline stages on two GPUs of one host exchanging activations over NCCL (label multigpu;
# skipped with a message where fewer than two GPUs are usable): a whole-model worker on cuda:0
# is the one-GPU reference; a pipeline p0 (layers 0:2, cuda:0) + p1 (layers 2:4, cuda:1) must
#   - open an NCCL link (both workers say so in their logs),
#   - give the reference's greedy tokens and its sampled tokens bit for bit,
#   - keep a session's identity through Pause + Migrate between the pipeline and the one-GPU
#     worker in both directions (64 == 32 + pause + migrate + 32),
# and the same pipeline with NCCL turned off (HYLA_STAGE_NCCL=0: rows over gRPC) gives the same
# tokens again. Micro-batches (--micro-batches 2): 16 sessions generating at once on the pipeline
# (two decode lanes of 8 sessions, each lane's step posted while the other's is on the next
# stage, its logits received beside p0's compute stream) give the one-GPU worker's tokens
# session by session, and so does a three-stage pipeline q0 (0:1, cuda:0) -> q1 (1:3, cuda:1) ->
# q2 (3:4, cuda:0) whose middle stage has a link on each side, with lanes off there
# (HYLA_DECODE_LANES=0: steps of 16 rows in two groups of 8, each group's rows over the link, the
# logits of the step once after the last).
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init multigpu
e2e_make_model "$E2E_DIR/model"
for dev in cuda:0 cuda:1; do
  if ! out=$("$E2E_BIN/hyla-run" --model "$E2E_DIR/model" --device $dev --prompt-ids "1 2 3" --max-tokens 1 --quiet --ids 2>&1); then
    e2e_skip "this test needs two usable GPUs; $dev is not ($out)"
  fi
done
e2e_start_coordinator coordinator --heartbeat-ms 500 --dead-after-ms 2000 || e2e_done
e2e_start_worker g1 "$E2E_DIR/model" --device cuda:0 || e2e_done
e2e_start_worker p0 "$E2E_DIR/model" --device cuda:0 --layers 0:2 --micro-batches 2 || e2e_done
e2e_start_worker p1 "$E2E_DIR/model" --device cuda:1 --layers 2:4 || e2e_done
pipeline_ready() { # a complete group with stage 0 $1 and stage 1 p1
  e2e_wait_for "$E2E_TIMEOUT" sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | grep -w '$1' | grep -w p1 | grep -qw yes"
}
pipeline_ready p0 || e2e_fail "the coordinator did not assemble p0 + p1 into a pipeline group: $(e2e_hyla status)"
H() { e2e_hyla -q "$@"; }
doc="$E2E_DIR/doc.txt"
for i in $(seq 1 30); do echo "Line $i: two GPUs of one host pass hidden states between pipeline stages."; done >"$doc"
session() { # session ON TEMPERATURE: the document appended
  local s
  s=$(H create --temperature "$2" --seed 5 --on "$1") && H append "$s" "$doc" && echo "$s"
}

G=$(session g1 0) || e2e_fail "greedy reference session"
greedy=$(H generate "$G" -n 48 --ids --ignore-eos)
R=$(session g1 0.9) || e2e_fail "sampled reference session"
sampled=$(H generate "$R" -n 64 --ids --ignore-eos)
want() { local a=($sampled); echo "${a[@]:$1:$2}"; }

PG=$(session p0 0) || e2e_fail "greedy session on the pipeline"
H show "$PG" | grep -qE "p0[ ,]p1" || e2e_fail "session not on the pipeline: $(H show "$PG" | grep workers)"
e2e_expect_eq "$(H generate "$PG" -n 48 --ids --ignore-eos)" "$greedy" "PP=2 over NCCL == one GPU (greedy)"
grep -q "NCCL link to the next stage" "$E2E_DIR/p0.log" || e2e_fail "p0 opened no NCCL link: $(grep -i nccl "$E2E_DIR/p0.log")"
grep -q "NCCL link from the previous stage" "$E2E_DIR/p1.log" || e2e_fail "p1 joined no NCCL link: $(grep -i nccl "$E2E_DIR/p1.log")"

P=$(session p0 0.9) || e2e_fail "sampled session on the pipeline"
a=$(H generate "$P" -n 32 --ids --ignore-eos)
e2e_expect_eq "$a" "$(want 0 32)" "PP=2 over NCCL == one GPU (sampled)"
H pause "$P" >/dev/null || e2e_fail "pause of the pipelined session"
H migrate "$P" --to g1 >/dev/null || e2e_fail "migrate from the pipeline to the one-GPU worker"
e2e_expect_eq "$(H generate "$P" -n 32 --ids --ignore-eos)" "$(want 32 32)" "pipeline 32 + pause + migrate to one GPU + 32"

Q=$(session g1 0.9) || e2e_fail "sampled session on the one-GPU worker"
q1=$(H generate "$Q" -n 32 --ids --ignore-eos)
H pause "$Q" >/dev/null || e2e_fail "pause on the one-GPU worker"
H migrate "$Q" --to p0 >/dev/null || e2e_fail "migrate from the one-GPU worker to the pipeline"
H show "$Q" | grep -qE "p0[ ,]p1" || e2e_fail "the migrated session is not on the pipeline"
e2e_expect_eq "$q1 $(H generate "$Q" -n 32 --ids --ignore-eos)" "$sampled" "one GPU 32 + pause + migrate to the pipeline + 32"
grep -iE "NCCL.*(fail|error|timed out)" "$E2E_DIR/p0.log" "$E2E_DIR/p1.log" && e2e_fail "NCCL errors in the stage logs"

batch() { # batch ON: 16 sessions (even: greedy, odd: sampled) generate 32 tokens at once; one line each
  local on=$1 i ids=() pids=()
  for i in $(seq 0 15); do
    ids[$i]=$(H create --temperature "$([ $((i % 2)) = 1 ] && echo 0.9 || echo 0)" --seed $((20 + i)) --on "$on") || return 1
    H append "${ids[$i]}" "$doc" || return 1
  done
  for i in $(seq 0 15); do
    H generate "${ids[$i]}" -n 32 --ids --ignore-eos >"$E2E_DIR/batch-$on-$i.txt" &
    pids[$i]=$!
  done
  for i in $(seq 0 15); do wait "${pids[$i]}" || return 1; done
  for i in $(seq 0 15); do echo "$(cat "$E2E_DIR/batch-$on-$i.txt")"; done
}
ref_batch=$(batch g1) || e2e_fail "16 sessions at once on the one-GPU worker"
e2e_expect_eq "$(batch p0)" "$ref_batch" "PP=2 over NCCL, 16 sessions at once in 2 decode lanes == one GPU"
grep -q "decode in 2 lanes" "$E2E_DIR/p0.log" || e2e_fail "p0 did not decode in 2 lanes"
grep -iE "NCCL.*(fail|error|timed out)" "$E2E_DIR/p0.log" "$E2E_DIR/p1.log" && e2e_fail "NCCL errors after the decode lanes"

# the same split with the rows over gRPC
e2e_kill p0 KILL
# until the coordinator has declared p0 dead, it may still place p1's group's stage 0 there
p0_dead() { e2e_hyla status | grep -qE '^p0 +dead'; }
e2e_wait_for "$E2E_TIMEOUT" p0_dead || e2e_fail "the coordinator did not declare the killed p0 dead"
export HYLA_STAGE_NCCL=0
e2e_start_worker p0g "$E2E_DIR/model" --device cuda:0 --layers 0:2 || e2e_done
unset HYLA_STAGE_NCCL
# (the coordinator lists p1 under the dead p0's group until a session is placed on p0g, so
# there is no complete group to wait for: the placement itself pairs them)
PR=$(session p0g 0.9) || e2e_fail "session on the gRPC pipeline"
H show "$PR" | grep -qE "p0g[ ,]+p1" || e2e_fail "session not on p0g + p1: $(H show "$PR" | grep workers)"
e2e_expect_eq "$(H generate "$PR" -n 64 --ids --ignore-eos)" "$sampled" "PP=2 over gRPC == over NCCL == one GPU"
grep -q "NCCL link to the next stage" "$E2E_DIR/p0g.log" && e2e_fail "p0g (HYLA_STAGE_NCCL=0) opened an NCCL link"

# three stages, the middle one between two links, in micro-batches
e2e_start_worker q2 "$E2E_DIR/model" --device cuda:0 --layers 3:4 || e2e_done
e2e_start_worker q1 "$E2E_DIR/model" --device cuda:1 --layers 1:3 --micro-batches 2 || e2e_done
export HYLA_DECODE_LANES=0
e2e_start_worker q0 "$E2E_DIR/model" --device cuda:0 --layers 0:1 --micro-batches 2 || e2e_done
unset HYLA_DECODE_LANES
e2e_wait_for "$E2E_TIMEOUT" sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | grep -E 'q0[ ,]+q1[ ,]+q2' | grep -qw yes" ||
  e2e_fail "the coordinator did not assemble q0 + q1 + q2 into a pipeline group: $(e2e_hyla status)"
e2e_expect_eq "$(batch q0)" "$ref_batch" "PP=3 over NCCL, 16 sessions at once in 2 micro-batches == one GPU"
grep -q "NCCL link to the next stage" "$E2E_DIR/q1.log" || e2e_fail "q1 opened no NCCL link to q2"
grep -q "NCCL link from the previous stage" "$E2E_DIR/q1.log" || e2e_fail "q1 joined no NCCL link from q0"
grep -q "micro-batches (group 0 of 2)" "$E2E_DIR/q2.log" || e2e_fail "q2 saw no decode step in 2 micro-batches"
grep -iE "NCCL.*(fail|error|timed out)" "$E2E_DIR/q0.log" "$E2E_DIR/q1.log" "$E2E_DIR/q2.log" &&
  e2e_fail "NCCL errors in the three stages' logs"
e2e_done
