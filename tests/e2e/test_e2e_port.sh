#!/usr/bin/env bash
# A session moves between two independent clusters as a portable snapshot file (ExportSession /
# ImportSession through `hyla export` / `hyla import`): cluster A and cluster B each have their
# own hyla-coordinator (own data directory, store and port) and one CPU hyla-worker with the same
# tiny sse-h model. Sampling is on (temperature, top-k, seed), so the RNG state travels too.
#   - a session created, fed and generated from in A, exported while active (the export commits
#     its current state; A keeps it active), imported into B under the same id: generating N
#     more in A and in B gives identical tokens, equal to an uninterrupted twin's in A;
#   - the same file imported again under another id (a fork across clusters) continues the same
#     way; the exported session's id is now taken in B (ALREADY_EXISTS, exit 6);
#   - a paused session exports its head without committing a new version;
#   - export --version V writes a kept version; importing it rewinds to V's position;
#   - a damaged file (a flipped byte, a truncated file, a bad magic) is refused DATA_LOSS
#     (exit 1) naming why, and leaves nothing behind: the id it asked for stays free and takes
#     the good file afterwards; a file of another model (hyla-run on a different config) is
#     refused FAILED_PRECONDITION (exit 6) naming the fingerprints; a file over B's
#     --max-import-bytes is refused RESOURCE_EXHAUSTED (exit 6) naming the limit;
#   - exporting an unknown session is NOT_FOUND (exit 3), another tenant's PERMISSION_DENIED (5).
# Skips (77) until the binaries exist.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init port hyla hyla-coordinator hyla-worker hyla-mkmodel hyla-run

N=12
e2e_make_model "$E2E_DIR/model"
doc="$E2E_DIR/doc.txt"
for i in $(seq 1 10); do echo "Line $i: a session's state is small enough to carry to another cluster."; done >"$doc"

# cluster A
e2e_start_coordinator ca || e2e_done
A_SERVER=$E2E_SERVER
e2e_start_worker wa "$E2E_DIR/model" || e2e_done
HA() { "$E2E_BIN/hyla" --server "$A_SERVER" --tenant port "$@"; }

S=$(HA create --temperature 0.9 --top-k 20 --seed 7) || e2e_fail "create in A"
T=$(HA create --temperature 0.9 --top-k 20 --seed 7) || e2e_fail "create the twin in A"
HA -q append "$S" "$doc" || e2e_fail "append in A"
HA -q append "$T" "$doc" || e2e_fail "append to the twin"
first=$(HA -q generate "$S" -n 5 --ids --ignore-eos) || e2e_fail "generate before the export"
twin=$(HA -q generate "$T" -n $((5 + N)) --ids --ignore-eos) || e2e_fail "generate on the twin"
e2e_expect_eq "$first" "$(echo "$twin" | cut -d' ' -f1-5)" "the twin generates as the session did"

# export while active: the export commits the current state and the session stays active
F=$E2E_DIR/s.hys
e2e_expect_rc 0 "export from A" HA export "$S" "$F"
grep -q "exported $S (model .*) version [0-9]* at position" "$E2E_DIR/last.err" ||
  e2e_fail "export printed: $(cat "$E2E_DIR/last.err")"
[ -s "$F" ] || e2e_fail "export wrote no file"
ls "$E2E_DIR"/s.hys.tmp.* >/dev/null 2>&1 && e2e_fail "export left its temporary file behind"
[ "$(head -c 8 "$F")" = HYLASNAP ] || e2e_fail "the export is not a portable snapshot file"
e2e_expect_rc 1 "export into a directory that does not exist" HA export "$S" "$E2E_DIR/no/such/dir/s.hys"
grep -q "cannot write $E2E_DIR/no/such/dir/s.hys" "$E2E_DIR/last.err" ||
  e2e_fail "the export's refusal does not name the file: $(cat "$E2E_DIR/last.err")"
HA show "$S" | grep -q "^state *active" || e2e_fail "export changed the session's state: $(HA show "$S")"
pos_a=$(HA show "$S" | awk '$1 == "position" { print $2 }')
afterA=$(HA -q generate "$S" -n $N --ids --ignore-eos) || e2e_fail "generate in A after the export"
e2e_expect_eq "$afterA" "$(echo "$twin" | cut -d' ' -f6-)" "A after the export == the uninterrupted twin"

