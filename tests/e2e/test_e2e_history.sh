#!/usr/bin/env bash
# Session history through the API (hyla CLI against hyla-coordinator --keep-versions 3 and one
# CPU hyla-worker with the tiny sse-h model, sampling on so the RNG state matters too):
# `hyla snapshots` lists the kept versions (version, position, head); `hyla resume --version V`
# rewinds a session so that generating again equals what it generated after V the first time;
# `hyla fork --version V` gives a new session that continues the same way and leaves the parent
# alone; an unkept version is NOT_FOUND (exit 3) naming the kept range; fork --version with
# --seed is refused (exit 6); retention keeps the last 3 versions. Skips (77) until the binaries
# exist.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init history

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator coordinator --keep-versions 3 || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" || e2e_done
H() { e2e_hyla --tenant hist "$@"; }
# ver_at N: the version column of the snapshots list's row N (1-based, header skipped)
rows() { H snapshots "$1" | tail -n +2; }

doc="$E2E_DIR/doc.txt"
for i in $(seq 1 12); do echo "Line $i: a recurrent state keeps the whole history in a fixed size."; done >"$doc"

S=$(H create --temperature 0.9 --top-k 20 --seed 7) || e2e_fail "create failed"
e2e_expect_eq "$(rows "$S" | wc -l)" 0 "a new session lists no snapshot"
H -q append "$S" "$doc" || e2e_fail "append"
H -q pause "$S" || e2e_fail "pause 1"
v1=$(rows "$S" | tail -n 1 | awk '{ print $1 }' | tr -d '*')
p1=$(rows "$S" | tail -n 1 | awk '{ print $2 }')
[ -n "$v1" ] && [ "$v1" -ge 1 ] || e2e_fail "no version listed after a pause: $(H snapshots "$S")"
after1=$(H -q generate "$S" -n 16 --ids --ignore-eos) || e2e_fail "generate after v$v1"
H -q pause "$S" || e2e_fail "pause 2"
v2=$(rows "$S" | tail -n 1 | awk '{ print $1 }')
e2e_expect_eq "$v2" "$((v1 + 1))*" "the second pause is the next version, marked head"
e2e_expect_eq "$(rows "$S" | awk -v v="$v1" '$1 == v { print $2 }')" "$p1" "version $v1 keeps its position"
more=$(H -q generate "$S" -n 8 --ids --ignore-eos) || e2e_fail "generate after v$v2"

# fork from v1: a new session continuing as S did after v1; S is not touched
F=$(H fork "$S" --version "$v1") || e2e_fail "fork --version $v1"
fa=$(H -q generate "$F" -n 16 --ids --ignore-eos) || e2e_fail "generate on the fork"
e2e_expect_eq "$fa" "$after1" "fork --version $v1 continues as the parent did after $v1"
H show "$F" | grep -q "^parent *$S" || e2e_fail "the fork does not name its parent: $(H show "$F")"
H show "$F" | grep -q "^snapshot *version 1 at position $p1," ||
  e2e_fail "the fork's committed snapshot is not version 1 at position $p1: $(H show "$F")"

# rewind S to v1: generating again repeats what it generated after v1
e2e_expect_rc 0 "resume --version $v1" H resume "$S" --version "$v1"
grep -q "rewound" "$E2E_DIR/last.out" || e2e_fail "resume --version printed: $(cat "$E2E_DIR/last.out")"
pos=$(H show "$S" | awk '$1 == "position" { print $2 }')
e2e_expect_eq "$pos" "$p1" "rewound session is at version $v1's position"
again=$(H -q generate "$S" -n 16 --ids --ignore-eos) || e2e_fail "generate after the rewind"
e2e_expect_eq "$again" "$after1" "rewind to $v1 then generate == the continuation from $v1"
head=$(rows "$S" | awk '$1 ~ /\*$/ { print $2 }')
e2e_expect_eq "$head" "$p1" "the rewind committed a head at version $v1's position"
[ -n "$more" ] || e2e_fail "no tokens after v$v2"

# refusals
e2e_expect_rc 3 "resume --version 999 (not kept)" H resume "$S" --version 999
grep -q "keeps no version 999" "$E2E_DIR/last.err" || e2e_fail "unkept version message: $(cat "$E2E_DIR/last.err")"
e2e_expect_rc 6 "fork --version with --seed" H fork "$S" --version "$v1" --seed 3
e2e_expect_rc 2 "resume --version 0 (usage)" H resume "$S" --version 0
e2e_expect_rc 3 "snapshots of an unknown session" H snapshots s-00000000deadbeef
e2e_expect_rc 5 "snapshots of another tenant's session" e2e_hyla --tenant other snapshots "$S"

# retention: --keep-versions 3 keeps the last three versions
for i in 1 2 3 4; do
  H -q generate "$S" -n 2 --ids --ignore-eos >/dev/null || e2e_fail "generate $i"
  H -q pause "$S" || e2e_fail "pause $i"
done
e2e_expect_eq "$(rows "$S" | wc -l)" 3 "retention keeps 3 versions"
first=$(rows "$S" | head -n 1 | awk '{ print $1 }')
last=$(rows "$S" | tail -n 1 | awk '{ print $1 }' | tr -d '*')
e2e_expect_eq "$first" "$((last - 2))" "the kept versions are the last three"
e2e_expect_rc 3 "resume --version $v1 after retention dropped it" H resume "$S" --version "$v1"

e2e_done
