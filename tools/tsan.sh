#!/usr/bin/env bash
# tools/tsan.sh — the actor runtime's tests under ThreadSanitizer.
#
#   tools/tsan.sh [ctest -R regex]       (default: every test named below)
#
# Not part of the test command (18 min on 2 cores the first time: CAF ~3 min, our code
# ~4 min, the tests ~11 min under TSan's slowdown); run it after changing who touches
# what in actors/, and record what it printed.
#
# 1. CAF 0.17.6 built with -fsanitize=thread into build-tsan/caf (once). Debian's
#    libcaf_core is not instrumented: its mailboxes hand messages between threads with
#    atomics TSan cannot see, so every message would be reported as a race. The source
#    is Debian's own source package of libcaf-dev (apt-get source actor-framework, from a
#    private deb-src list: the machine's apt configuration is not touched).
# 2. Our runtime tests in build-tsan/ (clang, -O1, BLENDSERVE_TSAN=ON) linked to it.
# 3. The tests, one process each, with tools/tsan.supp (only for libraries we cannot
#    instrument, each with its reason) and OMP_NUM_THREADS=1 (the kernels' and oneDNN's
#    OpenMP teams use runtimes built without TSan; one thread keeps their barriers out
#    of the picture; the runtime's own threads are what is under test).
# Exits non-zero when a test fails or TSan reports anything; the reports are in
# build-tsan/tsan-logs/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-tsan"
CAF_VERSION="0.17.6"
CAF_PREFIX="$BUILD/caf/prefix"
JOBS="${JOBS:-$(nproc)}"
FILTER="${1:-}"
log() { printf '[tsan] %s\n' "$*" >&2; }

"$ROOT/tools/setup.sh" >&2

# ---- 1. CAF with TSan -------------------------------------------------------------------
if [ ! -f "$CAF_PREFIX/lib/libcaf_core.so" ]; then
  mkdir -p "$BUILD/caf/apt/lists/partial" "$BUILD/caf/src"
  echo "deb-src http://deb.debian.org/debian bookworm main" >"$BUILD/caf/apt/sources.list"
  APT_OPTS=(-o "Dir::Etc::sourcelist=$BUILD/caf/apt/sources.list" -o "Dir::Etc::sourceparts=-"
            -o "Dir::State::Lists=$BUILD/caf/apt/lists" -o "APT::Sandbox::User=root")
  log "fetching Debian's source package of CAF $CAF_VERSION"
  apt-get "${APT_OPTS[@]}" update -qq
  # The upstream tarball is what is needed (the mirror here serves no Debian patch
  # tarball; the one fix this compiler needs, a missing include, is made below).
  (cd "$BUILD/caf/src" && apt-get "${APT_OPTS[@]}" source --download-only -qq "actor-framework=$CAF_VERSION-2.1" ||
     [ -f "actor-framework_$CAF_VERSION.orig.tar.gz" ])
  tar xzf "$BUILD/caf/src/actor-framework_$CAF_VERSION.orig.tar.gz" -C "$BUILD/caf/src"
  log "building CAF $CAF_VERSION core+io with -fsanitize=thread (~6 min on 2 cores)"
  # libstdc++ as in our build (CAF would pick libc++ under clang otherwise); <limits>
  # forced in, as Debian's patch does (receive_buffer.hpp uses it without including it).
  CC=clang CXX=clang++ cmake -S "$BUILD/caf/src/actor-framework-$CAF_VERSION" -B "$BUILD/caf/build" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -g1 -include limits" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_INSTALL_PREFIX="$CAF_PREFIX" \
    -DCAF_NO_AUTO_LIBCPP=yes -DCAF_NO_EXAMPLES=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_TOOLS=yes \
    -DCAF_NO_PYTHON=yes -DCAF_NO_OPENCL=yes -DCAF_NO_OPENSSL=yes -DCAF_NO_SUMMARY=yes >"$BUILD/caf/configure.log" 2>&1 ||
    { cat "$BUILD/caf/configure.log" >&2; exit 1; }
  cmake --build "$BUILD/caf/build" -j"$JOBS" >&2
  cmake --install "$BUILD/caf/build" >/dev/null