# cluster B: its own coordinator (data dir, store, port) and worker; the import limit sits just
# above the file's size so that a larger file is refused
size=$(stat -c %s "$F")
e2e_start_coordinator cb --max-import-bytes $((size + 4096)) || e2e_done
B_SERVER=$E2E_SERVER
[ "$A_SERVER" != "$B_SERVER" ] || e2e_fail "the clusters share an address"
e2e_start_worker wb "$E2E_DIR/model" || e2e_done
HB() { "$E2E_BIN/hyla" --server "$B_SERVER" --tenant port "$@"; }

e2e_expect_rc 0 "import into B under the same id" HB import "$F" --as "$S"
e2e_expect_eq "$(cat "$E2E_DIR/last.out")" "$S" "import prints the new session's id"
HB show "$S" | grep -q "^tenant *port" || e2e_fail "the imported session's tenant: $(HB show "$S")"
e2e_expect_eq "$(HB show "$S" | awk '$1 == "position" { print $2 }')" "$pos_a" "the import is at the export's position"
afterB=$(HB -q generate "$S" -n $N --ids --ignore-eos) || e2e_fail "generate in B after the import"
e2e_expect_eq "$afterB" "$afterA" "B after the import == A after the export"

# the same file again: the id is taken; under another id it is a fork across clusters
e2e_expect_rc 6 "import under a taken id" HB import "$F" --as "$S"
grep -q ALREADY_EXISTS "$E2E_DIR/last.err" || e2e_fail "taken id: $(cat "$E2E_DIR/last.err")"
G=$(HB import "$F") || e2e_fail "import under a new id"
[ -n "$G" ] && [ "$G" != "$S" ] || e2e_fail "import without --as gave '$G'"
afterG=$(HB -q generate "$G" -n $N --ids --ignore-eos) || e2e_fail "generate on the second import"
e2e_expect_eq "$afterG" "$afterA" "a second import continues the same way"
e2e_expect_eq "$(HB -q generate "$S" -n 3 --ids --ignore-eos)" "$(HA -q generate "$S" -n 3 --ids --ignore-eos)" \
  "A and B stay in step"

# a paused session still resident exports its head (no new version) and continues the same way
HA -q pause "$S" >/dev/null || e2e_fail "pause in A"
headv() { HA snapshots "$S" | awk '$1 ~ /\*$/ { print $1 }' | tr -d '*'; }
h0=$(headv)
e2e_expect_rc 0 "export of a paused session" HA export "$S" "$E2E_DIR/paused.hys"
grep -q "version $h0 at position" "$E2E_DIR/last.err" || e2e_fail "paused export: $(cat "$E2E_DIR/last.err")"
e2e_expect_eq "$(headv)" "$h0" "exporting a paused session commits no new version"
P=$(HB import "$E2E_DIR/paused.hys") || e2e_fail "import of the paused export"
e2e_expect_eq "$(HB -q generate "$P" -n 4 --ids --ignore-eos)" "$(HA -q generate "$S" -n 4 --ids --ignore-eos)" \
  "the paused export continues as A does"

# export a kept version: the import starts at that version's position (B's version 1 is the import)
FV=$E2E_DIR/v1.hys
e2e_expect_rc 0 "export --version 1 from B" HB export "$S" "$FV" --version 1
R=$(HB import "$FV") || e2e_fail "import of version 1"
e2e_expect_eq "$(HB show "$R" | awk '$1 == "position" { print $2 }')" "$pos_a" "version 1's file is at its position"
e2e_expect_eq "$(HB -q generate "$R" -n $N --ids --ignore-eos)" "$afterA" "version 1's file continues as the export did"
e2e_expect_rc 0 "export to stdout" sh -c "'$E2E_BIN/hyla' --server '$B_SERVER' --tenant port -q export '$S' - >'$E2E_DIR/out.hys'"
[ "$(head -c 8 "$E2E_DIR/out.hys")" = HYLASNAP ] || e2e_fail "export - wrote no file to stdout"

