#!/usr/bin/env bash
# Operating a cluster (hyla-coordinator + hyla-worker on loopback, CPU backend, tiny model):
#   metrics: both binaries started with --metrics serve GET /metrics in the Prometheus text
#       format (curl); after a create / append / generate / pause, the coordinator's request
#       counter for CreateSession{code="OK"}, the worker's prefill and decode token counters,
#       its snapshot put histogram and the coordinator's committed-snapshot counter have moved;
#       sessions by tier and workers by state are reported; the store's GC counters (versions
#       dropped by retention, chunks and bytes deleted, reclaim passes) move after pauses and a
#       delete;
#   health: grpc.health.v1.Health/Check (Python grpcio where present, raw bytes) answers SERVING
#       on both; /healthz and /readyz answer 200;
#   draining: a worker held in draining (its store is unreachable) answers /readyz 503,
#       hyla_ready 0 and Check NOT_SERVING;
#   logs: --log-format json writes one JSON object per line.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init ops
command -v curl >/dev/null || e2e_skip "curl is not installed"

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator coordinator --heartbeat-ms 200 --dead-after-ms 2000 --log-format json --store-reclaim-ms 200 \
  --metrics 127.0.0.1:0 --metrics-port-file "$E2E_DIR/coord.mport" || e2e_done
e2e_wait_for 10 test -s "$E2E_DIR/coord.mport" || e2e_fail "coordinator wrote no metrics port file"
CM=127.0.0.1:$(cat "$E2E_DIR/coord.mport")
e2e_start_worker w1 "$E2E_DIR/model" --log-format json --metrics 127.0.0.1:0 \
  --metrics-port-file "$E2E_DIR/w1.mport" || e2e_done
e2e_wait_for 10 test -s "$E2E_DIR/w1.mport" || e2e_fail "w1 wrote no metrics port file"
WM=127.0.0.1:$(cat "$E2E_DIR/w1.mport")
H() { e2e_hyla --tenant e2e "$@"; }

# metric NAME{LABELS} at ADDR: its value ("" when absent); the series is matched exactly
metric() { curl -sf "http://$1/metrics" | awk -v s="$2" 'index($0, s " ") == 1 { print $NF }'; }
gt() { awk -v a="${1:-0}" -v b="$2" 'BEGIN { exit !(a + 0 > b + 0) }'; }

# the exposition text: content type, HELP and TYPE before each family's samples
ctype=$(curl -sf -o /dev/null -w '%{content_type}' "http://$CM/metrics")
e2e_expect_eq "$ctype" "text/plain; version=0.0.4; charset=utf-8" "coordinator /metrics content type"
curl -sf "http://$CM/metrics" >"$E2E_DIR/coord0.txt" || e2e_fail "scrape coordinator"
curl -sf "http://$WM/metrics" >"$E2E_DIR/w0.txt" || e2e_fail "scrape w1"
for f in coord0 w0; do
  awk '/^# TYPE / { t[$3] = 1; next } /^#/ { next } NF { n = $1; sub(/\{.*/, "", n); b = n; sub(/_(bucket|sum|count)$/, "", b)
       if (!(n in t) && !(b in t)) { print "sample before its TYPE: " $0; bad = 1 } } END { exit bad }' "$E2E_DIR/$f.txt" ||
    e2e_fail "$f: malformed exposition"
done
e2e_expect_eq "$(metric "$CM" 'hyla_coord_workers{state="WORKER_READY"}')" 1 "coordinator: one ready worker"
gt "$(metric "$CM" 'hyla_coord_disk_bytes{dir="store"}')" 0 || e2e_fail "coordinator: store disk usage missing"
e2e_expect_eq "$(metric "$WM" hyla_ready)" 1 "w1 ready gauge"
created0=$(metric "$CM" 'hyla_grpc_requests_total{method="/hyla.v1.Sessions/CreateSession",code="OK"}')

S=$(H -q create) || e2e_fail "create"
echo "the metrics of a small cluster, scraped before and after some work" | H -q append "$S" - || e2e_fail "append"
H -q generate "$S" -n 8 --ids --ignore-eos >/dev/null || e2e_fail "generate"
H pause "$S" >/dev/null || e2e_fail "pause"

