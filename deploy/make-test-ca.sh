#!/usr/bin/env bash
# deploy/make-test-ca.sh DIR [HOST...] — a local test CA and certificates for hyla's TLS, made with
# openssl: for tests and trying TLS out, never for production (the keys are unencrypted and the CA
# is trusted by nobody else).
#
#   DIR/ca.pem, DIR/ca.key          the CA (self-signed, 30 days)
#   DIR/server.pem, DIR/server.key  a server certificate for the HOSTs (default: localhost and
#                                   127.0.0.1, ::1); usable as a client certificate too, so
#                                   workers can present it for mutual TLS
#   DIR/client.pem, DIR/client.key  a client certificate (CN hyla-client) for mutual TLS
#
# Use: hyla-coordinator --tls-cert DIR/server.pem --tls-key DIR/server.key --tls-ca DIR/ca.pem;
#      hyla-worker ... --tls-cert DIR/server.pem --tls-key DIR/server.key --tls-ca DIR/ca.pem
#      [--tls-require-client-cert]; hyla --tls-ca DIR/ca.pem (or HYLA_TLS_CA).
set -euo pipefail
dir=${1:?usage: make-test-ca.sh DIR [HOST...]}
shift
hosts=("$@")
[ ${#hosts[@]} -gt 0 ] || hosts=(localhost 127.0.0.1 ::1)
command -v openssl >/dev/null || { echo "make-test-ca.sh: openssl is not installed" >&2; exit 1; }
mkdir -p "$dir"
umask 077

san=
for h in "${hosts[@]}"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}

openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=hyla test CA" \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

issue() { # NAME CN EXT
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$dir/$1.key" -out "$dir/$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$dir/$1.ext"
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 30 \
    -extfile "$dir/$1.ext" -out "$dir/$1.pem" 2>/dev/null
  rm -f "$dir/$1.csr" "$dir/$1.ext"
}
issue server "${hosts[0]}" "subjectAltName=$san
extendedKeyUsage=serverAuth,clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"
issue client hyla-client "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"
rm -f "$dir/ca.srl"
chmod 644 "$dir"/*.pem
echo "make-test-ca.sh: CA and certificates for ${hosts[*]} in $dir" >&2
