#!/usr/bin/env bash
# tools/gpu_check.sh — one command for a bare GPU machine (the device tool's): unpack
# the carried packages into a prefix, build the CUDA tests, run them, run them again
# under compute-sanitizer (memcheck, racecheck), and leave logs and one JSON summary
# in $OUT.
#
# Here, once:  tools/fetch_gpu_debs.sh         (into the git-ignored gpu-debs/)
# Then:        device tool `run`, carry ["gpu-debs"], command "bash tools/gpu_check.sh"
#              (README, "GPU"). Without $OUT it writes to gpu-check-out/.
#
# That machine has nvcc, CMake and PyTorch but none of our Debian packages: they are
# unpacked with `dpkg -x` (or ar + tar where dpkg is missing) into $PREFIX
# (/tmp/blendserve-deps), never into /, and found through CMAKE_PREFIX_PATH, CPATH,
# LIBRARY_PATH, LD_LIBRARY_PATH and pkg-config's sysroot. The model file does not
# travel (over the 64 MiB per call): the CPU reference backend on the same machine is
# the reference of the CUDA ops. Progress on stderr; the summary on stdout and in
# $OUT/gpu_check.json. Exit status: 0 when every step passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-check-out}"
PREFIX="${BLENDSERVE_DEPS_PREFIX:-/tmp/blendserve-deps}"
BUILD="$ROOT/build-gpu"
START=$(date +%s)
mkdir -p "$OUT"
log() { printf '[gpu-check %4ds] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }
declare -A RESULT

{ nvidia-smi; nvcc --version; cmake --version; g++ --version; ldd --version; cat /etc/os-release; } \
  >"$OUT/machine.txt" 2>&1
log "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# 1. the carried packages, into the prefix
unpack_deb() {
  if command -v dpkg >/dev/null 2>&1; then
    dpkg -x "$1" "$PREFIX"
  else
    local member
    member=$(ar t "$1" | grep '^data\.tar')
    case "$member" in
      *.xz) ar p "$1" "$member" | tar -xJ -C "$PREFIX" ;;
      *.zst) ar p "$1" "$member" | zstd -dc | tar -x -C "$PREFIX" ;;
      *.gz) ar p "$1" "$member" | tar -xz -C "$PREFIX" ;;
      *) echo "unknown deb member $member in $1" >&2; return 1 ;;
    esac
  fi
}
if [ ! -f "$PREFIX/.unpacked" ]; then
  debs=("$ROOT"/gpu-debs/*.deb)
  if [ ! -e "${debs[0]}" ]; then
    log "no gpu-debs/*.deb: run tools/fetch_gpu_debs.sh here and carry gpu-debs"
    echo '{"gpu_check":"error","reason":"no gpu-debs carried"}' | tee "$OUT/gpu_check.json"
    exit 2
  fi
  mkdir -p "$PREFIX"
  for f in "${debs[@]}"; do unpack_deb "$f" || { log "unpacking $f failed"; exit 2; }; done
  touch "$PREFIX/.unpacked"
  log "unpacked ${#debs[@]} packages into $PREFIX"
fi
LIB="$PREFIX/usr/lib/x86_64-linux-gnu"
export CMAKE_PREFIX_PATH="$PREFIX/usr"
export CPATH="$PREFIX/usr/include:$PREFIX/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
export LIBRARY_PATH="$LIB${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
export PKG_CONFIG_LIBDIR="$LIB/pkgconfig:$PREFIX/usr/share/pkgconfig"
PKGCONF="$PREFIX/usr/bin/pkgconf"

# 2. configure and build the CUDA tests (Hopper only: this machine's GPU)
step() {  # name, command...: runs it with its log in $OUT/<name>.log, records pass/fail
  local name=$1; shift
  log "$name: $*"
  if "$@" >"$OUT/$name.log" 2>&1; then RESULT[$name]=pass; else RESULT[$name]=fail; log "$name FAILED (tail of $OUT/$name.log):"; tail -20 "$OUT/$name.log" >&2; fi
}
step configure cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_LIBRARY_PATH="$LIB" -DCMAKE_INCLUDE_PATH="$PREFIX/usr/include/x86_64-linux-gnu" \
  -DPKG_CONFIG_EXECUTABLE="$PKGCONF"
[ "${RESULT[configure]}" = pass ] && step build cmake --build "$BUILD" -j"$(nproc)" --target cuda_tests
if [ "${RESULT[build]:-fail}" = pass ]; then
  # 3. the CUDA tests, then the same binary under compute-sanitizer
  step cuda_tests ctest --test-dir "$BUILD" -L cuda --output-on-failure
  # On the GPU machine a skipped CUDA test (exit 77: no device seen) is a failure.
  if [ "${RESULT[cuda_tests]}" = pass ] && grep -q '(Skipped)' "$OUT/cuda_tests.log"; then
    RESULT[cuda_tests]=skipped
    log "cuda_tests: skipped (no CUDA device seen): see $OUT/cuda_tests.log and $OUT/machine.txt"
  fi
  if command -v compute-sanitizer >/dev/null 2>&1; then
    step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD/cuda_test_ops"
    step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$BUILD/cuda_test_ops"
  else
    log "compute-sanitizer not found: memcheck/racecheck not run"
  fi
fi

status=0
json="{\"gpu_check\":\"done\",\"seconds\":$(( $(date +%s) - START ))"
for k in configure build cuda_tests memcheck racecheck; do
  v=${RESULT[$k]:-not_run}
  json+=",\"$k\":\"$v\""
  { [ "$v" = fail ] || [ "$v" = skipped ]; } && status=1
  [ "$k" != memcheck ] && [ "$k" != racecheck ] && [ "$v" = not_run ] && status=1
done
json+=",\"gpu\":\"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\"}"
echo "$json" | tee "$OUT/gpu_check.json"
exit $status
