#!/usr/bin/env bash
# multigpu-check.sh — the checks and benchmarks of multi-GPU serving (pipeline stages over NCCL,
# tensor parallelism) that need two GPUs of one host, in one command on the GPU machine. Built
# on another machine and run from a device pack (docs/TESTING.md "Several GPUs"):
#
#   HYLA_SOURCE_DIR=. HYLA_BIN_DIR=/tmp/p/bin deploy/multigpu-check.sh OUTDIR
#
# HYLA_BIN_DIR holds hyla's programs (build/bin: hyla, hyla-coordinator, hyla-worker, hyla-bench,
# hyla-mkmodel, ...) and the test program test_tp (build/tests/test_tp). Steps (STEPS, a comma
# list, default tests,tp,pipeline):
#   tests     test_tp cuda (test_tp cuda4 too with four GPUs), tests/e2e/test_e2e_tp.sh on the GPUs
#             (E2E_TP_DEVICE=cuda:0) and tests/e2e/test_e2e_multigpu.sh: the `multigpu` label;
#   tp        hyla-bench e2e --tp 1 and --tp 2 of the 1.68B GDN and 1.3B SSE-H shapes (random
#             weights, made into MODELS_DIR, default /tmp/hyla-mg): prefill 131072, decode
#             B = 1, 64, 256, then the TP = 2 / one GPU ratios of prefill and of decode at B = 256;
#   pipeline  deploy/bench-pipeline.sh 131072 32 with 256 sessions (PP = 2 over NCCL against one
#             GPU through the serving path).
# Each step writes OUTDIR/<step>.txt (a benchmark's JSON lines also OUTDIR/<step>.jsonl) and prints
# one line: ok, SKIP with the test's reason, or FAIL with the log's tail. Exit status: 1 when a step
# failed, 0 when none did; 77 with a message, nothing run, where fewer than two GPUs are visible.
# NCCL_NVLS_ENABLE=0 is set: NVLink multicast stays off on these machines.
set -uo pipefail
out=${1:?usage: multigpu-check.sh OUTDIR}
src=${HYLA_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
bin=${HYLA_BIN_DIR:-$src/build/bin}
export HYLA_SOURCE_DIR=$src HYLA_BIN_DIR=$bin NCCL_NVLS_ENABLE=0
STEPS=${STEPS:-tests,tp,pipeline}
mkdir -p "$out"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${ngpu:-0}" -lt 2 ]; then
  echo "multigpu-check: SKIP — needs two GPUs of one host; nvidia-smi lists ${ngpu:-0}" >&2
  exit 77
fi
for p in test_tp hyla-bench hyla-mkmodel hyla-worker hyla-coordinator hyla; do
  [ -x "$bin/$p" ] || { echo "multigpu-check: $bin/$p is missing (HYLA_BIN_DIR: build/bin and build/tests/test_tp)" >&2; exit 2; }
done
fail=0
has() { case ",$STEPS," in *,"$1",*) return 0 ;; esac; return 1; }
# step NAME SECONDS CMD...: run with a time limit, log into OUTDIR/NAME.txt, say how it ended
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  rc=$?
  case $rc in
    0) echo "$name: ok ($(($(date +%s) - t0)) s)" ;;
    77) echo "$name: SKIP ($(tail -1 "$out/$name.txt"))" ;;
    124) echo "$name: FAIL (no end within $limit s; $out/$name.txt)"; fail=1 ;;
    *) echo "$name: FAIL (exit $rc; $out/$name.txt)"; tail -3 "$out/$name.txt" | sed 's/^/  /'; fail=1 ;;
  esac
}
# bench NAME SECONDS CMD...: the same, the command's standard output (JSON lines) into NAME.jsonl
bench() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.jsonl" 2>"$out/$name.txt"
  rc=$?
  if [ $rc = 0 ]; then
    echo "$name: ok ($(($(date +%s) - t0)) s, $(grep -c '^{' "$out/$name.jsonl") lines)"
  else
    echo "$name: FAIL (exit $rc; $out/$name.txt)"; tail -3 "$out/$name.txt" | sed 's/^/  /'; fail=1
  fi
}

if has tests; then
  step test_tp 300 "$bin/test_tp" cuda
  [ "$ngpu" -ge 4 ] && step test_tp4 300 "$bin/test_tp" cuda4
  step test_e2e_tp_gpu 300 env E2E_TP_DEVICE=cuda:0 bash "$src/tests/e2e/test_e2e_tp.sh"
  step test_e2e_multigpu 300 bash "$src/tests/e2e/test_e2e_multigpu.sh"
fi

if has tp; then
  md=${MODELS_DIR:-/tmp/hyla-mg}
  mkdir -p "$md"
  shape=(--layers 18 --hidden 2304 --head-dim 128 --vocab 32000 --dtype bf16 --heads 18 --intermediate 6144)
  [ -f "$md/gdn/config.json" ] || "$bin/hyla-mkmodel" --arch gdn "${shape[@]}" --out "$md/gdn" >/dev/null
  [ -f "$md/sseh/config.json" ] ||
    "$bin/hyla-mkmodel" --arch sse-h "${shape[@]}" --partitions 4 --topk 1 --kv-heads 18 --out "$md/sseh" >/dev/null
  for m in gdn sseh; do
    for tp in 1 2; do
      bench "e2e-$m-tp$tp" 600 "$bin/hyla-bench" e2e --model "$md/$m" --device cuda:0 --tp "$tp" --prefill 131072 \
        --batch 1,64,256 --ctx 16 --steps 16
    done
    python3 - "$out/e2e-$m-tp1.jsonl" "$out/e2e-$m-tp2.jsonl" "$m" <<'PY' || true
import json, sys
def load(p):
    pre, dec = None, {}
    for l in open(p):
        if not l.startswith('{'): continue
        j = json.loads(l)
        if j.get('bench') == 'e2e_prefill': pre = j['tokens_per_s']
        elif j.get('bench') == 'e2e_decode': dec[j['B']] = j['ms_per_step']
    return pre, dec
(p1, d1), (p2, d2) = load(sys.argv[1]), load(sys.argv[2])
line = sys.argv[3] + ': TP = 2 / one GPU:'
if p1 and p2: line += ' prefill 128k %.2f x (%.0f / %.0f tok/s)' % (p2 / p1, p2, p1)
for b in sorted(d1):
    if b in d2: line += ', B = %d %.2f x (%.3f / %.3f ms)' % (b, d1[b] / d2[b], d2[b], d1[b])
print(line)
PY
  done
fi

if has pipeline; then
  bench pipeline 600 env BENCH_ARCH=gdn BENCH_LAYERS=24 BENCH_HIDDEN=2048 BENCH_SESSIONS=256 BENCH_GRPC=0 \
    BENCH_SNAPSHOT_EVERY=0 bash "$src/deploy/bench-pipeline.sh" 131072 32
fi
exit $fail
