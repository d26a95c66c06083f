#!/usr/bin/env bash
# The main job on embedded defaults, as a cluster (deploy/hyla-dev demo): a coordinator with
# its embedded statestore and two CPU workers on loopback; a long document appended with a
# progress bar; generation; a durable Pause; the worker holding the session killed with -9
# and restarted; Resume; and the proof that the continuation is identical to a session that
# was never interrupted.
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin"
work=$(mktemp -d /tmp/hyla-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

CPORT=$(port)
export HYLA_SERVER=127.0.0.1:$CPORT
H() { "$BIN/hyla" "$@"; }

say "1. a tiny SSE-H model (6 layers: 5 SSE + 1 softmax attention), deterministic random weights"
"$BIN/hyla-mkmodel" --arch sse-h --layers 6 --hidden 128 --heads 4 --seed 1 --out "$work/model"

say "2. hyla-coordinator (session directory + embedded statestore in RocksDB) and two workers"
"$BIN/hyla-coordinator" --listen "$HYLA_SERVER" --data "$work/coord" >"$work/coord.log" 2>&1 &
pids+=($!)
start_worker() { # name
  "$BIN/hyla-worker" --coordinator "$HYLA_SERVER" --listen 127.0.0.1:0 --model "$work/model" --id "$1" \
    >"$work/$1.log" 2>&1 &
  echo $!
}
W1=$(start_worker w1); pids+=("$W1")
W2=$(start_worker w2); pids+=("$W2")
for _ in $(seq 1 100); do
  [ "$(H status 2>/dev/null | awk '$2 == "ready"' | wc -l)" -ge 2 ] && break
  sleep 0.2
done
H status

say "3. a long document (~12 000 tokens), appended to two sessions with the same seed"
python3 - "$work/doc.txt" <<'PY'
import sys
words = ("state space models compress the past into a fixed size state while attention keeps "
         "every token and sparse state expansion gives each token a partition of its own").split()
open(sys.argv[1], "w").write(" ".join(words[(i * 7) % len(words)] for i in range(2500)))
PY
S=$(H create --temperature 0.8 --seed 42)
R=$(H create --temperature 0.8 --seed 42)
echo "session $S (to be interrupted), reference $R" >&2
H append "$S" "$work/doc.txt"
H -q append "$R" "$work/doc.txt"

say "4. the reference generates 64 tokens without interruption"
H -q generate "$R" -n 64 --ids --ignore-eos >"$work/ref.txt"
cat "$work/ref.txt" >&2

say "5. session $S generates 32 tokens, then a durable Pause"
H -q generate "$S" -n 32 --ids --ignore-eos >"$work/a.txt"
cat "$work/a.txt" >&2
H pause "$S"
owner=$(H show "$S" | awk '$1 == "workers" { print $2 }')

say "6. kill -9 the worker that held it ($owner), then start it again"
if [ "$owner" = w1 ]; then kill -9 "$W1"; W1=$(start_worker w1); pids+=("$W1");
else kill -9 "$W2"; W2=$(start_worker w2); pids+=("$W2"); fi
sleep 1
H status

say "7. Resume from the durable snapshot and generate the remaining 32 tokens"
H resume "$S"
H -q generate "$S" -n 32 --ids --ignore-eos >"$work/b.txt"
cat "$work/b.txt" >&2

say "8. identical?"
if [ "$(cat "$work/ref.txt")" = "$(cat "$work/a.txt") $(cat "$work/b.txt")" ]; then
  echo "yes: 32 + pause + worker killed and restarted + resume + 32 == 64 uninterrupted (bit-exact)" >&2
else
  echo "NO: the resumed continuation differs" >&2
  exit 1
fi
