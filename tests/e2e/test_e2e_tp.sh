#!/usr/bin/env bash
# Tensor parallelism through a real cluster (hyla-coordinator + two hyla-worker processes on
# loopback, CPU backend, the hyla CLI): w1 splits every layer of a GDN + attention hybrid over
# two CPU backends (--tp 2), w2 runs it whole. Greedy, so the tokens may be compared across
# splits (the sums over ranks round differently from one accumulation; the greedy choice of this
# model does not flip).
#   (s) hyla status shows w1's split ("cpu tp=2"); w1 decodes one step ahead (HYLA_DECODE_LANES=1,
#       checked in its log at the end);
#   (a) 32 tokens on the split worker + Pause + Resume on the whole one + 32 == 64 uninterrupted
#       on the whole worker (TP = 2 -> TP = 1);
#   (m) + Migrate back to the split worker + 32 more == the uninterrupted run (TP = 1 -> TP = 2);
#   (t) sampled (T = 0.9) on the split worker: 32 + Pause + Resume there + 32 == 64 uninterrupted
#       there (bit-exact within one split);
#   (p) a pipeline of two split stages (p0: layers 0:2 --tp 2, p1: 2:4 --tp 2): 32 there + Pause +
#       Resume on the whole worker + 32 == the whole worker's 64, and back: --tp combines with
#       --layers.
# With E2E_TP_DEVICE=cuda:0 (test_e2e_tp_gpu, label multigpu; skipped with a message where fewer
# than two GPUs are usable) every worker runs on the GPUs: the split ones on cuda:0 + cuda:1,
# whose sums are the one-shot kernels inside the decode graphs and the peer sums of the prefill
# halves, through the worker's scheduler, auto-snapshots, pause, resume and migration. On the
# GPU a split's logits are the whole model's only within rounding (bf16 inputs, other slice
# plans: docs/MULTIGPU.md "Numerics"), and this random model's greedy choice flips after a few
# tokens, so there the reference is the split worker's own uninterrupted run: (a) and (m) check
# that the moves across the split continue (32 ids each) and that the split part matches it,
# (p) that the split stages give the split worker's tokens through pause, resume on the split
# worker and migration back, bit for bit.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
DEV=${E2E_TP_DEVICE:-}
e2e_init "tp${DEV:+_gpu}"

e2e_make_model "$E2E_DIR/model" gdn-h 4
if [ -n "$DEV" ]; then
  for dev in cuda:0 cuda:1; do
    if ! out=$("$E2E_BIN/hyla-run" --model "$E2E_DIR/model" --device $dev --prompt-ids "1 2 3" --max-tokens 1 --quiet --ids 2>&1); then
      e2e_skip "this test needs two usable GPUs; $dev is not ($out)"
    fi
  done
fi
W=(${DEV:+--device "$DEV"})
e2e_start_coordinator coordinator --heartbeat-ms 500 --dead-after-ms 5000 || e2e_done
# w1 decodes one step ahead (its next step queued on both ranks before the last one's tokens are
# sent): a GPU group's default, asked for here so the CPU run takes that path too
HYLA_DECODE_LANES=1 e2e_start_worker w1 "$E2E_DIR/model" "${W[@]}" --tp 2 --snapshot-every 64 || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" "${W[@]}" --snapshot-every 64 || e2e_done
H() { e2e_hyla --tenant e2e -q "$@"; }
owner() { H show "$1" | awk '$1 == "workers" { print $2 }'; }

e2e_hyla status | grep -E "^w1 .*${DEV:-cpu} tp=2" >/dev/null || e2e_fail "(s) hyla status does not show w1's split: $(e2e_hyla status)"

doc="$E2E_DIR/doc.txt"
for i in $(seq 1 5); do echo "Line $i of a document read by a model split over two ranks."; done >"$doc"
# new_session WORKER [create args]: a session placed on WORKER, fed the document
new_session() {
  local w=$1 s
  shift
  s=$(H create "$@") || return 1
  if [ "$(owner "$s")" != "$w" ]; then H migrate "$s" --to "$w" >/dev/null || return 1; fi
  [ "$(owner "$s")" = "$w" ] || return 1
  H append "$s" "$doc" || return 1
  echo "$s"
}

