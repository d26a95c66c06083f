#!/usr/bin/env bash
# test_e2e_storage.sh — storage faults met as a user meets them, with a real coordinator (embedded
# store) and worker on loopback:
#   (a) the store's write-ahead log damaged after an acknowledged Pause (coordinator stopped, the
#       log cut in half, coordinator restarted): the start-up log says what recovery dropped (the
#       damage, and the session and version lost), and
#       Resume answers DATA_LOSS naming the session and its committed version — not NOT_FOUND;
#   (b) the coordinator's data on a small tmpfs (skipped with a message where this process cannot
#       mount one): with the disk filled behind its back, Pause answers RESOURCE_EXHAUSTED naming
#       the store and the space and the session keeps its previous snapshot; DeleteSession still
#       works on the full disk; once the filler is gone, Pause works again without a restart.
# Skips (77) until the binaries exist.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init storage

e2e_make_model "$E2E_DIR/model"
H() { e2e_hyla --tenant st "$@"; }
# feed SESSION: a prompt and 8 generated tokens
feed() {
  echo "The state of a linear-attention layer has a fixed size, whatever the context." | H -q append "$1" - &&
    H -q generate "$1" -n 8 --ids --ignore-eos >/dev/null
}

# ---- (a) a damaged write-ahead log
e2e_start_coordinator coordinator || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" || e2e_done
S=$(H create --seed 3) || e2e_fail "(a) create"
feed "$S" || e2e_fail "(a) append + generate"
e2e_expect_rc 0 "(a) pause --evict" H pause "$S" --evict
ver=$(H show "$S" | awk '$1 == "snapshot" { print $3 }')
e2e_kill coordinator TERM
store="$E2E_DIR/coordinator.data/store"
log=$(find "$store" -maxdepth 1 -name '*.log' | sort | tail -n 1)
[ -n "$log" ] || e2e_fail "(a) no write-ahead log in $store"
size=$(stat -c %s "$log")
truncate -s $((size / 2)) "$log"
e2e_log "cut $log from $size to $((size / 2)) bytes"
e2e_restart_coordinator || e2e_done
e2e_wait_for "$E2E_TIMEOUT" e2e_more_workers 0 || e2e_fail "(a) the worker did not re-register"
grep -q "write-ahead log is damaged" "$E2E_DIR/coordinator.log" ||
  e2e_fail "(a) the coordinator's start-up log does not report the damaged WAL"
ls -d "$store"/wal-damaged-* >/dev/null 2>&1 || e2e_fail "(a) the damaged log was not kept"
grep -q "session $S: its committed snapshot version ${ver:-1} was lost" "$E2E_DIR/coordinator.log" ||
  e2e_fail "(a) the coordinator's start-up log does not name the lost session and version"
e2e_expect_rc 1 "(a) resume of a session whose committed snapshot was lost -> DATA_LOSS (1)" H resume "$S"
grep -q "DATA_LOSS" "$E2E_DIR/last.err" || e2e_fail "(a) resume: not DATA_LOSS: $(head -c 400 "$E2E_DIR/last.err")"
grep -q "session $S" "$E2E_DIR/last.err" && grep -q "version ${ver:-1}" "$E2E_DIR/last.err" ||
  e2e_fail "(a) resume: the message does not name session $S and version ${ver:-?}: $(head -c 400 "$E2E_DIR/last.err")"
e2e_expect_rc 0 "(a) rm of the damaged session" H rm "$S"
e2e_kill w1 TERM
e2e_kill coordinator TERM

# ---- (b) a full disk
mnt="$E2E_DIR/full.data"
mkdir -p "$mnt"
if ! mount -t tmpfs -o size=64m tmpfs "$mnt" 2>"$E2E_DIR/mount.err"; then
  echo "SKIP (b): cannot mount a tmpfs here ($(head -c 200 "$E2E_DIR/mount.err")); test_store_space covers the store"
  e2e_done
fi
trap 'umount -l "$mnt" 2>/dev/null; e2e_cleanup' EXIT
e2e_start_coordinator full --store-reserve-bytes 8388608 --store-reclaim-ms 300 || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" || e2e_done
A=$(H create --seed 4) || e2e_fail "(b) create A"
B=$(H create --seed 5) || e2e_fail "(b) create B"
feed "$A" || e2e_fail "(b) append + generate A"
feed "$B" || e2e_fail "(b) append + generate B"
e2e_expect_rc 0 "(b) pause A" H pause "$A"
e2e_expect_rc 0 "(b) pause B" H pause "$B"
vA=$(H show "$A" | awk '$1 == "snapshot" { print $3 }')
H -q generate "$A" -n 8 --ids --ignore-eos >/dev/null || e2e_fail "(b) generate A again"
# fill the disk behind the coordinator's back
dd if=/dev/zero of="$mnt/ballast" bs=1M >/dev/null 2>&1
e2e_expect_rc 6 "(b) pause on a full disk -> RESOURCE_EXHAUSTED (6)" H pause "$A"
grep -q "RESOURCE_EXHAUSTED" "$E2E_DIR/last.err" && grep -q "out of disk space" "$E2E_DIR/last.err" &&
  grep -q "$mnt/store" "$E2E_DIR/last.err" ||
  e2e_fail "(b) pause on a full disk: $(head -c 500 "$E2E_DIR/last.err")"
[ "$(H show "$A" | awk '$1 == "snapshot" { print $3 }')" = "$vA" ] ||
  e2e_fail "(b) the failed pause changed A's snapshot version"
e2e_expect_rc 0 "(b) delete B on the full disk" H rm "$B"
H ls --ids | grep -qxF "$B" && e2e_fail "(b) B is still listed after rm"
rm -f "$mnt/ballast"
e2e_wait_for 20 H pause "$A" || e2e_fail "(b) pause did not work again once space existed: $(H pause "$A" 2>&1 | head -c 400)"
e2e_expect_rc 0 "(b) generate A after the disk was freed" H generate "$A" -n 4
# The store enters its full state only when RocksDB itself ran out of space (a background flush or
# compaction while the ballast filled the disk); a put refused up front by the space check leaves
# it writable. When it did, giving the reserve up for the delete is logged, and so must be the
# recovery.
if grep -q "disk full: released" "$E2E_DIR/full.log"; then
  grep -q "writes resumed" "$E2E_DIR/full.log" || e2e_fail "(b) the coordinator's log does not say writes resumed"
fi
e2e_expect_rc 0 "(b) rm A" H rm "$A"
e2e_done
