#!/usr/bin/env bash
# tools/gpu_check.sh — one command for a bare GPU machine (the device tool's): unpack
# the carried packages into a prefix, build the CUDA tests and the tools, run the tests,
# run the op tests again under compute-sanitizer (memcheck, racecheck), run the GPU
# benchmarks against PyTorch on the same GPU, and leave logs, JSON lines and one JSON
# summary in $OUT.
#
# Here, once:  tools/fetch_gpu_debs.sh         (into the git-ignored gpu-debs/)
# Then:        device tool `run`, carry ["gpu-debs"], command "bash tools/gpu_check.sh"
#              (README, "GPU"). Without $OUT it writes to gpu-check-out/.
# Stages:      bash tools/gpu_check.sh [build] [tests] [sanitize] [bench]   (default: all;
#              a later call on the same warm machine reuses build-gpu/, so the stages can
#              be split over calls of the device tool's 600 s limit).
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
STAGES="${*:-build tests sanitize bench}"
want() { [[ " $STAGES " == *" $1 "* ]]; }

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
if want build; then
  [ "${RESULT[configure]}" = pass ] &&
    step build cmake --build "$BUILD" -j"$(nproc)" --target cuda_tests blendctl blendserve
else
  [ -x "$BUILD/cuda_test_ops" ] && RESULT[build]=pass  # an earlier call's build
fi
if [ "${RESULT[build]:-fail}" = pass ]; then
  # 3. the CUDA tests, then the op tests under compute-sanitizer
  if want tests; then
    step cuda_tests ctest --test-dir "$BUILD" -L cuda --output-on-failure
    # On the GPU machine a skipped CUDA test (exit 77: no device seen) is a failure.
    if [ "${RESULT[cuda_tests]}" = pass ] && grep -q '(Skipped)' "$OUT/cuda_tests.log"; then
      RESULT[cuda_tests]=skipped
      log "cuda_tests: skipped (no CUDA device seen): see $OUT/cuda_tests.log and $OUT/machine.txt"
    fi
  fi
  if want sanitize; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
      step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD/cuda_test_ops"
      step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$BUILD/cuda_test_ops"
      step memcheck_backend compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD/cuda_test_backend"
    else
      log "compute-sanitizer not found: memcheck/racecheck not run"
    fi
  fi
  # 4. the benchmarks (issue 19's targets), ours and PyTorch's on the same GPU, JSON
  # lines in $OUT/bench_*.jsonl. Random weights in the real shapes, built in memory.
  if want bench; then
    BLENDCTL="$BUILD/blendctl"
    bench() {  # name, timeout seconds, command...: JSON lines to $OUT/bench_<name>.jsonl
      local name=$1 limit=$2; shift 2
      log "bench $name: $*"
      if timeout "$limit" "$@" >"$OUT/bench_$name.jsonl" 2>"$OUT/bench_$name.log"; then
        RESULT[bench_$name]=pass
      else
        RESULT[bench_$name]=fail
        log "bench $name FAILED (tail of $OUT/bench_$name.log):"; tail -20 "$OUT/bench_$name.log" >&2
      fi
    }
    bench prefill_8b 300 "$BLENDCTL" --device cuda --model random:llama-3.1-8b bench prefill \
      --lengths 3072 8192 --repeats 3 --decode-context 512 --decode-tokens 32 --decode-batches 1 32
    bench decode_1b 300 "$BLENDCTL" --device cuda --model random:llama-3.2-1b bench decode \
      --streams 1 32 --tokens 64 --prompt-tokens 256 --repeats 2
    bench ttft_8b_6 300 "$BLENDCTL" --device cuda --model random:llama-3.1-8b bench ttft --tier ram \
      --chunks 6 --chunk-tokens 512 --requests 2
    bench ttft_8b_20 300 "$BLENDCTL" --device cuda --model random:llama-3.1-8b bench ttft --tier ram \
      --chunks 20 --chunk-tokens 512 --requests 2
    if python3 -c 'import torch' 2>/dev/null; then
      bench torch_check 120 python3 "$ROOT/tools/peer_torch.py" check --device cuda --dtype bf16
      bench torch_gemm 120 python3 "$ROOT/tools/peer_torch.py" gemm-peak
      bench torch_prefill_8b 300 python3 "$ROOT/tools/peer_torch.py" prefill --model random:llama-3.1-8b \
        --tokens 3072 8192 --repeats 3
      bench torch_decode_1b 300 python3 "$ROOT/tools/peer_torch.py" decode --model random:llama-3.2-1b \
        --streams 1 32 --tokens 64 --prompt-tokens 256 --repeats 2
    else
      log "PyTorch not importable: the peer benchmarks not run"
    fi
  fi
fi

status=0
json="{\"gpu_check\":\"done\",\"stages\":\"$STAGES\",\"seconds\":$(( $(date +%s) - START ))"
for k in configure build cuda_tests memcheck racecheck memcheck_backend "${!RESULT[@]}"; do
  [[ $json == *"\"$k\":"* ]] && continue
  v=${RESULT[$k]:-not_run}
  json+=",\"$k\":\"$v\""
  { [ "$v" = fail ] || [ "$v" = skipped ]; } && status=1
  case $k in configure|build) [ "$v" = not_run ] && status=1 ;; esac
  if [ "$k" = cuda_tests ] && want tests && [ "$v" = not_run ]; then status=1; fi
done
json+=",\"gpu\":\"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\"}"
echo "$json" | tee "$OUT/gpu_check.json"
exit $status
