#!/bin/bash
# run_with_python.sh MODULES SCRIPT ARGS...: runs SCRIPT with the first python3 that can import
# every module in the comma-separated MODULES (e.g. "numpy" or "numpy,torch"), trying
# $HYLA_PYTHON, python3 on PATH, then /usr/bin/python3 (Debian's, where python3-numpy and
# python3-torch install). Without one: exit 77, which ctest reports as skipped.
mods="$1"; shift
imports="import ${mods//,/, }"
for py in "${HYLA_PYTHON:-}" python3 /usr/bin/python3; do
  [ -n "$py" ] || continue
  command -v "$py" >/dev/null 2>&1 || continue
  if "$py" -c "$imports" >/dev/null 2>&1; then
    exec "$py" "$@"
  fi
done
echo "SKIP: no python3 that can '$imports' (Debian: apt-get install python3-${mods//,/ python3-})"
exit 77
