#!/usr/bin/env bash
# The CUDA toolkit check in CMakeLists.txt: an nvcc older than CUDA 12.5 is named in a warning and
# the build is configured without the CUDA backend; with -DHYLA_CUDA=ON it is an error that says
# why. The old nvcc is a wrapper that reports release 11.8 and forwards everything else to the
# real one (CMake's language check compiles with it). Skipped (77) where there is no nvcc.
set -euo pipefail
SRC=${HYLA_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then echo "skip: no nvcc here"; exit 77; fi
T=$(mktemp -d /tmp/hyla-cudacheck.XXXXXX)
trap 'rm -rf "$T"' EXIT
cat > "$T/nvcc" <<EOS
#!/usr/bin/env bash
if [ "\$1" = "--version" ]; then echo "Cuda compilation tools, release 11.8, V11.8.89"; exit 0; fi
exec "$NVCC" "\$@"
EOS
chmod +x "$T/nvcc"
fail=0
# CMake wraps long messages: compare with the lines joined
flat() { tr '\n' ' ' | tr -s ' '; }
out=$(cmake -S "$SRC" -B "$T/b1" -DCMAKE_CUDA_COMPILER="$T/nvcc" 2>&1) || { echo "FAIL: configure with an old nvcc failed:"; echo "$out" | tail -5; fail=1; }
echo "$out" | flat | grep -q "nvcc 11.8 .* is older than the CUDA 12.5 the backend needs" || { echo "FAIL: no warning naming the old nvcc"; fail=1; }
echo "$out" | grep -q "hyla: CUDA backend OFF" || { echo "FAIL: the CUDA backend was not left out"; fail=1; }
if out=$(cmake -S "$SRC" -B "$T/b2" -DCMAKE_CUDA_COMPILER="$T/nvcc" -DHYLA_CUDA=ON 2>&1); then
  echo "FAIL: -DHYLA_CUDA=ON with an old nvcc configured"; fail=1
else
  echo "$out" | flat | grep -q "HYLA_CUDA=ON but nvcc 11.8" || { echo "FAIL: the error does not say why:"; echo "$out" | tail -5; fail=1; }
fi
[ $fail = 0 ] && echo "ok: an nvcc older than 12.5 leaves the CUDA backend out (warning) or stops -DHYLA_CUDA=ON (error)"
exit $fail
