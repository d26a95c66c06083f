#!/usr/bin/env bash
# A sparse-attention hybrid through a real cluster (hyla-coordinator + two hyla-worker processes
# on loopback, CPU backend, the hyla CLI); HYLA_E2E_ARCH picks the model:
#   lalte (default): GDN and LTE layers 1:1; a window of 16 tokens, a sink of 2 and a budget of 6
#                    retained tokens per KV head, so the document evicts, retains and replaces;
#   lansa:           GDN and NSA layers 1:1; blocks of 8 tokens, 4 selected, a window of 16;
#   dla-gdn:         dynamic linear attention over GDN with a capacity of 4 states per head and
#                    a threshold of 1.4 (tokens both merge into the newest state and open one);
#   dla-mamba2:      the same over Mamba2;
#   mamba2:          Mamba2 (SSD) alone: a short-conv tail and an SSM state per layer;
#   statex-mamba2:   StateX over Mamba2: four layers at state 512;
#   statex-gla:      StateX over GLA at width 2048, two layers whose four heads are merged into
#                    one (dk 1024, dv 2048): an 8 MiB state per layer, the size the codec, the
#                    pool and the store tiers must carry without special cases.
# Checks:
#   (a) 64 tokens uninterrupted == 32 + Pause + Resume on the other worker + 32;
#   (m) + Migrate back to the first worker + 32 more == the uninterrupted run;
#   (k) a worker killed (kill -9) after a Pause: the session comes back on the survivor from
#       that Pause and continues like the uninterrupted run.
# The LTE cache and the DLA state cache are fixed-size states and NSA's the paged KV
# (docs/STATE_FORMAT.md), StateX's the largest recurrent states: these check that they travel
# exactly.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
ARCH=${HYLA_E2E_ARCH:-lalte}
e2e_init "$ARCH"

case "$ARCH" in
  lalte) e2e_make_model "$E2E_DIR/model" lalte 4 --window 16 --sink 2 --budget 6 ;;
  lansa) e2e_make_model "$E2E_DIR/model" lansa 4 --window 16 --block-size 8 --block-counts 4 ;;
  dla-gdn | dla-mamba2) e2e_make_model "$E2E_DIR/model" "$ARCH" 4 --dla-capacity 4 --dla-threshold 1.4 ;;
  mamba2 | statex-mamba2) e2e_make_model "$E2E_DIR/model" "$ARCH" 4 ;;
  statex-gla) e2e_make_model "$E2E_DIR/model" statex-gla 2 --hidden 2048 ;;
  *) e2e_fail "unknown HYLA_E2E_ARCH '$ARCH'"; e2e_done ;;
esac
e2e_start_coordinator coordinator --heartbeat-ms 500 --dead-after-ms 5000 || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" --snapshot-every 64 || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" --snapshot-every 64 || e2e_done
H() { e2e_hyla --tenant e2e -q "$@"; }
owner() { H show "$1" | awk '$1 == "workers" { print $2 }'; }

doc="$E2E_DIR/doc.txt"
for i in $(seq 1 6); do echo "Line $i of a document that a hybrid model reads once and partly remembers."; done >"$doc"

# the uninterrupted reference: 200 tokens, seed 9, temperature 0.9
R=$(H create --temperature 0.9 --seed 9) || e2e_fail "create"
H append "$R" "$doc" || e2e_fail "append (reference)"
read -r -a ref <<<"$(H generate "$R" -n 200 --ids --ignore-eos)"
[ "${#ref[@]}" = 200 ] || e2e_fail "reference: expected 200 ids, got ${#ref[@]}"
want() { echo "${ref[@]:$1:$2}"; } # want FROM COUNT
new_session() {
  local s
  s=$(H create --temperature 0.9 --seed 9) && H append "$s" "$doc" && echo "$s"
}

# (a) 64 == 32 + Pause + Resume on the other worker + 32
A=$(new_session) || e2e_fail "(a) session"
a1=$(H generate "$A" -n 32 --ids --ignore-eos)
first=$(owner "$A")
H pause "$A" --evict >/dev/null || e2e_fail "(a) pause"
other=$(e2e_hyla status | awk '$2 == "ready" && $1 ~ /^w/ { print $1 }' | grep -vxF "$first" | head -n 1)
H resume "$A" --on "$other" >/dev/null || e2e_fail "(a) resume on $other"
[ "$(owner "$A")" = "$other" ] || e2e_fail "(a) resumed on $(owner "$A"), asked for $other"
a2=$(H generate "$A" -n 32 --ids --ignore-eos)
e2e_expect_eq "$a1 $a2" "$(want 0 64)" "(a) 64 == 32 + pause + resume on the other worker + 32"

# (m) Migrate back to the first worker, 32 more
H migrate "$A" --to "$first" >/dev/null || e2e_fail "(m) migrate to $first"
[ "$(owner "$A")" = "$first" ] || e2e_fail "(m) migrated to $(owner "$A"), asked for $first"
e2e_expect_eq "$(H generate "$A" -n 32 --ids --ignore-eos)" "$(want 64 32)" "(m) migrate + 32 continues the uninterrupted run"

# (k) kill -9 the owner after a Pause
doc_n=$(stat -c %s "$doc") # byte-level tokenizer: one token per byte
C=$(new_session) || e2e_fail "(k) session"
c1=$(H generate "$C" -n 40 --ids --ignore-eos)
e2e_expect_eq "$c1" "$(want 0 40)" "(k) 40 tokens before the pause"
H pause "$C" >/dev/null || e2e_fail "(k) pause"
paused=$(H show "$C" | awk '$1 == "position" { print $2 }')
victim=$(owner "$C")
e2e_kill "$victim" KILL
e2e_wait_for "$E2E_TIMEOUT" H generate "$C" -n 1 --ids --ignore-eos || e2e_fail "(k) the session did not come back"
[ "$(owner "$C")" != "$victim" ] || e2e_fail "(k) still placed on the killed worker $victim"
pos=$(H show "$C" | awk '$1 == "position" { print $2 }')
[ "$pos" -ge $((paused + 1)) ] || e2e_fail "(k) position $pos after recovery is before the Pause at $paused: committed state lost"
j=$((pos - (doc_n - 1)))
e2e_expect_eq "$(H generate "$C" -n 40 --ids --ignore-eos)" "$(want "$j" 40)" \
  "(k) after kill -9 following a Pause: the continuation from token $j equals the uninterrupted run"
e2e_done
