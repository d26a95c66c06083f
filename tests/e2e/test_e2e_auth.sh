#!/usr/bin/env bash
# API keys on a real cluster (hyla-coordinator --admin-key-file + a two-stage pipeline of
# hyla-worker on loopback, CPU backend, tiny model): the operator key file is created 0600;
# hyla-admin issues keys (printed alone on stdout) and revokes them; a tenant's key serves its
# sessions (through both stages and the store); another tenant's key -> PERMISSION_DENIED (exit 5)
# whatever x-hyla-tenant says; no key, a made-up key and a revoked key -> UNAUTHENTICATED; keys
# survive a coordinator restart; another tenant's key cannot export a session, an import belongs
# to the importer's tenant; GET /v1/models on the HTTP gateway answers a tenant's and the
# operator's key. Every internal service refuses callers without the cluster
# credential (UNAUTHENTICATED without a key; with a tenant key PERMISSION_DENIED on the
# coordinator, UNAUTHENTICATED on a worker, which knows no tenant keys): Cluster and Admin
# (operator), StateStore, RegisterWorker / Heartbeat, a worker's own port, a pipeline stage's
# StageForward; a worker without the key file cannot join. Skips (77) until the
# binaries are built.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init auth hyla hyla-coordinator hyla-worker hyla-mkmodel hyla-admin
PROBE=${HYLA_BUILD_DIR:-build}/tests/test_auth
[ -x "$PROBE" ] || e2e_skip "$PROBE is not built yet"

ADMIN_FILE=$E2E_DIR/admin.key
e2e_make_model "$E2E_DIR/model"
# lib.sh's readiness checks run `hyla status` (the Cluster service): they need the operator key,
# which only exists once the coordinator wrote it; the env var is read by each hyla run
export HYLA_API_KEY=
e2e_start "coordinator" "$E2E_BIN/hyla-coordinator" --listen 127.0.0.1:0 --port-file "$E2E_DIR/c.port" \
  --data "$E2E_DIR/c.data" --admin-key-file "$ADMIN_FILE" --http 127.0.0.1:0 --http-port-file "$E2E_DIR/h.port"
e2e_wait_for "$E2E_TIMEOUT" test -s "$E2E_DIR/c.port" || { e2e_fail "no port file"; e2e_done; }
E2E_SERVER=127.0.0.1:$(cat "$E2E_DIR/c.port")
[ -s "$ADMIN_FILE" ] || e2e_fail "the coordinator wrote no operator key to $ADMIN_FILE"
e2e_expect_eq "$(stat -c %a "$ADMIN_FILE")" 600 "operator key file mode"
OPKEY=$(cat "$ADMIN_FILE")
export HYLA_API_KEY=$OPKEY
e2e_wait_for "$E2E_TIMEOUT" e2e_hyla --timeout 2 status || e2e_fail "the coordinator does not answer the operator"
grep -q "DEVELOPMENT MODE" "$E2E_DIR/coordinator.log" && e2e_fail "a keyed coordinator logged development mode"

e2e_start_worker p0 "$E2E_DIR/model" --layers 0:2 --admin-key-file "$ADMIN_FILE" || e2e_done
e2e_start_worker p1 "$E2E_DIR/model" --layers 2:4 --admin-key-file "$ADMIN_FILE" || e2e_done
e2e_wait_for "$E2E_TIMEOUT" sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | grep -E 'p0[ ,]+p1' | grep -qw yes" ||
  e2e_fail "the coordinator did not assemble p0 + p1 into a pipeline group"
port_of() { sed -n 's/^hyla-worker listening on port \([0-9]*\).*/\1/p' "$E2E_DIR/$1.log" | tail -n 1; }
P0=127.0.0.1:$(port_of p0)
P1=127.0.0.1:$(port_of p1)

ADM=("$E2E_BIN/hyla-admin" --server "$E2E_SERVER" --admin-key-file "$ADMIN_FILE")
KA=$("${ADM[@]}" key create --tenant acme) || e2e_fail "key create acme"
KB=$("${ADM[@]}" key create --tenant bob) || e2e_fail "key create bob"
[[ "$KA" =~ ^hk_[0-9a-f]{16}_[0-9a-f]{64}$ ]] || e2e_fail "key create printed '$KA'"
[ "$("${ADM[@]}" key ls | wc -l)" = 2 ] || e2e_fail "key ls: $("${ADM[@]}" key ls)"
"${ADM[@]}" key ls | grep -q "${KA:3:16}  acme" || e2e_fail "key ls does not show acme's key id"
grep -rqa "${KA:20}" "$E2E_DIR/c.data" && e2e_fail "the key's secret is stored in the clear"

