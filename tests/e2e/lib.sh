# tests/e2e/lib.sh — helpers for end-to-end tests with real hyla processes on loopback (ctest label
# e2e): a work directory, free ports, starting hyla-coordinator / hyla-worker in the background
# with their logs kept, waiting for readiness, the hyla CLI bound to the coordinator, checks, and
# a cleanup trap that stops every process it started (by pid) and shows their logs on failure.
#
#   . "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
#   e2e_init python                      # work dir, trap; skips (77) without the binaries
#   e2e_make_model "$E2E_DIR/model"      # tiny sse-h model (hyla-mkmodel)
#   e2e_start_coordinator                # sets E2E_SERVER; waits until `hyla status` answers
#   e2e_start_worker w1 "$E2E_DIR/model" # waits until the coordinator lists one more ready worker
#   S=$(e2e_hyla create)
#   e2e_expect_eq "$a" "$b" "continuation after resume"
#   e2e_done                             # exit status: 0, or 1 after any e2e_fail
#
# Environment: HYLA_BIN_DIR (default build/bin), HYLA_SOURCE_DIR (default .), HYLA_E2E_KEEP=1
# keeps the work directory, HYLA_E2E_TIMEOUT (seconds, default 60) bounds every wait.
# Processes: `hyla-coordinator --listen 127.0.0.1:0 --port-file F --data DIR` and
# `hyla-worker --coordinator ADDR --listen 127.0.0.1:0 --id NAME --model DIR --device cpu`;
# extra arguments are passed through (e.g. --layers A:B, --snapshot-every K, --dead-after-ms N).

# shellcheck disable=SC2034  # E2E_SRC: for the scripts that source this file
E2E_BIN=${HYLA_BIN_DIR:-build/bin}
E2E_SRC=${HYLA_SOURCE_DIR:-.}
E2E_TIMEOUT=${HYLA_E2E_TIMEOUT:-60}
E2E_DIR=
E2E_SERVER=
E2E_FAILED=0
declare -A E2E_PIDS=()
declare -A E2E_PORTS_USED=()
E2E_NAMES=()

e2e_log() { printf 'e2e: %s\n' "$*" >&2; }

# e2e_skip MSG: exit 77 (ctest: skipped), saying why.
e2e_skip() {
  echo "SKIP: $*"
  exit 77
}

# e2e_require NAME...: skip unless every named binary is in $E2E_BIN.
e2e_require() {
  local b
  for b in "$@"; do
    [ -x "$E2E_BIN/$b" ] || e2e_skip "$E2E_BIN/$b is not built yet"
  done
}

