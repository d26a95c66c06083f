#!/usr/bin/env bash
# `hyla drain --wait` is bounded and says what is left (hyla-coordinator + hyla-worker processes
# on loopback, CPU backend, tiny sse-h model, the hyla CLI):
#   stuck: a worker whose snapshots cannot reach the store (--store names a port nobody listens
#       on) never drains; `drain --wait --timeout 6` prints progress, then exits 4 at the
#       deadline naming the worker, the session left and the worker's last handover error
#       (PutSnapshot ... UNAVAILABLE); the worker stays draining;
#   dead: once that worker is killed, `drain --wait` exits 1 saying it is dead, not drained;
#   stage: a later pipeline stage says why it does not drain (its sessions go through stage 0);
#       draining stage 0 then drains both;
#   healthy: `drain --wait` of a worker that can reach the store exits 0 and the worker exits.
# The stuck case also runs the Python client's drain(wait=True, timeout=3) where python3 has grpc:
# DEADLINE_EXCEEDED naming the session left and the PutSnapshot failure.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init drain

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator coordinator --heartbeat-ms 200 --dead-after-ms 1000 || e2e_done
H() { e2e_hyla --tenant e2e "$@"; }
# held WORKER N: the worker reports N resident sessions (status column GPU+HOST, e.g. 1+0)
held() {
  [ "$(e2e_hyla status | awk -v w="$1" '$1 == w { for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+[+][0-9]+$/) { split($i, a, "+"); print a[1] + a[2] } }')" = "$2" ]
}

# drain_timed ARGS...: hyla drain ARGS, bounded by an outer `timeout 60` (a drain that ignores
# its deadline ends as 124); stdout and stderr in $E2E_DIR/drain.out, drain.err; sets RC and
# ELAPSED (seconds)
drain_timed() {
  local t0=$SECONDS rc=0
  timeout 60 "$E2E_BIN/hyla" --server "$E2E_SERVER" drain "$@" >"$E2E_DIR/drain.out" 2>"$E2E_DIR/drain.err" || rc=$?
  ELAPSED=$((SECONDS - t0))
  RC=$rc
}
ok() { [ "$E2E_FAILED" = 0 ] && e2e_log "ok: $*"; } # ok WHAT: logged while nothing has failed
expect_err() { # expect_err TEXT WHAT
  grep -qF -- "$1" "$E2E_DIR/drain.err" || e2e_fail "$2: stderr lacks '$1': $(head -c 600 "$E2E_DIR/drain.err")"
}

# stuck
nostore=$(e2e_free_port) || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" --store "127.0.0.1:$nostore" || e2e_done
S=$(H -q create --on w1) || e2e_fail "(stuck) create"
echo "a short document for the session" | H -q append "$S" - || e2e_fail "(stuck) append"
e2e_wait_for 10 held w1 1 || e2e_fail "(stuck) w1 does not report its session"
drain_timed w1 --wait --timeout 6
[ "$RC" = 4 ] || e2e_fail "(stuck) drain --wait --timeout 6: exit $RC, want 4: $(head -c 600 "$E2E_DIR/drain.err")"
[ "$ELAPSED" -ge 5 ] && [ "$ELAPSED" -le 16 ] || e2e_fail "(stuck) drain --wait --timeout 6 took ${ELAPSED}s"
expect_err "draining w1: 1 session(s) left" "(stuck) progress"
expect_err "w1 is not drained after 6 s: 1 session(s) still on it" "(stuck) the deadline"
expect_err "last handover error reported by w1: session $S: " "(stuck) the handover error"
expect_err "PutSnapshot" "(stuck) the handover error"
[ -s "$E2E_DIR/drain.out" ] && e2e_fail "(stuck) stdout is not empty: $(cat "$E2E_DIR/drain.out")"
e2e_hyla status | awk '$1 == "w1" { print $2 }' | grep -qx draining || e2e_fail "(stuck) w1 is no longer draining"
ok "(stuck) exit 4 after ${ELAPSED}s naming w1, its session and the PutSnapshot failure"
# the Python client's drain(wait=True) has the same deadline (where python3 has grpc)
if PY=$(e2e_python); then
  HYLA_PROTO_DIR="$E2E_SRC/proto" "$PY" - "$E2E_SERVER" "$E2E_SRC/client/python" "$S" >"$E2E_DIR/drain_py.out" 2>&1 <<'PY' ||
