#!/usr/bin/env bash
# The deployment files verify (deploy/):
#   systemd: deploy/systemd/*.service pass `systemd-analyze verify` with no warning (the
#       ExecStart paths pointed at this build's binaries); a unit with a misspelt key does not
#       (the check can fail). Skipped with a message where systemd-analyze is missing.
#   kubernetes: tests/deploy/check_k8s.py's structural check of deploy/k8s/*.yaml (what it covers
#       is in its docstring: kinds, names, selectors, volumes and their ConfigMaps/Secrets/PVCs,
#       probes' ports, the headless Service and volumeClaimTemplate of the StatefulSet, the
#       worker's nvidia.com/gpu, Services' targetPorts, the Secret's files); a manifest without
#       the GPU request fails it. Skipped where python3 lacks PyYAML.
#   config files: deploy/config/*.conf and the ConfigMap's *.conf are read by the real binaries'
#       --config parser (every key known, every value accepted).
#   Dockerfile: based on debian:12, its COPY sources exist, the runtime packages it installs
#       exist in this Debian 12's apt lists (where apt has lists), the targets it builds exist.
#   compare-fla.sh: PARTS=hyla times only hyla's half (a stand-in hyla-bench) and writes no table
#       without FLA's file; a PARTS naming neither half is refused.
set -uo pipefail
SRC=${HYLA_SOURCE_DIR:-.}
BIN=$(cd "${HYLA_BIN_DIR:-build/bin}" && pwd)
work=$(mktemp -d /tmp/hyla-deploy.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
FAIL() { echo "FAIL: $*" >&2; fail=1; }
ok() { echo "ok: $*"; }

# ---- systemd ----
if command -v systemd-analyze >/dev/null; then
  for u in "$SRC"/deploy/systemd/*.service; do
    sed "s|/usr/bin/|$BIN/|g" "$u" >"$work/$(basename "$u")"
  done
  (cd "$work" && systemd-analyze verify --man=no ./hyla-coordinator.service ./hyla-worker@0.service) >"$work/verify.out" 2>&1
  rc=$?
  if [ $rc != 0 ] || [ -s "$work/verify.out" ]; then
    FAIL "systemd-analyze verify (rc $rc): $(cat "$work/verify.out")"
  else
    ok "systemd units verify"
  fi
  sed 's/^Restart=/Restrat=/' "$work/hyla-coordinator.service" >"$work/broken.service"
  (cd "$work" && systemd-analyze verify --man=no ./broken.service) >"$work/broken.out" 2>&1
  grep -q "Restrat" "$work/broken.out" || FAIL "systemd-analyze verify did not notice a misspelt key"
else
  echo "SKIP (part): systemd-analyze is not installed: the systemd units were not verified"
fi

# ---- config files through the real parsers ----
conf_ok() { # conf_ok BIN FILE
  local out rc=0
  out=$("$BIN/$1" --config "$2" --help 2>&1 >/dev/null) || rc=$?
  if [ $rc != 0 ]; then FAIL "$1 --config $2: exit $rc: $out"; else ok "$1 reads $(basename "$2")"; fi
}
conf_ok hyla-coordinator "$SRC/deploy/config/coordinator.conf"
conf_ok hyla-worker "$SRC/deploy/config/worker.conf"

# ---- kubernetes ----
if python3 -c "import yaml" 2>/dev/null; then
  mkdir -p "$work/conf"
  if python3 "$SRC/tests/deploy/check_k8s.py" "$SRC/deploy/k8s" "$work/conf"; then
    conf_ok hyla-coordinator "$work/conf/coordinator.conf"
    conf_ok hyla-worker "$work/conf/worker.conf"
  else
    FAIL "deploy/k8s does not pass check_k8s.py"
  fi
  mkdir -p "$work/k8s-broken"
  cp "$SRC"/deploy/k8s/*.yaml "$work/k8s-broken/"
  sed -i '/nvidia.com\/gpu: 1/d' "$work/k8s-broken/worker.yaml"
  python3 "$SRC/tests/deploy/check_k8s.py" "$work/k8s-broken" >"$work/broken-k8s.out" 2>&1 &&
    FAIL "check_k8s.py passed a worker without nvidia.com/gpu"
  grep -q "nvidia.com/gpu" "$work/broken-k8s.out" || FAIL "check_k8s.py did not name the missing GPU request"
else
  echo "SKIP (part): python3 has no PyYAML (python3-yaml): the Kubernetes manifests were not checked"
fi

# ---- Dockerfile ----
df="$SRC/deploy/Dockerfile"
grep -q '^ARG DEBIAN=debian:12$' "$df" && grep -q '^FROM \${DEBIAN} AS build' "$df" ||
  FAIL "the Dockerfile is not built from debian:12"
for f in $(awk '/^COPY / && !/--from/ { for (i = 2; i < NF; i++) print $i }' "$df"); do
  [ "$f" = . ] || [ -e "$SRC/$f" ] || FAIL "Dockerfile COPY source $f does not exist"
done
if [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -i debian | head -1)" ]; then
  pk=$(awk '/^FROM \$\{DEBIAN\}-slim/ { r = 1 } r && /apt-get install/ { on = 1 } on { print } on && !/\\$/ { on = 0 }' "$df" |
    tr ' \\' '\n\n' | grep -E '^lib|^ca-certificates$|^curl$' | grep -v '\$' | sort -u)
  # one apt-cache call (each takes seconds): every package needs a candidate version
  # shellcheck disable=SC2086
  apt-cache policy $pk 2>/dev/null | awk '/^[^ ]/ { p = $1; sub(/:$/, "", p) } /Candidate:/ && $2 != "(none)" { print p }' |
    sort >"$work/have"
  for p in $pk; do
    grep -qx "$p" "$work/have" || FAIL "Dockerfile runtime package $p is not in Debian 12's lists"
  done
  ok "Dockerfile runtime packages exist: $(echo $pk)"
fi
for t in hyla-coordinator hyla-worker hyla hyla-state hyla-mkmodel; do
  grep -rqs "add_executable($t[ )]" "$SRC"/*/CMakeLists.txt "$SRC"/CMakeLists.txt || FAIL "Dockerfile target $t is not defined"
done

# ---- compare-fla.sh's halves (PARTS) ----
# With a stand-in hyla-bench and an existing model directory (no GPU, no FLA needed for the hyla
# half): PARTS=hyla writes hyla.jsonl and stops, naming the missing fla.jsonl, without a table;
# PARTS naming neither half is refused.
mkdir -p "$work/cf/bin" "$work/cf/model" "$work/cf/out"
echo '{}' >"$work/cf/model/config.json"
printf '#!/bin/sh\necho "{\\"bench\\":\\"e2e_prefill\\",\\"args\\":\\"$*\\"}"\n' >"$work/cf/bin/hyla-bench"
chmod +x "$work/cf/bin/hyla-bench"
out=$(FLA_SRC="$work" HYLA_BIN="$work/cf/bin" MODEL="$work/cf/model" PARTS=hyla KERNELS= PREFILL=4096 BATCH=1 \
      bash "$SRC/deploy/compare-fla.sh" "$work/cf/out" 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q '"bench":"e2e_prefill"' "$work/cf/out/hyla.jsonl" && grep -q -- '--prefill 4096' "$work/cf/out/hyla.jsonl" &&
   grep -q -- '--prefill-repeat 3' "$work/cf/out/hyla.jsonl" &&
   [ ! -e "$work/cf/out/fla.jsonl" ] && [ ! -e "$work/cf/out/table.md" ] && echo "$out" | grep -q "no $work/cf/out/fla.jsonl yet"; then
  ok "compare-fla.sh PARTS=hyla: the hyla half alone, no table without fla.jsonl"
else
  FAIL "compare-fla.sh PARTS=hyla: rc $rc: $out"
fi
out=$(FLA_SRC="$work" HYLA_BIN="$work/cf/bin" MODEL="$work/cf/model" PARTS=neither bash "$SRC/deploy/compare-fla.sh" "$work/cf/out" 2>&1)
rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q "PARTS=neither names neither fla nor hyla"; then
  ok "compare-fla.sh refuses a PARTS naming neither half"
else
  FAIL "compare-fla.sh PARTS=neither: rc $rc: $out"
fi

[ $fail = 0 ] && echo "test_deploy: ok"
exit $fail