# refusals that leave nothing behind
n_before=$(HB ls --ids | wc -l)
damaged() { # WHAT FILE WANT_TEXT: refused DATA_LOSS naming WANT_TEXT; the id stays free
  e2e_expect_rc 1 "import of $1" HB import "$2" --as s-damaged
  grep -q DATA_LOSS "$E2E_DIR/last.err" || e2e_fail "$1: $(cat "$E2E_DIR/last.err")"
  grep -qi "$3" "$E2E_DIR/last.err" || e2e_fail "$1 does not say '$3': $(cat "$E2E_DIR/last.err")"
  e2e_log "refused: $(head -c 300 "$E2E_DIR/last.err")"
  e2e_expect_rc 3 "no session left by $1" HB show s-damaged
}
cp "$F" "$E2E_DIR/flip.hys"
off=$((size / 2))
byte=$(od -An -tu1 -j "$off" -N1 "$F" | tr -d ' ')
printf "$(printf '\\%03o' $(((byte + 1) % 256)))" | dd of="$E2E_DIR/flip.hys" bs=1 seek="$off" conv=notrunc status=none
cmp -s "$F" "$E2E_DIR/flip.hys" && e2e_fail "the byte flip changed nothing"
damaged "a flipped byte" "$E2E_DIR/flip.hys" "checksum"
head -c $((size - 100)) "$F" >"$E2E_DIR/trunc.hys"
damaged "a truncated file" "$E2E_DIR/trunc.hys" "trunc"
{ printf 'XYLASNAP'; tail -c +9 "$F"; } >"$E2E_DIR/magic.hys"
damaged "a bad magic" "$E2E_DIR/magic.hys" "not a hyla snapshot file"
e2e_expect_eq "$(HB ls --ids | wc -l)" "$n_before" "refused imports left no session"
e2e_expect_rc 0 "the refused id takes the good file" HB import "$F" --as s-damaged
e2e_expect_eq "$(HB -q generate s-damaged -n $N --ids --ignore-eos)" "$afterA" "the good file after refusals"

# another model's file: FAILED_PRECONDITION naming the fingerprints
e2e_make_model "$E2E_DIR/other" gla 2
"$E2E_BIN/hyla-run" --model "$E2E_DIR/other" --prompt "Another model." --max-tokens 2 --save-state "$E2E_DIR/other.hys" \
  --quiet >/dev/null 2>&1 || e2e_fail "hyla-run could not write another model's snapshot"
e2e_expect_rc 6 "import of another model's file" HB import "$E2E_DIR/other.hys" --as s-other
grep -q FAILED_PRECONDITION "$E2E_DIR/last.err" || e2e_fail "another model: $(cat "$E2E_DIR/last.err")"
grep -q "another model (fingerprint" "$E2E_DIR/last.err" || e2e_fail "another model's message: $(cat "$E2E_DIR/last.err")"
e2e_log "refused: $(head -c 300 "$E2E_DIR/last.err")"
e2e_expect_rc 3 "no session left by another model's file" HB show s-other

# over the import limit: RESOURCE_EXHAUSTED naming it
{ cat "$F"; head -c 8192 /dev/zero; } >"$E2E_DIR/big.hys"
e2e_expect_rc 6 "import over --max-import-bytes" HB import "$E2E_DIR/big.hys" --as s-big
grep -q "RESOURCE_EXHAUSTED.*--max-import-bytes" "$E2E_DIR/last.err" || e2e_fail "over the limit: $(cat "$E2E_DIR/last.err")"
e2e_expect_rc 3 "no session left by an oversized file" HB show s-big

# export refusals
e2e_expect_rc 3 "export of an unknown session" HB export s-00000000deadbeef "$E2E_DIR/x.hys"
e2e_expect_rc 5 "export of another tenant's session" "$E2E_BIN/hyla" --server "$B_SERVER" --tenant other export "$S" \
  "$E2E_DIR/x.hys"
[ -e "$E2E_DIR/x.hys" ] && e2e_fail "a refused export wrote a file"
e2e_expect_rc 3 "export of a version not kept" HB export "$S" "$E2E_DIR/x.hys" --version 99

e2e_done
