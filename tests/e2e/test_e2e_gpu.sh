#!/usr/bin/env bash
# The cluster on GPU workers (label gpu; skipped with a message where no GPU is usable): two
# hyla-worker --device cuda:0 processes, the coordinator and the CLI; 64 tokens uninterrupted ==
# 32 + Pause + kill -9 of the owner + Resume on the other GPU worker + 32 (bit for bit on one
# backend), and a GPU snapshot continued by a CPU worker gives tokens (reported, since bf16
# rounding may legitimately diverge from the fp32 CPU reference); eight sampled sessions at once on
# a worker that decodes one step ahead == on one with it off, and so is a document appended
# meanwhile.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init gpu
e2e_make_model "$E2E_DIR/model"
if ! out=$("$E2E_BIN/hyla-run" --model "$E2E_DIR/model" --device cuda:0 --prompt-ids "1 2 3" --max-tokens 1 --quiet --ids 2>&1); then
  echo "SKIPPED: no usable GPU ($out)"
  exit 77
fi
e2e_start_coordinator coordinator --heartbeat-ms 500 --dead-after-ms 2000 || e2e_done
e2e_start_worker g1 "$E2E_DIR/model" --device cuda:0 || e2e_done
e2e_start_worker g2 "$E2E_DIR/model" --device cuda:0 || e2e_done
H() { e2e_hyla -q "$@"; }
owner() { H show "$1" | awk '$1 == "workers" { print $2 }'; }
doc="$E2E_DIR/doc.txt"
for i in $(seq 1 40); do echo "Line $i: a GPU worker keeps its sessions' states in a device pool."; done >"$doc"

R=$(H create --temperature 0.8 --seed 3) && H append "$R" "$doc" || e2e_fail "reference session"
full=$(H generate "$R" -n 64 --ids --ignore-eos)
S=$(H create --temperature 0.8 --seed 3) && H append "$S" "$doc" || e2e_fail "session"
a=$(H generate "$S" -n 32 --ids --ignore-eos)
H pause "$S" >/dev/null || e2e_fail "pause"
victim=$(owner "$S")
e2e_kill "$victim" KILL
# wait until the coordinator has declared it dead, so the resume goes to the other worker
e2e_wait_for "$E2E_TIMEOUT" sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | awk '\$1 == \"$victim\" && \$2 == \"ready\"' | grep -q . && exit 1 || exit 0" ||
  e2e_fail "$victim still listed as ready"
H resume "$S" >/dev/null || e2e_fail "resume after the owner was killed"
b=$(H generate "$S" -n 32 --ids --ignore-eos)
e2e_expect_eq "$a $b" "$full" "GPU: 64 == 32 + pause + kill -9 + resume on the other GPU worker + 32"

# a GPU worker decodes one step ahead (the next step queued before the last one's tokens are
# sent): eight sampled sessions generating at once there give the tokens of the same sessions on a
# worker with it off (HYLA_DECODE_LANES=0), generating at once too
e2e_start_worker ga "$E2E_DIR/model" --device cuda:0 || e2e_done
HYLA_DECODE_LANES=0 e2e_start_worker gb "$E2E_DIR/model" --device cuda:0 || e2e_done
pids=()
for i in 1 2 3 4 5 6 7 8; do
  head -c $((100 + 37 * i)) "$doc" >"$E2E_DIR/p$i.txt"
  for w in ga gb; do
    s=$(H create --temperature 0.8 --seed "$i" --on $w) && H append "$s" "$E2E_DIR/p$i.txt" || e2e_fail "session $i on $w"
    H generate "$s" -n 24 --ids --ignore-eos >"$E2E_DIR/$w.$i.ids" &
    pids+=($!)
  done
done
# a ninth session's document appended on each worker while the eight decode (on ga the lane
# step feeds it between its collect and its post)
for w in ga gb; do
  s9=$(H create --temperature 0.8 --seed 9 --on $w) || e2e_fail "session 9 on $w"
  echo "$s9" >"$E2E_DIR/$w.s9"
  H append "$s9" "$doc" || e2e_fail "session 9: append on $w while the batch decodes"
done
for p in "${pids[@]}"; do wait "$p" || e2e_fail "a batched generate failed"; done
for i in 1 2 3 4 5 6 7 8; do
  e2e_expect_eq "$(cat "$E2E_DIR/ga.$i.ids")" "$(cat "$E2E_DIR/gb.$i.ids")" "session $i: step ahead == plain steps, in a batch"
done
e2e_expect_eq "$(H generate "$(cat "$E2E_DIR/ga.s9")" -n 24 --ids --ignore-eos)" \
  "$(H generate "$(cat "$E2E_DIR/gb.s9")" -n 24 --ids --ignore-eos)" "session 9, appended while the batch decoded ahead"
grep -q "decode one step ahead" "$E2E_DIR/ga.log" || e2e_fail "ga did not decode one step ahead"
! grep -q "decode one step ahead" "$E2E_DIR/gb.log" || e2e_fail "gb decoded ahead with HYLA_DECODE_LANES=0"

# a CPU worker continues a GPU snapshot
e2e_start_worker c1 "$E2E_DIR/model" --device cpu || e2e_done
H pause "$S" >/dev/null || e2e_fail "pause before migrating to the CPU worker"
H migrate "$S" --to c1 >/dev/null || e2e_fail "migrate to the CPU worker"
c=$(H generate "$S" -n 16 --ids --ignore-eos) || e2e_fail "generate on the CPU worker"
[ "$(echo "$c" | wc -w)" = 16 ] || e2e_fail "CPU worker gave: $c"
e2e_log "GPU snapshot continued on the CPU worker: $c"
e2e_done
