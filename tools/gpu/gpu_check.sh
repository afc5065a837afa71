#!/usr/bin/env bash
# tools/gpu/gpu_check.sh — one command for a bare GPU machine (the device tool's): unpack
# the carried packages into a prefix, build the CUDA tests and the tools, run the tests,
# the op tests under compute-sanitizer memcheck, the GPU benchmarks against PyTorch on
# the same GPU, racecheck and the backend test under memcheck, then a per-kernel profile
# (Nsight Compute) of decode and prefill, and leave in $OUT
# one JSON summary, the benchmarks' JSON lines and one archive of every log.
#
# Here, once:  tools/gpu/fetch_gpu_debs.sh         (into the git-ignored gpu-debs/)
# Then:        device tool `run`, carry ["gpu-debs"],
#              command "GPU_CHECK_BUDGET_S=540 bash tools/gpu/gpu_check.sh", timeout_s 600
#              (tools/README.md, "The GPU check"). Without $OUT it writes to gpu-check-out/.
# Stages:      bash tools/gpu/gpu_check.sh [build] [tests] [sanitize] [bench] [profile]   (default: all;
#              a later call on the same warm machine reuses build-gpu/).
# Budget:      GPU_CHECK_BUDGET_S=N ends the whole check within N seconds: every step
#              runs under `timeout` with what is left (and its own cap), the steps run in
#              the order of what matters most (build, tests, memcheck of the ops, the
#              benchmarks with their PyTorch peer beside each, racecheck, memcheck of
#              the backend, the profile), and a step that no longer fits is recorded
#              "no_time". A device lease is ~15 minutes, machine start included: one
#              call must do it all.
#
# What comes back: the device tool returns at most 8 files, so $OUT holds
# gpu_check.json (the summary: each step's result and seconds), bench.jsonl (every
# benchmark's JSON lines, ours and PyTorch's), machine.txt and gpu_check_logs.tgz (every
# step's log); the archive is written on every exit, also when a step was cut short.
#
# That machine has nvcc, CMake and PyTorch but none of our Debian packages: they are
# unpacked with `dpkg -x` (or ar + tar where dpkg is missing) into $PREFIX
# (/tmp/blendserve-deps), never into /, and found through CMAKE_PREFIX_PATH, CPATH,
# LIBRARY_PATH, LD_LIBRARY_PATH and pkg-config's sysroot. The model file does not
# travel (over the 64 MiB per call): the CPU reference backend on the same machine is
# the reference of the CUDA ops. Progress on stderr; the summary on stdout and in
# $OUT/gpu_check.json. Exit status: 0 when every step passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/gpu-check-out}"
LOGS="$OUT/logs"   # packed into $OUT/gpu_check_logs.tgz on exit
PREFIX="${BLENDSERVE_DEPS_PREFIX:-/tmp/blendserve-deps}"
BUILD="$ROOT/build-gpu"
BUDGET="${GPU_CHECK_BUDGET_S:-0}"   # 0: no overall limit
START=$(date +%s)
mkdir -p "$OUT" "$LOGS"
log() { printf '[gpu-check %4ds] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }
declare -A RESULT SECS
ORDER=()
STAGES="${*:-build tests sanitize bench profile}"
want() { [[ " $STAGES " == *" $1 "* ]]; }

pack_logs() {
  cat "$LOGS"/bench_*.jsonl >"$OUT/bench.jsonl" 2>/dev/null || true
  tar -czf "$OUT/gpu_check_logs.tgz" -C "$LOGS" . 2>/dev/null && rm -rf "$LOGS"
}
trap pack_logs EXIT

{ nvidia-smi; nvcc --version; cmake --version; g++ --version; ldd --version; cat /etc/os-release;
  lscpu | grep -E 'Model name|^CPU\(s\)'; } >"$OUT/machine.txt" 2>&1
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
    log "no gpu-debs/*.deb: run tools/gpu/fetch_gpu_debs.sh here and carry gpu-debs"
    echo '{"gpu_check":"error","reason":"no gpu-debs carried"}' | tee "$OUT/gpu_check.json"
    exit 2
  fi
  mkdir -p "$PREFIX"
  for f in "${debs[@]}"; do unpack_deb "$f" || { log "unpacking $f failed"; exit 2; }; done
  touch "$PREFIX/.unpacked"
  log "unpacked ${#debs[@]} packages into $PREFIX"
fi
LIB="$PREFIX/usr/lib/x86_64-linux-gnu"
LIB2="$PREFIX/lib/x86_64-linux-gnu"   # where some packages (libncurses6, libtinfo6) put their .so.N
export CMAKE_PREFIX_PATH="$PREFIX/usr"
export CPATH="$PREFIX/usr/include:$PREFIX/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
export LIBRARY_PATH="$LIB:$LIB2${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$LIB:$LIB2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
export PKG_CONFIG_LIBDIR="$LIB/pkgconfig:$PREFIX/usr/share/pkgconfig"
PKGCONF="$PREFIX/usr/bin/pkgconf"

STEP_RESERVE_S=5
source "$ROOT/tools/gpu/gpu_step.sh"  # step NAME CAP_S MIN_S COMMAND...

# 2. configure and build the CUDA tests (Hopper only: this machine's GPU)
step configure 120 20 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_LIBRARY_PATH="$LIB" -DCMAKE_INCLUDE_PATH="$PREFIX/usr/include/x86_64-linux-gnu" \
  -DPKG_CONFIG_EXECUTABLE="$PKGCONF"
if want build; then
  [ "${RESULT[configure]}" = pass ] &&
    step build 600 60 cmake --build "$BUILD" -j"$(nproc)" --target cuda_tests blendctl blendserve
else
  [ -x "$BUILD/cuda_test_ops" ] && RESULT[build]=pass  # an earlier call's build
fi
BUILT=false
[ "${RESULT[build]:-}" = pass ] && BUILT=true
SANITIZER=false
command -v compute-sanitizer >/dev/null 2>&1 && SANITIZER=true
want sanitize && ! $SANITIZER && log "compute-sanitizer not found: memcheck/racecheck not run"

# 3. the CUDA tests; the op tests under memcheck
if $BUILT && want tests; then
  step cuda_tests 420 60 ctest --test-dir "$BUILD" -L cuda --output-on-failure
  # On the GPU machine a skipped CUDA test (exit 77: no device seen) is a failure.
  if [ "${RESULT[cuda_tests]}" = pass ] && grep -q '(Skipped)' "$LOGS/cuda_tests.log"; then
    RESULT[cuda_tests]=skipped
    log "cuda_tests: skipped (no CUDA device seen): see cuda_tests.log and machine.txt"
  fi
fi
# --report-api-errors no: the tests provoke out-of-memory on purpose (a device allocation
# must throw bad_alloc), which compute-sanitizer would count as an error; every CUDA call's
# status is checked by our code (BS_CUDA_CHECK), so an unexpected one fails the test itself.
if $BUILT && want sanitize && $SANITIZER; then
  step memcheck 240 30 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$BUILD/cuda_test_ops"
fi

# 4. the benchmarks (issue 19's targets), ours and PyTorch's beside each on the same GPU.
# Random weights in the real shapes, built in memory.
if $BUILT && want bench; then
  BLENDCTL="$BUILD/blendctl"
  TORCH=false
  python3 -c 'import torch' 2>/dev/null && TORCH=true || log "PyTorch not importable: the peer benchmarks not run"
  bench() {  # name, cap seconds, command...: JSON lines to bench_<name>.jsonl
    local name=$1 cap=$2; shift 2
    step "bench_$name" "$cap" 45 sh -c '"$@" >"$0"' "$LOGS/bench_$name.jsonl" "$@"
  }
  bench prefill_8b 240 "$BLENDCTL" --device cuda --model random:llama-3.1-8b bench prefill \
    --lengths 3072 8192 --repeats 3 --decode-context 512 --decode-tokens 32 --decode-batches 1 32
  $TORCH && bench torch_prefill_8b 150 python3 "$ROOT/tools/gpu/peer_torch.py" prefill --model random:llama-3.1-8b \
    --tokens 3072 8192 --repeats 3
  bench decode_1b 150 "$BLENDCTL" --device cuda --model random:llama-3.2-1b bench decode \
    --streams 1 32 --tokens 64 --prompt-tokens 256 --repeats 2
  $TORCH && bench torch_decode_1b 120 python3 "$ROOT/tools/gpu/peer_torch.py" decode --model random:llama-3.2-1b \
    --streams 1 32 --tokens 64 --prompt-tokens 256 --repeats 2
  bench ttft_8b_6 180 "$BLENDCTL" --device cuda --model random:llama-3.1-8b bench ttft --tier ram \
    --chunks 6 --chunk-tokens 512 --requests 2
  bench ttft_8b_20 180 "$BLENDCTL" --device cuda --model random:llama-3.1-8b bench ttft --tier ram \
    --chunks 20 --chunk-tokens 512 --requests 2
  if $TORCH; then
    bench torch_gemm 60 python3 "$ROOT/tools/gpu/peer_torch.py" gemm-peak
    bench torch_check 60 python3 "$ROOT/tools/gpu/peer_torch.py" check --device cuda --dtype bf16
  fi
fi

# 5. the other sanitizer runs (racecheck 9-12 s and the backend under memcheck 3 s on an
# H200) before the profile: correctness first
if $BUILT && want sanitize && $SANITIZER; then
  step racecheck 300 60 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 "$BUILD/cuda_test_ops"
  step memcheck_backend 300 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$BUILD/cuda_test_backend"
fi

# 6. where the time goes on the device: every kernel's time under Nsight Compute (one
# metric, clocks left alone), summed per kernel name, of random:llama-3.2-1b: decode of
# one stream and of 16 (one exact-rows GEMV group), and a prefill of 8,192 tokens.
# Compare the decode sums with the wall time per token of bench_decode_1b: the rest is
# launch and host time. ncu serializes and times every launch, so the runs are short
# (16 streams x 16 tokens did not finish in 120 s on an H200).
if $BUILT && want profile; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    profile() {  # name, command...: the per-kernel summary (CSV) in <name>.log
      local name=$1; shift
      step "$name" 100 40 "$NCU" --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
        --csv "$BUILD/blendctl" --device cuda --model random:llama-3.2-1b "$@"
      # The table on stderr (the device tool's output tail), its JSON lines in the logs.
      [ -s "$LOGS/$name.log" ] && python3 "$ROOT/tools/gpu/ncu_summary.py" "$LOGS/$name.log" --top 12 \
        >"$LOGS/${name}_summary.jsonl" || true
    }
    profile profile_decode_1b_x1 bench decode --streams 1 --tokens 16 --prompt-tokens 16 --repeats 1
    profile profile_decode_1b_x16 bench decode --streams 16 --tokens 4 --prompt-tokens 8 --repeats 1
    profile profile_prefill_1b_8192 bench prefill --lengths 8192 --repeats 1 --decode-context 1 --decode-tokens 1 \
      --decode-batches 1
  else
    log "ncu not found: the profile not taken"
  fi
fi

status=0
json="{\"gpu_check\":\"done\",\"stages\":\"$STAGES\",\"budget_s\":$BUDGET,\"seconds\":$(( $(date +%s) - START ))"
for k in configure build "${ORDER[@]}"; do
  [[ $json == *"\"$k\":"* ]] && continue
  v=${RESULT[$k]:-not_run}
  json+=",\"$k\":\"$v\""
  [ -n "${SECS[$k]:-}" ] && json+=",\"${k}_s\":${SECS[$k]}"
  [ "$v" = pass ] || status=1
done
if want tests && ! $BUILT; then json+=",\"cuda_tests\":\"not_run\""; status=1; fi
json+=",\"gpu\":\"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\"}"
echo "$json" | tee "$OUT/gpu_check.json"
exit $status