A() { HYLA_API_KEY=$KA e2e_hyla "$@"; }
B() { HYLA_API_KEY=$KB e2e_hyla "$@"; }
S=$(A create --seed 5 --on p0) || e2e_fail "create with acme's key"
echo "The state of a linear-attention layer has a fixed size." >"$E2E_DIR/doc.txt"
e2e_expect_rc 0 "append with acme's key (two stages)" A -q append "$S" "$E2E_DIR/doc.txt"
g1=$(A -q generate "$S" -n 8 --ids --ignore-eos) || e2e_fail "generate with acme's key"
[ "$(echo "$g1" | wc -w)" = 8 ] || e2e_fail "generate gave '$g1'"
e2e_expect_rc 0 "pause (snapshot through the keyed StateStore)" A pause "$S"
A show "$S" | grep -q "^tenant *acme" || e2e_fail "the session's tenant is not acme: $(A show "$S" | grep tenant)"
e2e_expect_rc 5 "bob's key on acme's session" B show "$S"
grep -q PERMISSION_DENIED "$E2E_DIR/last.err" || e2e_fail "bob: $(cat "$E2E_DIR/last.err")"
e2e_expect_rc 5 "bob's key with x-hyla-tenant acme" B --tenant acme generate "$S" -n 1
[ "$(B ls --ids | wc -l)" = 0 ] || e2e_fail "bob lists acme's sessions"
e2e_expect_rc 5 "no key" env HYLA_API_KEY= "$E2E_BIN/hyla" --server "$E2E_SERVER" --tenant acme show "$S"
grep -q UNAUTHENTICATED "$E2E_DIR/last.err" || e2e_fail "no key: $(cat "$E2E_DIR/last.err")"
e2e_expect_rc 5 "a made-up key" env HYLA_API_KEY="hk_0123456789abcdef_$(printf '0%.0s' $(seq 64))" \
  "$E2E_BIN/hyla" --server "$E2E_SERVER" show "$S"
grep -q UNAUTHENTICATED "$E2E_DIR/last.err" || e2e_fail "made-up key: $(cat "$E2E_DIR/last.err")"
e2e_expect_rc 5 "a tenant key on the operators' Cluster service" A status
grep -q PERMISSION_DENIED "$E2E_DIR/last.err" || e2e_fail "tenant on Cluster: $(cat "$E2E_DIR/last.err")"

# the Python client: a key gets through, none is UNAUTHENTICATED (skipped without grpcio)
if PY=$(e2e_python); then
  HYLA_PROTO_DIR="$E2E_SRC/proto" "$PY" - "$E2E_SERVER" "$E2E_SRC/client/python" "$S" "$KA" "$KB" <<'PY' ||
import sys
sys.path.insert(0, sys.argv[2])
from hyla_client import Client, HylaError

server, sid, ka, kb = sys.argv[1], sys.argv[3], sys.argv[4], sys.argv[5]
with Client(server, api_key=ka) as c:
    assert c.get(sid).tenant == "acme"
for key, want in ((kb, "PERMISSION_DENIED"), ("", "UNAUTHENTICATED")):
    with Client(server, api_key=key, tenant="acme") as c:
        try:
            c.get(sid)
            raise SystemExit("python: get with key %r succeeded" % key[:8])
        except HylaError as e:
            assert e.code_name == want, (e.code_name, want)
PY
    e2e_fail "python client with API keys"
  e2e_log "ok: python client with API keys"
else
  e2e_log "python client part skipped: no python3 with grpc and grpc_tools"
fi

# the HTTP gateway forwards the caller's bearer key: none -> 401, a tenant's key -> served
if command -v curl >/dev/null && [ -s "$E2E_DIR/h.port" ]; then
  H=http://127.0.0.1:$(cat "$E2E_DIR/h.port")
  body='{"prompt":"Once upon a time","max_tokens":4}'
  code=$(curl -s -o "$E2E_DIR/http.out" -w '%{http_code}' "$H/v1/completions" -d "$body")
  e2e_expect_eq "$code" 401 "HTTP completion without a key"
  code=$(curl -s -o "$E2E_DIR/http.out" -w '%{http_code}' -H "Authorization: Bearer $KB" "$H/v1/completions" -d "$body")
  e2e_expect_eq "$code" 200 "HTTP completion with bob's key"
  # GET /v1/models answers any valid key: a tenant's (ListModels, not the operators' Cluster
  # service) and the operator's
  code=$(curl -s -o "$E2E_DIR/http.out" -w '%{http_code}' "$H/v1/models")
  e2e_expect_eq "$code" 401 "GET /v1/models without a key"
  for who in KB OPKEY; do
    code=$(curl -s -o "$E2E_DIR/http.out" -w '%{http_code}' -H "Authorization: Bearer ${!who}" "$H/v1/models")
    e2e_expect_eq "$code" 200 "GET /v1/models with $who"
    grep -q '"id": *"model"' "$E2E_DIR/http.out" || e2e_fail "GET /v1/models with $who: $(head -c 300 "$E2E_DIR/http.out")"
  done
fi

