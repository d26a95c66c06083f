#!/usr/bin/env bash
# A coordinator that stalls (SIGSTOP for longer than --dead-after-ms, then SIGCONT: what a slow
# directory fsync under its lock or a starved machine looks like) must not declare its live
# workers dead: the heartbeats they sent meanwhile were the coordinator's to read. Otherwise the
# monitor unplaces their sessions, and a session whose Append was acknowledged after its last
# snapshot (here: none, --snapshot-every 0) falls back to that snapshot and loses the document.
# Checks, with a real coordinator and one CPU worker on loopback:
#   (s) after the stall no worker was declared dead, the session stayed where it was, and it
#       generates the same tokens as a session that never saw a stall.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init stall

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator coordinator --heartbeat-ms 200 --dead-after-ms 1000 || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" --snapshot-every 0 || e2e_done
H() { e2e_hyla --tenant e2e -q "$@"; }

doc="$E2E_DIR/doc.txt"
for i in $(seq 1 8); do echo "Line $i of a document appended once, never snapshotted."; done >"$doc"

R=$(H create --temperature 0.9 --seed 5) || e2e_fail "create (reference)"
H append "$R" "$doc" || e2e_fail "append (reference)"
ref=$(H generate "$R" -n 24 --ids --ignore-eos)

S=$(H create --temperature 0.9 --seed 5) || e2e_fail "create"
H append "$S" "$doc" || e2e_fail "append"
cpid=$(e2e_pid coordinator)
kill -STOP "$cpid"
sleep 3 # three times --dead-after-ms
kill -CONT "$cpid"
e2e_wait_for "$E2E_TIMEOUT" e2e_hyla --timeout 2 status || e2e_fail "(s) the coordinator did not answer after SIGCONT"

if grep -q "missed heartbeats" "$E2E_DIR/coordinator.log"; then
  e2e_fail "(s) a live worker was declared dead after the coordinator's own stall: $(grep 'missed heartbeats' "$E2E_DIR/coordinator.log")"
fi
if grep -q "session $S leaves group" "$E2E_DIR/coordinator.log"; then
  e2e_fail "(s) the session was unplaced after the stall: $(grep "session $S leaves group" "$E2E_DIR/coordinator.log")"
fi
e2e_expect_eq "$(H generate "$S" -n 24 --ids --ignore-eos)" "$ref" \
  "(s) after the coordinator's stall the session continues like one that never saw it"
e2e_done