created=$(metric "$CM" 'hyla_grpc_requests_total{method="/hyla.v1.Sessions/CreateSession",code="OK"}')
gt "$created" "${created0:-0}" || e2e_fail "coordinator: CreateSession OK count did not move ($created0 -> $created)"
gt "$(metric "$CM" 'hyla_grpc_request_duration_seconds_count{method="/hyla.v1.Sessions/CreateSession"}')" 0 ||
  e2e_fail "coordinator: no CreateSession latency observed"
gt "$(metric "$CM" hyla_store_snapshots_committed_total)" 0 || e2e_fail "coordinator: no committed snapshot counted"
gt "$(metric "$CM" hyla_store_versions)" 0 || e2e_fail "coordinator: store versions gauge"
pre=$(metric "$WM" 'hyla_worker_tokens_total{phase="prefill"}')
dec=$(metric "$WM" 'hyla_worker_tokens_total{phase="decode"}')
gt "$pre" 0 || e2e_fail "w1: prefill tokens did not move ($pre)"
gt "$dec" 7 || e2e_fail "w1: decode tokens: $dec, want at least 8"
gt "$(metric "$WM" 'hyla_worker_compute_seconds_total{phase="decode"}')" 0 || e2e_fail "w1: decode seconds"
gt "$(metric "$WM" 'hyla_worker_snapshot_seconds_count{op="put"}')" 0 || e2e_fail "w1: no snapshot put observed"
gt "$(metric "$WM" 'hyla_worker_snapshot_bytes_total{op="put"}')" 0 || e2e_fail "w1: no snapshot bytes"
gt "$(metric "$WM" 'hyla_grpc_requests_total{method="/hyla.v1.Worker/Generate",code="OK"}')" 0 ||
  e2e_fail "w1: Generate OK count"
[ -n "$(metric "$WM" 'hyla_worker_sessions{tier="gpu"}')" ] || e2e_fail "w1: sessions by tier missing"
# the runtime's scratch: activations after the prefill, logits for the decode batch only
gt "$(metric "$WM" 'hyla_worker_scratch_bytes{kind="activations"}')" 0 || e2e_fail "w1: no activation scratch reported"
gt "$(metric "$WM" 'hyla_worker_scratch_bytes{kind="logits"}')" 0 || e2e_fail "w1: no logits scratch after decoding"
[ -n "$(metric "$CM" 'hyla_coord_sessions{state="SESSION_PAUSED",tier="TIER_UNSPECIFIED"}')" ] ||
  e2e_fail "coordinator: sessions by state and tier missing"
[ "$E2E_FAILED" = 0 ] && e2e_log "ok: metric values moved after requests (prefill $pre, decode $dec tokens)"

# store GC: retention (the default --keep-versions 2) drops versions as pauses add them; a
# deleted session's chunks are garbage, and a reclaim pass (--store-reclaim-ms 200) follows
for i in 1 2; do
  H -q generate "$S" -n 2 --ids --ignore-eos >/dev/null || e2e_fail "generate $i"
  H pause "$S" >/dev/null || e2e_fail "pause $i"
done
gt "$(metric "$CM" hyla_store_versions_dropped_total)" 0 || e2e_fail "coordinator: no version dropped by retention"
GC=$(H -q create) || e2e_fail "create for GC"
echo "a session whose snapshots are deleted" | H -q append "$GC" - || e2e_fail "append for GC"
H pause "$GC" >/dev/null || e2e_fail "pause for GC"
H -q rm "$GC" || e2e_fail "rm for GC"
gt "$(metric "$CM" hyla_store_gc_reclaimed_bytes_total)" 0 || e2e_fail "coordinator: deleted chunks' bytes not counted"
gt "$(metric "$CM" hyla_store_gc_chunks_deleted_total)" 0 || e2e_fail "coordinator: deleted chunks not counted"
e2e_wait_for 10 sh -c "curl -sf 'http://$CM/metrics' | grep -q '^hyla_store_gc_runs_total [1-9]'" ||
  e2e_fail "coordinator: no reclaim pass counted after a delete"