# a session's file leaves only with its tenant's key; an import belongs to the importer's tenant
e2e_expect_rc 5 "bob exports acme's session" B export "$S" "$E2E_DIR/bob.hys"
grep -q PERMISSION_DENIED "$E2E_DIR/last.err" || e2e_fail "bob's export: $(cat "$E2E_DIR/last.err")"
[ -e "$E2E_DIR/bob.hys" ] && e2e_fail "a refused export wrote a file"
e2e_expect_rc 0 "acme exports its session" A export "$S" "$E2E_DIR/acme.hys"
BI=$(B import "$E2E_DIR/acme.hys") || e2e_fail "bob imports a file he was given"
B show "$BI" | grep -q "^tenant *bob" || e2e_fail "the import's tenant is not bob: $(B show "$BI" | grep tenant)"
e2e_expect_eq "$(B -q generate "$BI" -n 4 --ids --ignore-eos)" "$(A -q generate "$S" -n 4 --ids --ignore-eos)" \
  "bob's import (placed on the two-stage pipeline) continues as acme's session does"
e2e_expect_rc 5 "acme's key on bob's import" A show "$BI"
e2e_expect_rc 5 "an import without a key" env HYLA_API_KEY= "$E2E_BIN/hyla" --server "$E2E_SERVER" import \
  "$E2E_DIR/acme.hys"
grep -q UNAUTHENTICATED "$E2E_DIR/last.err" || e2e_fail "import without a key: $(cat "$E2E_DIR/last.err")"

# every internal service: no key -> UNAUTHENTICATED, a tenant key -> PERMISSION_DENIED
probe_expect() { # ADDR METHOD KEY WANT
  local got what="no key"
  [ -n "$3" ] && what="a tenant key"
  got=$("$PROBE" probe "$1" "$2" $3 2>>"$E2E_DIR/probe.err")
  e2e_expect_eq "$got" "$4" "$2 on $1 with $what"
}
for m in /hyla.v1.Cluster/ListClusterSessions /hyla.v1.Admin/ListKeys /hyla.v1.StateStore/GetSnapshot \
  /hyla.v1.StateStore/DeleteSnapshots /hyla.v1.StateStore/PutSnapshot /hyla.v1.Coordinator/RegisterWorker \
  /hyla.v1.Coordinator/Heartbeat /hyla.v1.Coordinator/ReportSnapshot; do
  probe_expect "$E2E_SERVER" "$m" "" UNAUTHENTICATED
  probe_expect "$E2E_SERVER" "$m" "$KA" PERMISSION_DENIED
done
# a worker knows no tenant keys: any key but the cluster's is unknown there
for m in /hyla.v1.Worker/DescribeSession /hyla.v1.Worker/Generate /hyla.v1.Worker/LoadSession; do
  probe_expect "$P0" "$m" "" UNAUTHENTICATED
  probe_expect "$P0" "$m" "$KA" UNAUTHENTICATED
done
probe_expect "$P1" /hyla.v1.Worker/StageForward "" UNAUTHENTICATED
probe_expect "$P1" /hyla.v1.Worker/StageForward "$KA" UNAUTHENTICATED
# with the credential the calls get through to their handlers (which then judge the empty request)
CRED_OK=$("$PROBE" probe "$P0" /hyla.v1.Worker/DescribeSession "$OPKEY" 2>/dev/null)
[ "$CRED_OK" != UNAUTHENTICATED ] && [ "$CRED_OK" != PERMISSION_DENIED ] ||
  e2e_fail "the operator key is refused by the worker's port ($CRED_OK)"

# a worker without the cluster's key file cannot join
e2e_start wx "$E2E_BIN/hyla-worker" --coordinator "$E2E_SERVER" --listen 127.0.0.1:0 --id wx \
  --model "$E2E_DIR/model" --device cpu
e2e_wait_for "$E2E_TIMEOUT" grep -q UNAUTHENTICATED "$E2E_DIR/wx.log" ||
  e2e_fail "the keyless worker's registration was not refused UNAUTHENTICATED"
grep -q "DEVELOPMENT MODE" "$E2E_DIR/wx.log" || e2e_fail "a keyless worker did not warn about development mode"
e2e_hyla status | grep -qw wx && e2e_fail "the keyless worker joined the cluster"
e2e_kill wx

# revoke: refused at once; the other key goes on; keys survive a restart
e2e_expect_rc 0 "key revoke" "${ADM[@]}" key revoke "${KA:3:16}"
e2e_expect_rc 5 "a revoked key" A show "$S"
grep -q UNAUTHENTICATED "$E2E_DIR/last.err" || e2e_fail "revoked key: $(cat "$E2E_DIR/last.err")"
e2e_expect_eq "$("${ADM[@]}" key ls | wc -l)" 1 "one key left after the revoke"
e2e_kill coordinator
e2e_start "coordinator" "$E2E_BIN/hyla-coordinator" --listen "$E2E_SERVER" --data "$E2E_DIR/c.data" \
  --admin-key-file "$ADMIN_FILE"
e2e_wait_for "$E2E_TIMEOUT" e2e_hyla --timeout 2 status || e2e_fail "the coordinator did not come back"
e2e_expect_eq "$(cat "$ADMIN_FILE")" "$OPKEY" "the operator key file is kept across restarts"
e2e_expect_rc 0 "bob's key after a restart" B ls
e2e_expect_rc 5 "acme's revoked key after a restart" A show "$S"
e2e_done