# the reference: the whole worker's uninterrupted run (on the GPU the split worker's, above)
REFW=w2
[ -n "$DEV" ] && REFW=w1
R=$(new_session $REFW) || e2e_fail "reference session on $REFW"
read -r -a ref <<<"$(H generate "$R" -n 96 --ids --ignore-eos)"
[ "${#ref[@]}" = 96 ] || e2e_fail "reference: expected 96 ids, got ${#ref[@]}"
want() { echo "${ref[@]:$1:$2}"; }
count() { set -- $1; echo $#; }

# (a) TP = 2 -> TP = 1
A=$(new_session w1) || e2e_fail "(a) session on w1"
a1=$(H generate "$A" -n 32 --ids --ignore-eos)
H pause "$A" --evict >/dev/null || e2e_fail "(a) pause"
H resume "$A" --on w2 >/dev/null || e2e_fail "(a) resume on w2"
[ "$(owner "$A")" = w2 ] || e2e_fail "(a) resumed on $(owner "$A"), asked for w2"
a2=$(H generate "$A" -n 32 --ids --ignore-eos)
if [ -z "$DEV" ]; then
  e2e_expect_eq "$a1 $a2" "$(want 0 64)" "(a) 32 split + pause + resume whole + 32 == 64 whole"
else
  e2e_expect_eq "$a1" "$(want 0 32)" "(a) 32 on the split worker == its uninterrupted run"
  e2e_expect_eq "$(count "$a2")" 32 "(a) resumed on the whole worker: 32 more ids"
fi

# (m) TP = 1 -> TP = 2
H migrate "$A" --to w1 >/dev/null || e2e_fail "(m) migrate to w1"
[ "$(owner "$A")" = w1 ] || e2e_fail "(m) migrated to $(owner "$A"), asked for w1"
m1=$(H generate "$A" -n 32 --ids --ignore-eos)
if [ -z "$DEV" ]; then
  e2e_expect_eq "$m1" "$(want 64 32)" "(m) migrate to the split worker + 32"
else
  e2e_expect_eq "$(count "$m1")" 32 "(m) migrated back to the split worker: 32 more ids"
fi

# (t) sampled, within the split
S=$(new_session w1 --temperature 0.9 --seed 4) || e2e_fail "(t) reference session"
full=$(H generate "$S" -n 64 --ids --ignore-eos)
P=$(new_session w1 --temperature 0.9 --seed 4) || e2e_fail "(t) session"
p1=$(H generate "$P" -n 32 --ids --ignore-eos)
H pause "$P" --evict >/dev/null || e2e_fail "(t) pause"
H resume "$P" --on w1 >/dev/null || e2e_fail "(t) resume on w1"
p2=$(H generate "$P" -n 32 --ids --ignore-eos)
e2e_expect_eq "$p1 $p2" "$full" "(t) sampled on the split worker: 32 + pause + resume + 32 == 64"

# (p) split pipeline stages
e2e_start_worker p0 "$E2E_DIR/model" "${W[@]}" --layers 0:2 --tp 2 || e2e_done
e2e_start_worker p1 "$E2E_DIR/model" "${W[@]}" --layers 2:4 --tp 2 || e2e_done
group_ok() { e2e_hyla status | grep -E 'p0[ ,]+p1' | grep -qw yes; }
e2e_wait_for "$E2E_TIMEOUT" group_ok || e2e_fail "(p) p0 + p1 were not assembled into a group"
Q=$(H create --on p0) || e2e_fail "(p) session on the split pipeline"
H show "$Q" | grep -qE "p0[ ,]+p1" || e2e_fail "(p) session not on p0 + p1: $(H show "$Q" | grep workers)"
H append "$Q" "$doc" || e2e_fail "(p) append"
q1=$(H generate "$Q" -n 32 --ids --ignore-eos)
H pause "$Q" --evict >/dev/null || e2e_fail "(p) pause"
H resume "$Q" --on $REFW >/dev/null || e2e_fail "(p) resume on $REFW"
q2=$(H generate "$Q" -n 32 --ids --ignore-eos)
e2e_expect_eq "$q1 $q2" "$(want 0 64)" "(p) 32 on split stages + pause + resume on $REFW + 32 == 64 there"
H migrate "$Q" --to p0 >/dev/null || e2e_fail "(p) migrate to the split pipeline"
e2e_expect_eq "$(H generate "$Q" -n 32 --ids --ignore-eos)" "$(want 64 32)" "(p) migrate back to the split stages + 32"
grep -q "decode one step ahead" "$E2E_DIR/w1.log" || e2e_fail "(s) w1 did not decode one step ahead"
e2e_done
