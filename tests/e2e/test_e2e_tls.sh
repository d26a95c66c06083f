#!/usr/bin/env bash
# TLS on a real cluster: a test CA from deploy/make-test-ca.sh; hyla-coordinator serving TLS with
# API keys; two pipeline-stage workers serving mutual TLS (--tls-require-client-cert) and calling
# the coordinator, the store and each other over TLS. A tenant's session works end to end
# (create, append, generate across both stages, pause into the store); a plain client is refused
# (UNAVAILABLE, exit 4); a TLS client without a client certificate cannot reach a worker's port;
# one with the cluster's certificate can. Skips (77) without the binaries or openssl.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init tls hyla hyla-coordinator hyla-worker hyla-mkmodel hyla-admin
command -v openssl >/dev/null || e2e_skip "openssl is not installed"
PROBE=${HYLA_BUILD_DIR:-build}/tests/test_auth
[ -x "$PROBE" ] || e2e_skip "$PROBE is not built yet"

PKI=$E2E_DIR/pki
bash "$E2E_SRC/deploy/make-test-ca.sh" "$PKI" 2>/dev/null || { e2e_fail "make-test-ca.sh failed"; e2e_done; }
TLS=(--tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key" --tls-ca "$PKI/ca.pem")
ADMIN_FILE=$E2E_DIR/admin.key
e2e_make_model "$E2E_DIR/model"

export HYLA_TLS_CA=$PKI/ca.pem HYLA_API_KEY=
e2e_start coordinator "$E2E_BIN/hyla-coordinator" --listen 127.0.0.1:0 --port-file "$E2E_DIR/c.port" \
  --data "$E2E_DIR/c.data" --admin-key-file "$ADMIN_FILE" "${TLS[@]}"
e2e_wait_for "$E2E_TIMEOUT" test -s "$E2E_DIR/c.port" || { e2e_fail "no port file"; e2e_done; }
E2E_SERVER=localhost:$(cat "$E2E_DIR/c.port")
OPKEY=$(cat "$ADMIN_FILE")
export HYLA_API_KEY=$OPKEY
e2e_wait_for "$E2E_TIMEOUT" e2e_hyla --timeout 2 status || e2e_fail "the TLS coordinator does not answer a TLS client"

e2e_start_worker p0 "$E2E_DIR/model" --layers 0:2 --admin-key-file "$ADMIN_FILE" "${TLS[@]}" \
  --tls-require-client-cert || e2e_done
e2e_start_worker p1 "$E2E_DIR/model" --layers 2:4 --admin-key-file "$ADMIN_FILE" "${TLS[@]}" \
  --tls-require-client-cert || e2e_done
e2e_wait_for "$E2E_TIMEOUT" sh -c "'$E2E_BIN/hyla' --server '$E2E_SERVER' status | grep -E 'p0[ ,]+p1' | grep -qw yes" ||
  e2e_fail "the coordinator did not assemble p0 + p1 into a pipeline group over TLS"
P0=127.0.0.1:$(sed -n 's/^hyla-worker listening on port \([0-9]*\).*/\1/p' "$E2E_DIR/p0.log" | tail -n 1)

KA=$("$E2E_BIN/hyla-admin" --server "$E2E_SERVER" --admin-key-file "$ADMIN_FILE" --tls-ca "$PKI/ca.pem" \
  key create --tenant acme) || e2e_fail "hyla-admin key create over TLS"
A() { HYLA_API_KEY=$KA e2e_hyla "$@"; }
S=$(A create --seed 5 --on p0) || e2e_fail "create over TLS"
echo "The state of a linear-attention layer has a fixed size." >"$E2E_DIR/doc.txt"
e2e_expect_rc 0 "append over TLS (two mutual-TLS stages)" A -q append "$S" "$E2E_DIR/doc.txt"
g=$(A -q generate "$S" -n 8 --ids --ignore-eos) || e2e_fail "generate over TLS"
[ "$(echo "$g" | wc -w)" = 8 ] || e2e_fail "generate over TLS gave '$g'"
e2e_expect_rc 0 "pause over TLS (snapshot into the store)" A pause "$S"
e2e_expect_rc 0 "resume over TLS" A resume "$S"

# a plain client cannot talk to a TLS coordinator
e2e_expect_rc 4 "a plain client against the TLS coordinator" env HYLA_TLS_CA= HYLA_API_KEY="$KA" \
  "$E2E_BIN/hyla" --server "$E2E_SERVER" --timeout 5 show "$S"
# a TLS client without a client certificate cannot reach a mutual-TLS worker, even with the key
got=$(HYLA_TLS_CA=$PKI/ca.pem "$PROBE" probe "$P0" /hyla.v1.Worker/DescribeSession "$OPKEY" 2>/dev/null)
e2e_expect_eq "$got" UNAVAILABLE "a worker's mutual-TLS port without a client certificate"
got=$(HYLA_TLS_CA=$PKI/ca.pem HYLA_TLS_CERT=$PKI/client.pem HYLA_TLS_KEY=$PKI/client.key \
  "$PROBE" probe "$P0" /hyla.v1.Worker/DescribeSession 2>/dev/null)
e2e_expect_eq "$got" UNAUTHENTICATED "a worker's port with a client certificate but no key"
got=$(HYLA_TLS_CA=$PKI/ca.pem HYLA_TLS_CERT=$PKI/client.pem HYLA_TLS_KEY=$PKI/client.key \
  "$PROBE" probe "$P0" /hyla.v1.Worker/DescribeSession "$OPKEY" 2>/dev/null)
case "$got" in
UNAVAILABLE | UNAUTHENTICATED | PERMISSION_DENIED) e2e_fail "certificate and key refused by the worker ($got)" ;;
*) e2e_log "ok: certificate and key reach the worker's handler ($got)" ;;
esac
e2e_done
