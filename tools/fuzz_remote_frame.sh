#!/usr/bin/env bash
# tools/fuzz_remote_frame.sh — build and run the libFuzzer target for the remote-disk
# tier's frame codec (tests/fuzz/fuzz_remote_frame.cpp, storage/remote_protocol.*).
#
#   tools/fuzz_remote_frame.sh [SECONDS] [extra libFuzzer flags...]
#
# Same build directory and flags as tools/fuzz_gguf.sh (build-asan: clang, ASan+UBSan,
# coverage hooks); seeds a corpus with valid frames of several types. Exits non-zero
# when the fuzzer finds a crash, leak or timeout; the reproducer is in
# build-asan/fuzz_remote_frame_artifacts/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TO_RUN="${1:-60}"
shift || true
BUILD="${BUILD_DIR:-$ROOT/build-asan}"
JOBS="${JOBS:-2}"

log() { printf '[fuzz_remote_frame] %s\n' "$*"; }
case "$SECONDS_TO_RUN" in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS] [libFuzzer flags...]" >&2; exit 2 ;;
esac

mkdir -p "$BUILD"
# shellcheck disable=SC2086
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLENDSERVE_FUZZ=ON -DBLENDSERVE_SANITIZE=ON \
  ${BLENDSERVE_CMAKE_ARGS:-} >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; log "cmake configure failed"; exit 1; }
log "building fuzz_remote_frame in $BUILD"
cmake --build "$BUILD" --target fuzz_remote_frame -j "$JOBS"

CORPUS="$BUILD/fuzz_remote_frame_corpus"
ARTIFACTS="$BUILD/fuzz_remote_frame_artifacts"
mkdir -p "$CORPUS" "$ARTIFACTS"
# Frames: u32 little-endian payload length, u8 type, payload (storage/remote_protocol.h).
# PING; RESULT 1; READ(handle 1, layer 2); CLOSE(7); OPEN(key); ERROR "x";
# ENTRY(handle 1, f16, 1 layer, 1 head, head dim 1, 1 token, 1 sum); STATS_REPLY zeros.
printf '\000\000\000\000\021' >"$CORPUS/ping"
printf '\001\000\000\000\013\001' >"$CORPUS/result"
printf '\010\000\000\000\007\001\000\000\000\002\000\000\000' >"$CORPUS/read"
printf '\004\000\000\000\011\007\000\000\000' >"$CORPUS/close"
printf '\020\000\000\000\004\001\002\003\004\005\006\007\010\011\012\013\014\015\016\017\020' >"$CORPUS/open"
printf '\001\000\000\000\020x' >"$CORPUS/error"
printf '\050\000\000\000\005\001\000\000\000\001\000\000\000\001\000\000\000\001\000\000\000\001\000\000\000\001\000\000\000\000\000\000\000\005\000\000\000\021\042\063\104\125\146\167\210' >"$CORPUS/entry"
{ printf '\100\000\000\000\017'; head -c 64 /dev/zero; } >"$CORPUS/stats"
cat "$CORPUS/read" "$CORPUS/entry" "$CORPUS/ping" >"$CORPUS/stream"

log "fuzzing for ${SECONDS_TO_RUN}s (corpus $CORPUS)"
set +e
"$BUILD/fuzz_remote_frame" -max_total_time="$SECONDS_TO_RUN" -artifact_prefix="$ARTIFACTS/" \
  -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "$@" "$CORPUS"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  log "FAILED (exit $rc); reproducers in $ARTIFACTS:"
  ls -l "$ARTIFACTS" >&2 || true
  exit "$rc"
fi
log "no crashes in ${SECONDS_TO_RUN}s"
