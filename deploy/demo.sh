#!/usr/bin/env bash
# The main job on embedded defaults (deploy/hyla-dev demo): a tiny SSE-H model, a long prompt,
# generation, save state, resume from the saved state in a new process, and the proof that the
# continuation is identical to the uninterrupted run. When the cluster binaries exist, the
# demo runs through them instead (deploy/demo-cluster.sh).
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin"
if [ -x "$BIN/hyla-coordinator" ] && [ -x "$BIN/hyla-worker" ] && [ -x "$BIN/hyla" ] && [ -f "$(dirname "$0")/demo-cluster.sh" ]; then
  exec bash "$(dirname "$0")/demo-cluster.sh" "$BUILD"
fi
work=$(mktemp -d /tmp/hyla-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

say "1. a tiny SSE-H model (6 layers: 5 SSE + 1 softmax attention), deterministic random weights"
"$BIN/hyla-mkmodel" --arch sse-h --layers 6 --hidden 128 --heads 4 --seed 1 --out "$work/model"

say "2. a long prompt (about 6 000 tokens) through it, then 64 generated tokens in one run"
python3 - "$work/prompt.txt" <<'PY'
import sys
words = "state space models compress the past into a fixed size state while attention keeps every token".split()
text = " ".join(words[(i * 7) % len(words)] for i in range(1000))
open(sys.argv[1], "w").write(text)
PY
"$BIN/hyla-run" --model "$work/model" --prompt-file "$work/prompt.txt" --max-tokens 64 --ids --ignore-eos \
  --temperature 0.8 --seed 42 > "$work/full.txt"
echo "uninterrupted: $(cat "$work/full.txt")" >&2

say "3. the same, stopping after 32 tokens and saving the session state"
"$BIN/hyla-run" --model "$work/model" --prompt-file "$work/prompt.txt" --max-tokens 32 --ids --ignore-eos \
  --temperature 0.8 --seed 42 --save-state "$work/session.hyla" > "$work/part1.txt"
ls -l "$work/session.hyla" >&2

say "4. a new process resumes from the saved state (no prompt, no re-prefill) for 32 more tokens"
"$BIN/hyla-run" --model "$work/model" --load-state "$work/session.hyla" --max-tokens 32 --ids --ignore-eos \
  > "$work/part2.txt"
echo "first half : $(cat "$work/part1.txt")" >&2
echo "second half: $(cat "$work/part2.txt")" >&2

say "5. identical?"
if [ "$(cat "$work/full.txt")" = "$(cat "$work/part1.txt") $(cat "$work/part2.txt")" ]; then
  echo "yes: 64 tokens in one run == 32 + save + resume + 32 (bit-exact state, same sampler RNG)" >&2
else
  echo "NO: the resumed continuation differs" >&2
  exit 1
fi
