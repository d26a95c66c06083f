#!/usr/bin/env bash
# The serving path end to end, timed: a coordinator (embedded RocksDB statestore) and one worker
# on loopback, driven by the hyla CLI like a user would.
#   deploy/bench-cluster.sh BIN_DIR MODEL_DIR [DEVICE] [DOC_TOKENS] [SESSIONS]
# Appends a DOC_TOKENS-token document (byte-level tokenizer: one token per byte) to a session,
# generates 256 tokens, pauses it (durable), resumes it and generates 64 more; then SESSIONS
# sessions (each with a 512-token prompt) generate 128 tokens at once (batched decode in the
# worker). Prints one JSON line per measurement (seconds and tokens/s as the client sees them,
# process start-up of the CLI included). Defaults: cuda:0, 32768 tokens, 16 sessions.
set -euo pipefail
BIN=${1:?usage: bench-cluster.sh BIN_DIR MODEL_DIR [DEVICE] [DOC_TOKENS] [SESSIONS]}
MODEL=${2:?model directory}
DEV=${3:-cuda:0}
DOC=${4:-32768}
NS=${5:-16}
work=$(mktemp -d /tmp/hyla-bench-cluster.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
emit() { # name start end tokens
  python3 -c "import sys; n,a,b,t=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),int(sys.argv[4]); s=b-a; print('{\"bench\":\"cluster_%s\",\"device\":\"$DEV\",\"s\":%.3f,\"tokens\":%d,\"tokens_per_s\":%.0f}' % (n,s,t,t/s if s>0 else 0))" "$1" "$2" "$3" "$4"
}
export HYLA_SERVER=127.0.0.1:$(port)
H() { "$BIN/hyla" -q "$@"; }

"$BIN/hyla-coordinator" --listen "$HYLA_SERVER" --data "$work/coord" >"$work/coord.log" 2>&1 &
pids+=($!)
"$BIN/hyla-worker" --coordinator "$HYLA_SERVER" --listen 127.0.0.1:0 --model "$MODEL" --device "$DEV" --id w1 \
  --max-batch 64 >"$work/w1.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do
  [ "$(H status 2>/dev/null | awk '$2 == "ready"' | wc -l)" -ge 1 ] && break
  sleep 0.2
done
H status >&2

python3 - "$work/doc.txt" "$DOC" <<'PY'
import random, sys
random.seed(7)
words = "state space models compress the past into a fixed size state while attention keeps every token".split()
out, n = [], 0
while n < int(sys.argv[2]):
    w = random.choice(words) + " "
    out.append(w)
    n += len(w)
open(sys.argv[1], "w").write("".join(out)[: int(sys.argv[2])])
PY

S=$(H create --temperature 0.8 --seed 1)
t0=$(now); H append "$S" "$work/doc.txt"; t1=$(now)
emit append "$t0" "$t1" "$DOC"
t0=$(now); H generate "$S" -n 256 --ignore-eos >/dev/null; t1=$(now)
emit generate_256 "$t0" "$t1" 256
t0=$(now); H pause "$S" >&2; t1=$(now)
emit pause "$t0" "$t1" 0
t0=$(now); H generate "$S" -n 64 --ignore-eos >/dev/null; t1=$(now)
emit resume_generate_64 "$t0" "$t1" 64

python3 -c "print('the quick brown fox jumps over the lazy dog ' * 12)" | head -c 512 >"$work/p.txt"
ids=()
for i in $(seq 1 "$NS"); do
  s=$(H create --temperature 0.8 --seed "$i")
  H append "$s" "$work/p.txt"
  ids+=("$s")
done
gp=()
t0=$(now)
for s in "${ids[@]}"; do
  H generate "$s" -n 128 --ignore-eos >/dev/null &
  gp+=($!)
done
wait "${gp[@]}"
t1=$(now)
emit "generate_128_x$NS" "$t0" "$t1" $((128 * NS))
