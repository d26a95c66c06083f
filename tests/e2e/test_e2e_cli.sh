#!/usr/bin/env bash
# The hyla CLI against a real cluster (hyla-coordinator + two hyla-worker on loopback, CPU
# backend, tiny sse-h model): the scripting contract; gRPC errors reaching the user (NOT_FOUND,
# PERMISSION_DENIED, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE become the documented exit
# statuses); and the session identities through the CLI —
# 32 tokens == 16 + pause + resume on the other worker + 16 (and `hyla read` gives them back);
# == 16 + migrate + 16; a fork
# continues exactly like its parent; a worker killed mid-generate -> exit 4 with the delivered
# count, and generate continues once the session is re-placed; the coordinator restarted keeps
# the sessions; no worker left -> exit 4. Skips (77) until the binaries exist.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init cli

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" || e2e_done
H() { e2e_hyla --tenant cli "$@"; }

doc="$E2E_DIR/doc.txt"
for i in $(seq 1 25); do echo "Paragraph $i: the state of a linear-attention layer has a fixed size."; done >"$doc"

# create prints the id alone
S=$(H create --seed 5) || e2e_fail "create failed"
[[ "$S" =~ ^s-[0-9a-f]{16}$ ]] || e2e_fail "create printed '$S'"
e2e_expect_rc 0 "append a file" H append "$S" "$doc"
[ -s "$E2E_DIR/last.out" ] && e2e_fail "append wrote to stdout"
grep -q "appended" "$E2E_DIR/last.err" || e2e_fail "append printed no summary"
e2e_expect_rc 0 "append stdin" H append "$S" - <"$doc"

# identities: a reference session, then pause/resume, migrate and fork variants of the same document
ref=$(H create --seed 5)
H -q append "$ref" "$doc" && H -q append "$ref" - <"$doc"
full=$(H -q generate "$ref" -n 32 --ids --ignore-eos) || e2e_fail "generate (reference)"
[ "$(echo "$full" | wc -w)" = 32 ] || e2e_fail "expected 32 ids, got: $full"

a=$(H -q generate "$S" -n 16 --ids --ignore-eos)
placed=$(H show "$S" | awk '$1 == "workers" { print $2 }')
other=$(e2e_hyla status | awk '$2 == "ready" { print $1 }' | grep -vxF "$placed" | head -n 1)
e2e_expect_rc 0 "pause --evict" H pause "$S" --evict
grep -q "snapshot version" "$E2E_DIR/last.out" || e2e_fail "pause printed no version"
H show "$S" | grep -q "^state *paused" || e2e_fail "show does not say paused after pause --evict"
e2e_expect_rc 0 "resume --on $other (was on $placed)" H resume "$S" --on "$other"
grep -q "(workers $other)" "$E2E_DIR/last.out" || e2e_fail "resume did not place on $other: $(cat "$E2E_DIR/last.out")"
b=$(H -q generate "$S" -n 16 --ids --ignore-eos)
e2e_expect_eq "$a $b" "$full" "32 tokens == 16 + pause + resume on the other worker + 16"
# read: the session's token log, carried through the evicting pause and the resume
e2e_expect_eq "$(H -q read "$S" --ids)" "$full" "read --ids gives the 32 generated tokens"
e2e_expect_eq "$(H -q read "$S" --from 20 -n 4 --ids)" "$(echo "$full" | cut -d' ' -f21-24)" "read --from 20 -n 4"
e2e_expect_rc 0 "read past the generated tokens" H read "$S" --from 32
[ -s "$E2E_DIR/last.out" ] && e2e_fail "read --from 32 printed tokens"
grep -q "of 32 generated" "$E2E_DIR/last.err" || e2e_fail "read does not report the generated count: $(cat "$E2E_DIR/last.err")"
e2e_expect_rc 5 "read of another tenant's session -> PERMISSION_DENIED (5)" e2e_hyla --tenant intruder read "$S"
# a worker hint that names no worker is refused by every call that takes one, resident or not
e2e_expect_rc 3 "resume --on a worker that does not exist -> NOT_FOUND (3)" H resume "$S" --on nope
grep -q "worker 'nope' not found" "$E2E_DIR/last.err" || e2e_fail "resume --on nope: $(cat "$E2E_DIR/last.err")"
e2e_expect_rc 3 "fork --on a worker that does not exist -> NOT_FOUND (3)" H fork "$S" --on nope
# paused but still resident (no --evict), resumed with a hint naming the other worker: it moves there
e2e_expect_rc 0 "pause (resident)" H pause "$S"
e2e_expect_rc 0 "resume --on $placed of a resident session (on $other)" H resume "$S" --on "$placed"
grep -q "(workers $placed)" "$E2E_DIR/last.out" || e2e_fail "resume --on $placed left it: $(cat "$E2E_DIR/last.out")"
e2e_expect_eq "$(H -q read "$S" --ids)" "$full" "the moved session keeps its 32 generated tokens"

