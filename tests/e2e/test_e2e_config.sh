#!/usr/bin/env bash
# --config FILE on hyla-coordinator and hyla-worker (common/hyla_flagfile.c):
#   every flag --help lists is accepted as a key (a file with all of them expands without an
#       "unknown key" error; flags without a value as `key = true`);
#   a coordinator and a worker started from files alone serve (listen, data, model, id, metrics
#       keys take effect), and a flag on the command line overrides the file's key;
#   an unknown key, a value given to a flag without one, and a line without '=' exit 2 naming
#       FILE:LINE and the key.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init config

# every --help flag is a key: expanding a file with all of them must not fail as unknown
for bin in hyla-coordinator hyla-worker; do
  "$E2E_BIN/$bin" --help | awk '
    match($0, /^  --[a-z-]+/) {
      flag = substr($0, 5, RLENGTH - 4); rest = substr($0, RLENGTH + 1)
      if (flag == "config" || flag == "help") next
      print flag " = " (rest ~ /^  / ? "true" : "x")
    }' >"$E2E_DIR/$bin.all.conf"
  n=$(wc -l <"$E2E_DIR/$bin.all.conf")
  [ "$n" -gt 10 ] || e2e_fail "$bin --help lists only $n flags"
  out=$("$E2E_BIN/$bin" --config "$E2E_DIR/$bin.all.conf" --help 2>&1 >/dev/null)
  if echo "$out" | grep -q "unknown key\|takes no value"; then
    e2e_fail "$bin: a --help flag is not a config key: $out"
  else
    e2e_log "ok: $bin accepts all $n --help flags as config keys"
  fi
done

e2e_make_model "$E2E_DIR/model"
mkdir -p "$E2E_DIR/data"
cat >"$E2E_DIR/coord.conf" <<CONF
# the coordinator of a test cluster
listen = 127.0.0.1:0
data = "$E2E_DIR/data"
port-file = $E2E_DIR/coord.port
heartbeat-ms = 200
dead-after-ms = 2000
metrics = 127.0.0.1:0
metrics-port-file = $E2E_DIR/from-file.mport
no-store = false
CONF
e2e_start coordinator "$E2E_BIN/hyla-coordinator" --config "$E2E_DIR/coord.conf" \
  --metrics-port-file "$E2E_DIR/from-flag.mport"
e2e_wait_for 20 test -s "$E2E_DIR/coord.port" || e2e_fail "the coordinator from coord.conf wrote no port file"
E2E_SERVER=127.0.0.1:$(cat "$E2E_DIR/coord.port")
e2e_wait_for 20 e2e_hyla --timeout 2 status || e2e_fail "the coordinator from coord.conf does not answer"
e2e_wait_for 10 test -s "$E2E_DIR/from-flag.mport" || e2e_fail "--metrics-port-file on the command line was not used"
[ -e "$E2E_DIR/from-file.mport" ] && e2e_fail "the file's metrics-port-file was not overridden by the flag"
curl -sf "http://127.0.0.1:$(cat "$E2E_DIR/from-flag.mport")/metrics" | grep -q '^hyla_coord_workers' ||
  e2e_fail "metrics from the config file's metrics key are not served"

cat >"$E2E_DIR/worker.conf" <<CONF
coordinator = $E2E_SERVER
listen = 127.0.0.1:0
model = $E2E_DIR/model
device = cpu
id = from-file
CONF
e2e_start w "$E2E_BIN/hyla-worker" --config "$E2E_DIR/worker.conf" --id from-flag
listed() { e2e_hyla status | awk '$1 == "from-flag" && $2 == "ready" { f = 1 } END { exit !f }'; }
e2e_wait_for 30 listed || e2e_fail "the worker from worker.conf with --id from-flag is not listed ready"
e2e_hyla status | grep -q from-file && e2e_fail "the worker used the file's id, not the flag's"
[ "$E2E_FAILED" = 0 ] && e2e_log "ok: coordinator and worker run from config files; flags override keys"

# refusals: exit 2 naming FILE:LINE and the key
bad() { # bad BIN WANT_TEXT LINES...
  local bin=$1 want=$2 rc=0 err
  shift 2
  printf '%s\n' "$@" >"$E2E_DIR/bad.conf"
  err=$("$E2E_BIN/$bin" --config "$E2E_DIR/bad.conf" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 2 ] || e2e_fail "$bin with a bad config: exit $rc, want 2"
  echo "$err" | grep -qF -- "$want" || e2e_fail "$bin with a bad config: '$err' lacks '$want'"
}
bad hyla-coordinator "bad.conf:3: unknown key 'bogus'" "# x" "listen = 127.0.0.1:0" "bogus = 1"
bad hyla-coordinator "bad.conf:1: no-store takes no value" "no-store = yes"
bad hyla-worker "bad.conf:2: want \`key = value\`" "model = /x" "device cpu"
bad hyla-worker "bad.conf:1: unknown key 'modle'" "modle = /x"
{ "$E2E_BIN/hyla-coordinator" --config "$E2E_DIR/nonexistent.conf" 2>&1 || true; } | grep -q "nonexistent.conf: cannot open" ||
  e2e_fail "a missing config file is not named"
# a numeric option whose value is not one (from a file or the command line) exits 2 naming it,
# instead of starting with 0 or a wrapped negative
bad hyla-worker "--max-batch must be a number of sessions from 1 to 65536, got 'abc'" "max-batch = abc"
bad hyla-worker "--state-budget must be a size in MiB" "state-budget = -5"
for a in "--max-batch 0" "--snapshot-every -1" "--max-generate x" "--max-append-tokens 0" "--prefill-piece abc" \
         "--prefill-budget 0" "--threads 0" "--host-budget x"; do
  set -- $a
  rc=0
  err=$("$E2E_BIN/hyla-worker" "$1" "$2" --help 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 2 ] && echo "$err" | grep -qF -- "$1 must be" || e2e_fail "hyla-worker $a: exit $rc, '$err'"
done
e2e_done