import sys, time
sys.path.insert(0, sys.argv[2])
from hyla_client import Client, HylaError
with Client(sys.argv[1], tenant="e2e") as c:
    t0 = time.monotonic()
    try:
        c.drain("w1", wait=True, timeout=3)
        print("drain returned without an error")
        sys.exit(1)
    except HylaError as e:
        el = time.monotonic() - t0
        print("%.1f s: %s" % (el, e))
        ok = (e.code_name == "DEADLINE_EXCEEDED" and "w1 is not drained after 3 s: 1 session(s) still on it" in e.details
              and ("session " + sys.argv[3]) in e.details and "PutSnapshot" in e.details and 2.5 <= el <= 15)
        sys.exit(0 if ok else 1)
PY
    e2e_fail "(stuck) python drain(wait=True, timeout=3): $(head -c 600 "$E2E_DIR/drain_py.out")"
  ok "(stuck) python drain(wait=True, timeout=3): $(head -c 300 "$E2E_DIR/drain_py.out")"
else
  e2e_log "skip: the python drain check (no python3 that imports grpc and grpc_tools)"
fi

# dead
e2e_kill w1 KILL
drain_timed w1 --wait --timeout 30
[ "$RC" = 1 ] || e2e_fail "(dead) drain --wait of a killed worker: exit $RC, want 1: $(head -c 600 "$E2E_DIR/drain.err")"
expect_err "w1 is dead" "(dead)"
ok "(dead) exit 1 after ${ELAPSED}s: $(head -n 1 "$E2E_DIR/drain.err")"

# stage
e2e_start_worker p0 "$E2E_DIR/model" --layers 0:2 || e2e_done
e2e_start_worker p1 "$E2E_DIR/model" --layers 2:4 || e2e_done
e2e_wait_for 30 sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | grep -E 'p0[ ,]+p1' | grep -qw yes" ||
  e2e_fail "(stage) the coordinator did not assemble p0 + p1 into a pipeline group"
P=$(H -q create --on p0) || e2e_fail "(stage) create on the pipeline"
echo "a short document for the pipeline" | H -q append "$P" - || e2e_fail "(stage) append"
e2e_wait_for 10 held p1 1 || e2e_fail "(stage) p1 does not report the session"
drain_timed p1 --wait --timeout 2
[ "$RC" = 4 ] || e2e_fail "(stage) drain --wait of stage 1: exit $RC, want 4: $(head -c 600 "$E2E_DIR/drain.err")"
expect_err "later pipeline stage" "(stage)"
drain_timed p0 --wait --timeout 30
[ "$RC" = 0 ] || e2e_fail "(stage) drain --wait of stage 0: exit $RC: $(head -c 600 "$E2E_DIR/drain.err")"
drain_timed p1 --wait --timeout 30
[ "$RC" = 0 ] || e2e_fail "(stage) drain --wait of stage 1 after stage 0: exit $RC: $(head -c 600 "$E2E_DIR/drain.err")"
ok "(stage) stage 1 names the reason; stage 0, then stage 1 drain"

# healthy
e2e_start_worker w2 "$E2E_DIR/model" || e2e_done
S2=$(H -q create --on w2) || e2e_fail "(healthy) create"
echo "a short document for the healthy worker" | H -q append "$S2" - || e2e_fail "(healthy) append"
e2e_wait_for 10 held w2 1 || e2e_fail "(healthy) w2 does not report its session"
w2pid=$(e2e_pid w2)
drain_timed w2 --wait --timeout 30
[ "$RC" = 0 ] || e2e_fail "(healthy) drain --wait: exit $RC: $(head -c 600 "$E2E_DIR/drain.err")"
grep -qx "w2 drained: 1 session(s) moved, 0 remaining" "$E2E_DIR/drain.out" ||
  e2e_fail "(healthy) stdout: '$(cat "$E2E_DIR/drain.out")'"
e2e_wait_for 30 sh -c "! kill -0 $w2pid 2>/dev/null" || e2e_fail "(healthy) the drained worker w2 did not exit"
ok "(healthy) drained in ${ELAPSED}s and exited"

e2e_done