# e2e_init NAME [BINARIES...]: the work directory and the cleanup trap. Requires hyla,
# hyla-coordinator, hyla-worker, hyla-mkmodel unless other binaries are named.
e2e_init() {
  local name=$1
  shift
  if [ $# -eq 0 ]; then
    e2e_require hyla hyla-coordinator hyla-worker hyla-mkmodel
  else
    e2e_require "$@"
  fi
  E2E_DIR=$(mktemp -d "/tmp/hyla-e2e-$name.XXXXXX")
  trap e2e_cleanup EXIT
  trap 'e2e_fail "interrupted"; exit 130' INT TERM
  e2e_log "work directory $E2E_DIR"
}

# e2e_free_port: a TCP port nobody listens on now (and not handed out before by this script).
e2e_free_port() {
  local p hex i
  for i in $(seq 1 200); do
    p=$((20000 + RANDOM % 40000))
    [ -n "${E2E_PORTS_USED[$p]:-}" ] && continue
    hex=$(printf ':%04X ' "$p")
    if ! grep -qi "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      E2E_PORTS_USED[$p]=1
      echo "$p"
      return 0
    fi
  done
  e2e_fail "no free port found"
  return 1
}

# e2e_start NAME CMD...: run CMD in the background; its output is appended to $E2E_DIR/NAME.log
# (a restart under the same NAME keeps the earlier output).
e2e_start() {
  local name=$1
  shift
  echo "==== $(date +%T) $*" >>"$E2E_DIR/$name.log"
  "$@" >>"$E2E_DIR/$name.log" 2>&1 &
  E2E_PIDS[$name]=$!
  E2E_NAMES+=("$name")
  e2e_log "started $name (pid ${E2E_PIDS[$name]}): $*"
}

# e2e_pid NAME: its pid.
e2e_pid() { echo "${E2E_PIDS[$1]}"; }

# e2e_alive NAME: true while it runs.
e2e_alive() { kill -0 "${E2E_PIDS[$1]}" 2>/dev/null; }

# e2e_kill NAME [SIGNAL]: send SIGNAL (default TERM) and wait for the process to end.
e2e_kill() {
  local name=$1 sig=${2:-TERM} pid=${E2E_PIDS[$1]:-}
  [ -n "$pid" ] || return 0
  kill "-$sig" "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  unset "E2E_PIDS[$name]"
  e2e_log "stopped $name (SIG$sig)"
}

# e2e_wait_for SECONDS CMD...: retry CMD (quietly) every 0.1 s until it succeeds; fails after
# SECONDS.
e2e_wait_for() {
  local secs=$1 end
  shift
  end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# e2e_port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
e2e_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# e2e_hyla ARGS...: the CLI against the coordinator started here.
e2e_hyla() { "$E2E_BIN/hyla" --server "$E2E_SERVER" "$@"; }

# e2e_ready_workers: the number of workers the coordinator lists as ready.
e2e_ready_workers() {
  e2e_hyla status 2>/dev/null | awk '$2 == "ready" { n++ } END { print n + 0 }'
}

# e2e_start_coordinator [NAME] [ARGS...]: hyla-coordinator on a port it picks (--listen
# 127.0.0.1:0 --port-file), its data dir in $E2E_DIR/NAME.data (kept across restarts of the same
# NAME); sets E2E_SERVER; waits until `hyla status` answers.
e2e_start_coordinator() {
  local name=${1:-coordinator}
  [ $# -gt 0 ] && shift
  mkdir -p "$E2E_DIR/$name.data"
  rm -f "$E2E_DIR/$name.port"
  e2e_start "$name" "$E2E_BIN/hyla-coordinator" --listen 127.0.0.1:0 --port-file "$E2E_DIR/$name.port" \
    --data "$E2E_DIR/$name.data" "$@"
  if ! e2e_wait_for "$E2E_TIMEOUT" test -s "$E2E_DIR/$name.port"; then
    e2e_fail "$name wrote no port file within ${E2E_TIMEOUT}s"
    return 1
  fi
  E2E_SERVER=127.0.0.1:$(cat "$E2E_DIR/$name.port")
  if ! e2e_wait_for "$E2E_TIMEOUT" e2e_hyla --timeout 2 status; then
    e2e_fail "$name did not answer on $E2E_SERVER within ${E2E_TIMEOUT}s"
    return 1
  fi
}

# e2e_restart_coordinator [NAME] [ARGS...]: a new process on the same address and data dir (the
# workers keep dialing that address).
e2e_restart_coordinator() {
  local name=${1:-coordinator}
  [ $# -gt 0 ] && shift
  e2e_start "$name" "$E2E_BIN/hyla-coordinator" --listen "$E2E_SERVER" --data "$E2E_DIR/$name.data" "$@"
  e2e_wait_for "$E2E_TIMEOUT" e2e_hyla --timeout 2 status || {
    e2e_fail "$name did not come back on $E2E_SERVER"
    return 1
  }
}

# e2e_start_worker NAME MODEL_DIR [ARGS...] (e.g. --layers 0:3): hyla-worker with worker id NAME
# on the CPU backend, on a port it picks; waits until the coordinator lists one more ready worker.
e2e_start_worker() {
  local name=$1 model=$2
  shift 2
  local before
  before=$(e2e_ready_workers)
  e2e_start "$name" "$E2E_BIN/hyla-worker" --coordinator "$E2E_SERVER" --listen 127.0.0.1:0 --id "$name" \
    --model "$model" --device cpu "$@"
  if ! e2e_wait_for "$E2E_TIMEOUT" e2e_more_workers "$before"; then
    e2e_fail "$name did not register as ready within ${E2E_TIMEOUT}s"
    return 1
  fi
}
e2e_more_workers() { [ "$(e2e_ready_workers)" -gt "$1" ]; }

# e2e_make_model DIR [ARCH] [LAYERS] [MKMODEL ARGS...]: a tiny deterministic model (default
# sse-h, 4 layers).
e2e_make_model() {
  "$E2E_BIN/hyla-mkmodel" --arch "${2:-sse-h}" --layers "${3:-4}" --hidden 64 --heads 4 --seed 3 \
    "${@:4}" --out "$1" >/dev/null 2>&1 || e2e_fail "hyla-mkmodel failed for $1"
}

# e2e_python: the first python3 that imports grpc and grpc_tools ($HYLA_PYTHON, /usr/bin/python3,
# python3); empty if none.
e2e_python() {
  local py
  for py in "${HYLA_PYTHON:-}" /usr/bin/python3 python3; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c "import grpc, grpc_tools.protoc" >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

# e2e_fail MSG: record a failure (the test goes on; e2e_done exits 1).
e2e_fail() {
  echo "FAIL: $*" >&2
  E2E_FAILED=1
}

# e2e_expect_eq GOT WANT WHAT
e2e_expect_eq() {
  if [ "$1" != "$2" ]; then
    e2e_fail "$3: got '$1', want '$2'"
  else
    e2e_log "ok: $3"
  fi
}

# e2e_expect_rc WANT WHAT CMD...: run CMD, compare its exit status.
e2e_expect_rc() {
  local want=$1 what=$2 rc=0
  shift 2
  "$@" >"$E2E_DIR/last.out" 2>"$E2E_DIR/last.err" || rc=$?
  if [ "$rc" != "$want" ]; then
    e2e_fail "$what: exit $rc, want $want; stderr: $(head -c 400 "$E2E_DIR/last.err")"
  else
    e2e_log "ok: $what (exit $rc)"
  fi
}

# e2e_cleanup (the EXIT trap): stop what was started (TERM, then KILL after 5 s), show the
# logs' tails if anything failed, remove the work directory unless HYLA_E2E_KEEP=1.
e2e_cleanup() {
  local rc=$? name pid i
  for name in "${E2E_NAMES[@]}"; do
    pid=${E2E_PIDS[$name]:-}
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
  done
  for name in "${E2E_NAMES[@]}"; do
    pid=${E2E_PIDS[$name]:-}
    [ -n "$pid" ] || continue
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "$E2E_FAILED" != 0 ] || { [ "$rc" != 0 ] && [ "$rc" != 77 ]; }; then
    for name in "${E2E_NAMES[@]}"; do
      [ -f "$E2E_DIR/$name.log" ] || continue
      echo "---- $name.log (last 40 lines) ----" >&2
      tail -n 40 "$E2E_DIR/$name.log" >&2
    done
  fi
  if [ -n "$E2E_DIR" ] && [ "${HYLA_E2E_KEEP:-0}" != 1 ]; then
    rm -rf "$E2E_DIR"
  elif [ -n "$E2E_DIR" ]; then
    echo "e2e: kept $E2E_DIR" >&2
  fi
}

# e2e_done: the test's exit status.
e2e_done() {
  if [ "$E2E_FAILED" != 0 ]; then
    exit 1
  fi
  echo "ok"
  exit 0
}