fi

# ---- 2. our runtime tests -----------------------------------------------------------------
TARGETS=(caf_test_actor_protocol test_compute_thread test_blend_runtime test_blend_loaders
         test_blend_prefill_cancel test_blend_batching test_document_interleave test_server
         test_blend_runtime_tensor_parallel test_server_supervision test_blend_streams test_stream_delivery
         test_remote_store test_remote_store_peers test_remote_tls test_remote_replication test_cluster_control)
log "building the runtime tests with -fsanitize=thread"
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLENDSERVE_TSAN=ON \
  -DCAF_INCLUDE_DIR="$CAF_PREFIX/include" -DCAF_CORE_LIBRARY="$CAF_PREFIX/lib/libcaf_core.so" \
  -DCMAKE_BUILD_RPATH="$CAF_PREFIX/lib" >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >&2

# ---- 3. the tests -------------------------------------------------------------------------
# What runs: the protocol tests, the compute thread, and the runtime tests that keep
# the model's work small (short prompts); the names say what each checks.
TESTS=(
  "actor_protocol|caf_test_actor_protocol"
  "compute_thread|test_compute_thread"
  "runtime|test_blend_runtime --gtest_filter=Runtime.BadRequests*:Runtime.ACaller*:Runtime.AnEntry*:Runtime.Inspector*:Runtime.ACorrupt*:Runtime.RequestsInFlightTogether*"
  "loaders|test_blend_loaders --gtest_filter=BlendLoaders.ALoaderThatThrows*:BlendLoaders.TwoRequests*:BlendLoaders.ACancelDuring*:BlendLoaders.WriteBacks*"
  "prefill_cancel|test_blend_prefill_cancel"
  "batching|test_blend_batching"
  "server|test_server --gtest_filter=ServerTest.Health*:ServerTest.StreamWithout*:ServerTest.BadInput*:ServerTest.AClientThatLeaves*:ServerTest.ApiKeys*:ServerTest.Draining*"
  "tensor_parallel|test_blend_runtime_tensor_parallel --gtest_filter=TensorParallelRuntime.ARankThatFails*:TensorParallelRuntime.AStoredEntry*:TensorParallelRuntime.ChunksStoredAtThree*:TensorParallelRuntime.RequestsBeyond*"
  "supervision|test_server_supervision"
  "streams|test_blend_streams"
  "stream_delivery|test_stream_delivery"
  "remote_store|test_remote_store --gtest_filter=RemoteStore.*"
  "remote_store_peers|test_remote_store_peers"
  "remote_tls|test_remote_tls"
  "remote_replication|test_remote_replication"
  "cluster_control|test_cluster_control"
)
LOGS="$BUILD/tsan-logs"
rm -rf "$LOGS" && mkdir -p "$LOGS"
failed=0
n=0
total=${#TESTS[@]}
start=$(date +%s)
for t in "${TESTS[@]}"; do
  name="${t%%|*}"
  cmd="${t#*|}"
  n=$((n + 1))
  if [ -n "$FILTER" ] && ! [[ "$name" =~ $FILTER ]]; then continue; fi
  t0=$(date +%s)
  set +e
  # shellcheck disable=SC2086
  (cd "$BUILD" && OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$ROOT/tools/tsan.supp log_path=$LOGS/$name" \
     timeout 1800 ./$cmd >"$LOGS/$name.out" 2>&1)
  rc=$?
  set -e
  reports=$(cat "$LOGS/$name".[0-9]* 2>/dev/null | grep -c "WARNING: ThreadSanitizer" || true)
  el=$(( $(date +%s) - start ))
  log "$n/$total $name: exit $rc, $reports TSan reports, $(( $(date +%s) - t0 )) s (elapsed ${el} s)"
  printf '{"test":"%s","exit":%d,"tsan_reports":%d,"seconds":%d}\n' "$name" "$rc" "$reports" "$(( $(date +%s) - t0 ))"
  if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then failed=1; fi
done
if [ "$failed" -ne 0 ]; then
  log "FAILED: see $LOGS/ (<test>.out: the test's output; <test>.<pid>: TSan's reports)"
  exit 1
fi
log "no data races reported"
