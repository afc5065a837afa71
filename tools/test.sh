#!/usr/bin/env bash
# The test command (README): set up (idempotent), build, run every test.
#   1. tools/setup.sh: Debian packages + the model file (verified sha256)
#   2. Release build in build/ (binaries: build/blendserve, build/blendctl); all tests:
#      the kernel tests once per CPU kernel variant this machine can execute (the others
#      show as "Not Run"), the model tests on the best variant and those of the model's
#      and the blend's arithmetic again capped to AVX2 (tests/CMakeLists.txt)
#   3. ASan+UBSan build in build-asan/ (clang, -O1, with the fuzzers' coverage hooks, so
#      the fuzz targets reuse its objects); the unit tests (label "unit") under it, and the
#      actor runtime's protocol tests and quick runtime tests (label "asan_model"), -j nproc
#   4. the libFuzzer targets (GGUF reader, safetensors reader, request parser, remote frame codec, pasted-passage
#      search, YAML loaders, SSD file reader, tokenizer and chat template, control plane's messages, chat
#      templates' Jinja: FUZZERS below), built in
#      build-asan/, one process each, as many side by side as there are cores, for
#      BLENDSERVE_FUZZ_SECONDS each (default 20)
# Set BLENDSERVE_SKIP_SANITIZE=1 to skip steps 3 and 4 while iterating.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="$(nproc)"

# Each step's wall time, printed when it ends and again all together at the end, so a
# CI log shows where the time goes.
STEP_NAME=""
STEP_START=$SECONDS
STEP_TIMES=()
step() {
  if [ -n "$STEP_NAME" ]; then
    local took=$((SECONDS - STEP_START))
    STEP_TIMES+=("$STEP_NAME $took s")
    echo "[test] ($STEP_NAME: $took s)"
  fi
  STEP_NAME="$1"
  STEP_START=$SECONDS
  if [ -n "$1" ]; then echo "[test] $1"; fi
}

step "setup"
"$ROOT/tools/setup.sh"

# Ninja where it is installed (tools/setup.sh installs it): it starts the next compile
# the moment one ends and scans no Makefiles. A build directory keeps the generator it
# was made with (CMake refuses to switch one in place).
generator_args() {
  local cache="$1/CMakeCache.txt"
  if [ -f "$cache" ]; then
    grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$cache" && echo "-GNinja"
  elif command -v ninja >/dev/null 2>&1; then
    echo "-GNinja"
  fi
  return 0
}

step "Release build"
# CUDA code is compiled (where nvcc is installed) for sm_90 only, the H100/H200 the GPU
# checks run on: the test build checks that it compiles, and a second architecture
# (CMakeLists.txt builds 80 and 90 by default) doubled nvcc's 130 s of compile time.
cmake -S "$ROOT" -B "$ROOT/build" $(generator_args "$ROOT/build") -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$ROOT/build" -j"$JOBS"
echo "[test] all tests (Release)"
echo "[test] CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); flags: $(grep -o -w -E 'avx2|avx512f|avx512bf16|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
# The ".isa_avx2" copies of the arithmetic's model tests re-run them capped to AVX2; on a CPU whose
# best variant already is AVX2 (no AVX-512) they would repeat the same runs, so skip them.
NOT_UNIT='^unit$'
if ! grep -q -w avx512f /proc/cpuinfo; then
  echo "[test] no AVX-512 here: the best kernel variant is avx2 already; skipping the duplicate .isa_avx2 runs"
  NOT_UNIT='^unit$|isa_avx2'
fi

