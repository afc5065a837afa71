#!/usr/bin/env bash
# tools/ci/fuzz_remote_frame.sh — build and run the libFuzzer target for the remote-disk
# tier's frame codec (tests/fuzz/fuzz_remote_frame.cpp, storage/remote_protocol.*).
#
#   tools/ci/fuzz_remote_frame.sh [SECONDS] [extra libFuzzer flags...]
#
# Builds and runs through tools/ci/fuzz_lib.sh (build-asan: clang, ASan+UBSan,
# coverage hooks); seeds a corpus with valid frames of several types. Exits non-zero
# when the fuzzer finds a crash, leak or timeout; the reproducer is in
# build-asan/fuzz_remote_frame_artifacts/.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_remote_frame "$@"

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

fuzz_run -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