[ "$E2E_FAILED" = 0 ] && e2e_log "ok: store GC counters moved"

# probes
for a in "$CM" "$WM"; do
  e2e_expect_eq "$(curl -s -o /dev/null -w '%{http_code}' "http://$a/healthz")" 200 "$a /healthz"
  e2e_expect_eq "$(curl -s -o /dev/null -w '%{http_code}' "http://$a/readyz")" 200 "$a /readyz"
done
e2e_expect_eq "$(curl -s -o /dev/null -w '%{http_code}' "http://$CM/nothing")" 404 "unknown path"

# health_check ADDR [SERVICE]: prints SERVING / NOT_SERVING / the error code (Python grpcio)
PY=$(e2e_python) || PY=
health_check() {
  "$PY" - "$1" "${2:-}" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b, response_deserializer=lambda b: b)
name = sys.argv[2].encode()
req = (b"\x0a" + bytes([len(name)]) + name) if name else b""   # HealthCheckRequest{service}
try:
    resp = check(req, timeout=5)
except grpc.RpcError as e:
    print(e.code().name); sys.exit(0)
status = resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0  # HealthCheckResponse{status}
print({0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING"}.get(status, "?"))
PY
}
WG=$(awk '/listening on port/ { print $NF }' "$E2E_DIR/w1.log" | tail -1)
if [ -n "$PY" ]; then
  e2e_expect_eq "$(health_check "$E2E_SERVER")" SERVING "coordinator health"
  e2e_expect_eq "$(health_check "$E2E_SERVER" hyla.v1.Sessions)" SERVING "coordinator health of hyla.v1.Sessions"
  e2e_expect_eq "$(health_check "$E2E_SERVER" no.such.Service)" NOT_FOUND "health of an unknown service"
  e2e_expect_eq "$(health_check "127.0.0.1:$WG")" SERVING "w1 health"
else
  echo "SKIP (part): no python3 with grpcio: the grpc.health.v1 checks did not run"
fi

# draining: w2's store is unreachable, so its session cannot leave and it stays draining
nostore=$(e2e_free_port) || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" --store "127.0.0.1:$nostore" --metrics 127.0.0.1:0 \
  --metrics-port-file "$E2E_DIR/w2.mport" || e2e_done
e2e_wait_for 10 test -s "$E2E_DIR/w2.mport" || e2e_fail "w2 wrote no metrics port file"
W2M=127.0.0.1:$(cat "$E2E_DIR/w2.mport")
S2=$(H -q create --on w2) || e2e_fail "create on w2"
echo "held on a worker that cannot snapshot" | H -q append "$S2" - || e2e_fail "append on w2"
e2e_expect_eq "$(curl -s -o /dev/null -w '%{http_code}' "http://$W2M/readyz")" 200 "w2 /readyz before the drain"
timeout 30 "$E2E_BIN/hyla" --server "$E2E_SERVER" drain w2 >/dev/null 2>&1 || true
not_ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$W2M/readyz")" = 503 ]; }
e2e_wait_for 10 not_ready || e2e_fail "w2 /readyz is not 503 while draining"
e2e_expect_eq "$(metric "$W2M" hyla_ready)" 0 "w2 ready gauge while draining"
if [ -n "$PY" ]; then
  W2G=$(awk '/listening on port/ { print $NF }' "$E2E_DIR/w2.log" | tail -1)
  e2e_expect_eq "$(health_check "127.0.0.1:$W2G")" NOT_SERVING "w2 health while draining"
fi

# JSON logs: every line the coordinator wrote after its start banner is one JSON object
if PYJ=$(command -v python3); then
  grep -v '^====' "$E2E_DIR/coordinator.log" | "$PYJ" -c '
import json, sys
n = 0
for line in sys.stdin:
    o = json.loads(line)
    assert list(o)[:4] == ["ts", "level", "component", "msg"], o
    n += 1
assert n > 0
print(n)' >"$E2E_DIR/json.out" 2>&1 || e2e_fail "coordinator --log-format json: $(tail -3 "$E2E_DIR/json.out")"
fi
e2e_done
