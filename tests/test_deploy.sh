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
#   multigpu-check.sh: a skip (77) with fewer than two GPUs, a pack without test_tp refused, and
#       STEPS=tp with stand-in programs prints both models' TP = 2 / one-GPU ratios.
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

# ---- multigpu-check.sh ----
# With a stand-in nvidia-smi: fewer than two GPUs is a skip (77) naming why; a pack without a
# program it needs is refused naming it; STEPS=tp with stand-in programs (a hyla-bench whose TP = 2
# lines are 1.5 x faster) runs both models at both splits and prints their TP / one-GPU ratios.
mg=$work/mg
mkdir -p "$mg/path0" "$mg/path2" "$mg/bin" "$mg/out"
printf '#!/bin/sh\nexit 0\n' >"$mg/path0/nvidia-smi"
printf '#!/bin/sh\necho "GPU 0: stand-in"\necho "GPU 1: stand-in"\n' >"$mg/path2/nvidia-smi"
for p in test_tp hyla-worker hyla-coordinator hyla; do printf '#!/bin/sh\nexit 0\n' >"$mg/bin/$p"; done
cat >"$mg/bin/hyla-mkmodel" <<'SH'
#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --out ] && mkdir -p "$2" && echo '{}' >"$2/config.json"; shift; done
SH
cat >"$mg/bin/hyla-bench" <<'SH'
#!/bin/sh
tp=1; while [ $# -gt 0 ]; do [ "$1" = --tp ] && tp=$2; shift; done
if [ "$tp" = 2 ]; then r=150000; ms=2.0; else r=100000; ms=3.0; fi
echo "{\"bench\":\"e2e_prefill\",\"tokens_per_s\":$r}"
echo "{\"bench\":\"e2e_decode\",\"B\":256,\"ms_per_step\":$ms}"
SH
chmod +x "$mg"/path0/* "$mg"/path2/* "$mg"/bin/*
out=$(PATH="$mg/path0:$PATH" HYLA_BIN_DIR="$mg/bin" bash "$SRC/deploy/multigpu-check.sh" "$mg/out" 2>&1)
rc=$?
if [ $rc = 77 ] && echo "$out" | grep -q "needs two GPUs of one host; nvidia-smi lists 0"; then
  ok "multigpu-check.sh skips (77) with fewer than two GPUs"
else
  FAIL "multigpu-check.sh without GPUs: rc $rc: $out"
fi
mkdir -p "$mg/bin1" && cp "$mg"/bin/* "$mg/bin1/" && rm "$mg/bin1/test_tp"
out=$(PATH="$mg/path2:$PATH" HYLA_BIN_DIR="$mg/bin1" bash "$SRC/deploy/multigpu-check.sh" "$mg/out" 2>&1)
rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q "bin1/test_tp is missing"; then
  ok "multigpu-check.sh refuses a pack without test_tp"
else
  FAIL "multigpu-check.sh without test_tp: rc $rc: $out"
fi
out=$(PATH="$mg/path2:$PATH" HYLA_BIN_DIR="$mg/bin" MODELS_DIR="$mg/models" STEPS=tp bash "$SRC/deploy/multigpu-check.sh" "$mg/out" 2>&1)
rc=$?
if [ $rc = 0 ] && [ "$(echo "$out" | grep -c '^e2e-.*: ok')" = 4 ] &&
   echo "$out" | grep -q "^gdn: TP = 2 / one GPU: prefill 128k 1.50 x (150000 / 100000 tok/s), B = 256 1.50 x" &&
   echo "$out" | grep -q "^sseh: TP = 2 / one GPU: prefill 128k 1.50 x" && ! echo "$out" | grep -q "^test_tp"; then
  ok "multigpu-check.sh STEPS=tp: both models at both splits, their ratios"
else
  FAIL "multigpu-check.sh STEPS=tp: rc $rc: $out"
fi

[ $fail = 0 ] && echo "test_deploy: ok"
exit $fail