M=$(H create --seed 5)
H -q append "$M" "$doc" && H -q append "$M" - <"$doc"
a=$(H -q generate "$M" -n 16 --ids --ignore-eos)
e2e_expect_rc 0 "migrate (any other worker)" H migrate "$M"
b=$(H -q generate "$M" -n 16 --ids --ignore-eos)
e2e_expect_eq "$a $b" "$full" "32 tokens == 16 + migrate + 16"

P=$(H create --seed 5)
H -q append "$P" "$doc" && H -q append "$P" - <"$doc"
F=$(H fork "$P") || e2e_fail "fork failed"
[[ "$F" =~ ^s-[0-9a-f]{16}$ ]] || e2e_fail "fork printed '$F'"
pa=$(H -q generate "$P" -n 32 --ids --ignore-eos)
fa=$(H -q generate "$F" -n 32 --ids --ignore-eos)
e2e_expect_eq "$fa" "$pa" "a fork continues like its parent (same RNG stream)"
e2e_expect_eq "$pa" "$full" "the parent continues like the reference"

# gRPC errors, as the documented exit statuses
e2e_expect_rc 3 "unknown session -> NOT_FOUND (3)" H show s-ffffffffffffffff
e2e_expect_rc 5 "another tenant's session -> PERMISSION_DENIED (5)" e2e_hyla --tenant intruder show "$S"
e2e_expect_rc 6 "max_tokens over the server's limit -> INVALID_ARGUMENT (6)" H generate "$S" -n 4294967295
grep -q "max_tokens" "$E2E_DIR/last.err" || e2e_fail "the INVALID_ARGUMENT message does not name max_tokens"
rc=0
H create --model no-such-model >/dev/null 2>"$E2E_DIR/last.err" || rc=$?
[ "$rc" = 3 ] || [ "$rc" = 6 ] || e2e_fail "create --model no-such-model: exit $rc, want 3 or 6"
# a message over a server's size limit: a second coordinator with a 4 KiB limit, and the CLI's
# first 64 KiB Append chunk
main_server=$E2E_SERVER
e2e_start_coordinator small --max-message-bytes 4096 || e2e_done
head -c 100000 /dev/zero | tr '\0' x >"$E2E_DIR/big.txt"
e2e_expect_rc 6 "a message over the limit -> RESOURCE_EXHAUSTED (6)" e2e_hyla append s-0000000000000001 "$E2E_DIR/big.txt"
grep -q "RESOURCE_EXHAUSTED" "$E2E_DIR/last.err" || e2e_fail "no RESOURCE_EXHAUSTED in: $(head -c 300 "$E2E_DIR/last.err")"
e2e_kill small TERM
E2E_SERVER=$main_server

# listing, status
H ls --ids | grep -qxF "$S" || e2e_fail "ls --ids does not list $S"
e2e_hyla status | grep -q "^sessions: " || e2e_fail "status printed no tier counts"

# the owning worker killed during generate: exit 4 and the delivered count on stderr; once the
# coordinator has re-placed the session (after --dead-after-ms), generate again continues
K=$(H create --seed 5)
H -q append "$K" "$doc"
owner=$(H show "$K" | awk '$1 == "workers" { print $2 }')
H generate "$K" -n 60000 --ids --ignore-eos >"$E2E_DIR/gen.out" 2>"$E2E_DIR/gen.err" &
gpid=$!
e2e_wait_for 30 test -s "$E2E_DIR/gen.out" || e2e_fail "generate streamed no token within 30 s"
sleep 0.5
e2e_kill "$owner" KILL
rc=0
wait "$gpid" || rc=$?
[ "$rc" = 4 ] || e2e_fail "generate with its worker killed: exit $rc, want 4; $(head -c 300 "$E2E_DIR/gen.err")"
grep -q "token(s) were delivered before the failure" "$E2E_DIR/gen.err" ||
  e2e_fail "no delivered count in: $(head -c 300 "$E2E_DIR/gen.err")"
e2e_wait_for "$E2E_TIMEOUT" H -q generate "$K" -n 4 --ids || e2e_fail "generate did not continue after the worker died"
e2e_start_worker "$owner" "$E2E_DIR/model" || e2e_done

# the coordinator restarted: the sessions are still listed and generate continues
e2e_kill coordinator TERM
e2e_restart_coordinator || e2e_done
e2e_wait_for "$E2E_TIMEOUT" e2e_more_workers 1 || e2e_fail "the workers did not re-register"
H ls --ids | grep -qxF "$S" || e2e_fail "after a coordinator restart, ls does not list $S"
e2e_expect_rc 0 "generate after a coordinator restart" H generate "$S" -n 4

# no worker left: UNAVAILABLE (4)
e2e_kill w1 KILL
e2e_kill w2 KILL
e2e_expect_rc 4 "generate with no worker left -> UNAVAILABLE (4)" H generate "$S" -n 4

e2e_expect_rc 0 "rm" H rm "$S" "$ref" "$M" "$P" "$F" "$K"
e2e_done