# The ASan+UBSan build (clang; the fuzzers share it) starts now, in the background, in
# the idle scheduling class (chrt --idle): a core runs it only when nothing else wants
# that core, and a test's thread that wakes takes the core back at once. The model
# tests below leave about 0.6 of the 2 cores idle on average (they wait on processes,
# sockets, timers and disks: 1,615 s of user time in 1,202 s on a 2-core Xeon), and the
# sanitizer build, ~14 minutes on its own, uses that time instead of coming after.
ASAN_PID=""
if [ "${BLENDSERVE_SKIP_SANITIZE:-0}" != "1" ]; then
  # A build-asan/ configured with another compiler (GCC, before the fuzzers shared it)
  # cannot switch in place: start it afresh.
  if [ -f "$ROOT/build-asan/CMakeCache.txt" ] &&
     ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' "$ROOT/build-asan/CMakeCache.txt"; then
    rm -rf "$ROOT/build-asan"
  fi
  mkdir -p "$ROOT/build-asan"
  ASAN_LOG="$ROOT/build-asan/build.log"
  (
    # The idle class before anything starts: the compilers inherit it. Where it is
    # refused (it never is for lowering one's own priority on Linux), nice 19.
    chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
    # The same configuration as the fuzz scripts (tools/ci/fuzz_lib.sh).
    CC=clang CXX=clang++ cmake -S "$ROOT" -B "$ROOT/build-asan" $(generator_args "$ROOT/build-asan") \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLENDSERVE_SANITIZE=ON -DBLENDSERVE_FUZZ=ON
    # Only what runs under the sanitizers (tests/CMakeLists.txt: sanitizer_tests) and the fuzzers.
    cmake --build "$ROOT/build-asan" -j"$JOBS" --target sanitizer_tests fuzz_gguf fuzz_chat_request \
      fuzz_remote_frame fuzz_pasted_prompt fuzz_config fuzz_kv_file fuzz_text_input fuzz_control_wire \
      fuzz_safetensors fuzz_chat_template
  ) >"$ASAN_LOG" 2>&1 &
  ASAN_PID=$!
  # A failing step below ends this script: the background build (the subshell, CMake,
  # Ninja and its compilers) ends with it.
  kill_tree() {
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
  }
  trap '[ -z "$ASAN_PID" ] || kill_tree "$ASAN_PID"' EXIT
  echo "[test] ASan+UBSan build started in the background (idle class; log: build-asan/build.log)"
fi

# The unit tests in parallel (those that bound a time are RUN_SERIAL: tests/CMakeLists.txt),
# then everything else one at a time: the model tests measure TTFT and throughput against
# each other and need the machine's cores to themselves (the background build above
# takes none that a test wants).
step "unit tests (Release)"
ctest --test-dir "$ROOT/build" --output-on-failure --no-tests=error -L '^unit$' -j"$JOBS"
step "model, peer and GPU tests (Release)"
ctest --test-dir "$ROOT/build" --output-on-failure --no-tests=error -LE "$NOT_UNIT" -j1

if [ -n "$ASAN_PID" ]; then
  step "ASan+UBSan build (the rest of it: it ran beside the model tests until now)"
  if ! wait "$ASAN_PID"; then
    ASAN_PID=""
    cat "$ASAN_LOG"
    echo "[test] the ASan+UBSan build FAILED (log: build-asan/build.log)"
    exit 1
  fi
  ASAN_PID=""
  tail -n 3 "$ASAN_LOG"
  step "unit tests and the actor runtime under ASan+UBSan"
  # oneDNN's JIT and OpenMP runtime are not instrumented; leak checks stay on.
  # In parallel: most of these are single-threaded under the sanitizers; the unit tests
  # that bound a time are RUN_SERIAL (tests/CMakeLists.txt), and the few model tests here
  # check behaviour, not speed.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$ROOT/build-asan" --output-on-failure --no-tests=error -L 'unit|asan_model' -j"$JOBS"
  # Each fuzzer is one process: as many side by side as there are cores, each for the
  # full time (built above, so FUZZ_PREBUILT). A fuzzer's whole output is printed when it
  # fails, its last lines (final stats) when it does not.
  FUZZ_SECONDS="${BLENDSERVE_FUZZ_SECONDS:-20}"
  FUZZERS=(fuzz_gguf fuzz_chat_request fuzz_remote_frame fuzz_pasted_prompt fuzz_config fuzz_kv_file fuzz_text_input
    fuzz_control_wire fuzz_safetensors fuzz_chat_template)
  FUZZ_FAILED=0
  step "fuzzing the GGUF reader, the safetensors reader, the chat-completion request parser, the remote tier's frame codec, the pasted-passage search, the YAML loaders, the SSD file reader, the tokenizer with the chat template, the control plane's messages and chat templates' Jinja"
  for ((first = 0; first < ${#FUZZERS[@]}; first += JOBS)); do
    PIDS=()
    BATCH=("${FUZZERS[@]:first:JOBS}")
    echo "[test] fuzzing for $FUZZ_SECONDS s, side by side: ${BATCH[*]}"
    for f in "${BATCH[@]}"; do
      FUZZ_PREBUILT=1 "$ROOT/tools/ci/$f.sh" "$FUZZ_SECONDS" >"$ROOT/build-asan/$f.log" 2>&1 &
      PIDS+=($!)
    done
    for i in "${!BATCH[@]}"; do
      f="${BATCH[$i]}"
      if wait "${PIDS[$i]}"; then
        tail -n 12 "$ROOT/build-asan/$f.log"
      else
        cat "$ROOT/build-asan/$f.log"
        echo "[test] $f FAILED (log: build-asan/$f.log)"
        FUZZ_FAILED=1
      fi
    done
  done
  [ "$FUZZ_FAILED" = 0 ]
fi
step ""
printf '[test] time per step:'
printf ' %s;' "${STEP_TIMES[@]}"
echo " total $SECONDS s"
