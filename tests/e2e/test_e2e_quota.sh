#!/usr/bin/env bash
# Per-tenant quotas of hyla-coordinator (--quota-sessions 2 --quota-generations 1
# --quota-stored-bytes 1; coordinator + one CPU worker + the CLI):
#   sessions: a tenant's third CreateSession and a Fork fail RESOURCE_EXHAUSTED (CLI exit 6) naming
#       the limit and its flag; another tenant is not affected; after a Delete the tenant creates
#       again;
#   generations: while one Generate of a tenant runs, a second one of the same tenant fails naming
#       --quota-generations, another tenant's runs; once the first ends (its client gone
#       mid-stream), the tenant generates again;
#   stored bytes: once a tenant's paused session is committed to the store, its Append and
#       CreateSession fail naming --quota-stored-bytes, while what is committed keeps serving
#       (nothing committed is lost): the session still generates, pauses with --evict and
#       continues from the store, and an rm (DeleteSession) frees the tenant to create again.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init quota

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator coordinator --quota-sessions 2 --quota-generations 1 --quota-stored-bytes 1 || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" || e2e_done
T() { local t=$1; shift; e2e_hyla --tenant "$t" "$@"; }
# refused WHAT WANT_TEXT CMD...: CMD exits 6 and its stderr names WANT_TEXT
refused() {
  local what=$1 want=$2 rc=0
  shift 2
  "$@" >/dev/null 2>"$E2E_DIR/err" || rc=$?
  [ "$rc" = 6 ] || e2e_fail "$what: exit $rc, want 6 (RESOURCE_EXHAUSTED): $(head -c 300 "$E2E_DIR/err")"
  grep -q "RESOURCE_EXHAUSTED" "$E2E_DIR/err" || e2e_fail "$what: stderr lacks RESOURCE_EXHAUSTED: $(head -c 300 "$E2E_DIR/err")"
  grep -qF -- "$want" "$E2E_DIR/err" || e2e_fail "$what: stderr lacks '$want': $(head -c 300 "$E2E_DIR/err")"
  [ "$rc" = 6 ] && e2e_log "ok: $what refused: $(head -c 200 "$E2E_DIR/err")"
}

# sessions
A1=$(T a -q create) || e2e_fail "a: first create"
A2=$(T a -q create) || e2e_fail "a: second create"
refused "a: third create" "--quota-sessions" T a -q create
refused "a: fork over the session limit" "limit is 2" T a -q fork "$A1"
B1=$(T b -q create) || e2e_fail "b is limited by a's sessions"
T a rm "$A2" >"$E2E_DIR/del.out" 2>&1 || e2e_fail "a: delete: $(cat "$E2E_DIR/del.out")"
A3=$(T a -q create 2>"$E2E_DIR/a3.err") || e2e_fail "a: create after a delete: $(cat "$E2E_DIR/a3.err")"

# generations
T a -q append "$A1" - <<<"a document to generate from" || e2e_fail "a: append"
T a -q append "$A3" - <<<"another document" || e2e_fail "a: append 2"
# long enough to outlast the probes on a fast machine (2000 tokens of the tiny model took < 1 s)
# (the CLI itself in the background, not a subshell running T: $long is the process to end)
"$E2E_BIN/hyla" --server "$E2E_SERVER" --tenant a -q generate "$A1" -n 20000 --ignore-eos --ids \
  >"$E2E_DIR/long.out" 2>"$E2E_DIR/long.err" &
long=$!
sleep 0.3 # let the long call start before probing
seen=0
for _ in $(seq 1 100); do
  rc=0
  T a -q generate "$A3" -n 1 --ids >/dev/null 2>"$E2E_DIR/err2" || rc=$?
  if [ "$rc" = 6 ]; then seen=1; break; fi
  kill -0 $long 2>/dev/null || break
  sleep 0.05
done
if [ $seen = 1 ] && grep -q -- "--quota-generations" "$E2E_DIR/err2"; then
  e2e_log "ok: a second Generate of a is refused while one runs: $(head -c 200 "$E2E_DIR/err2")"
else
  e2e_fail "no second Generate of a was refused naming --quota-generations while the long one ran ($(cat "$E2E_DIR/err2"))"
fi
if kill -0 $long 2>/dev/null; then
  T b -q append "$B1" - <<<"b's own document" || e2e_fail "b: append"
  T b -q generate "$B1" -n 4 --ids >/dev/null || e2e_fail "b cannot generate while a's Generate runs"
fi
# the probes are done: end the long call (a client gone mid-stream; on a loaded machine its
# 20000 tokens could take minutes) and the tenant's slot must come back once the coordinator
# has seen the cancel
if kill -0 $long 2>/dev/null; then
  kill $long 2>/dev/null
  wait $long 2>/dev/null
else
  wait $long || e2e_fail "a: the long Generate failed: $(head -c 300 "$E2E_DIR/long.err")"
fi
ok=0
for _ in $(seq 1 100); do
  rc=0
  T a -q generate "$A3" -n 2 --ids >/dev/null 2>"$E2E_DIR/err3" || rc=$?
  if [ "$rc" = 0 ]; then ok=1; break; fi
  [ "$rc" = 6 ] || break
  sleep 0.1
done
[ $ok = 1 ] || e2e_fail "a: generate after the long one ended (exit $rc): $(head -c 300 "$E2E_DIR/err3")"

# stored bytes: tenant c; its first pause commits a snapshot, then it is over 1 byte
C1=$(T c -q create) || e2e_fail "c: create"
T c -q append "$C1" - <<<"c's document, committed by the pause" || e2e_fail "c: append"
T c pause "$C1" >/dev/null || e2e_fail "c: pause"
refused "c: append over the stored-bytes limit" "--quota-stored-bytes" T c -q append "$C1" - <<<"more"
refused "c: create over the stored-bytes limit" "--quota-stored-bytes" T c -q create
# what is committed still serves: generate (resumes the paused session), pause again, delete
g1=$(T c -q generate "$C1" -n 8 --ids --ignore-eos) || e2e_fail "c: generate over the byte limit"
[ -n "$g1" ] || e2e_fail "c: generate printed nothing"
T c pause "$C1" --evict >/dev/null || e2e_fail "c: pause --evict over the byte limit"
g2=$(T c -q generate "$C1" -n 8 --ids --ignore-eos) || e2e_fail "c: generate after evict"
[ -n "$g2" ] || e2e_fail "c: the session did not continue after evict"
T c rm "$C1" >/dev/null || e2e_fail "c: delete over the byte limit"
C2=$(T c -q create) || e2e_fail "c: create after the delete freed its bytes"
[ -n "${C2:-}" ] && e2e_log "ok: c over the byte limit kept generate/pause/delete, created again after delete"
e2e_done
