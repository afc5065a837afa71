#!/usr/bin/env bash
# tools/ci/fuzz_control_wire.sh — build and run the libFuzzer target for the control
# plane's messages (tests/fuzz/fuzz_control_wire.cpp, actors/cluster/control_wire.*).
#
#   tools/ci/fuzz_control_wire.sh [SECONDS] [extra libFuzzer flags...]
#
# Builds and runs through tools/ci/fuzz_lib.sh (build-asan: clang, ASan+UBSan,
# coverage hooks); seeds a corpus with a valid request, a full report, a delta and
# an error reply. Exits non-zero when the fuzzer finds a crash, leak or timeout; the
# reproducer is in build-asan/fuzz_control_wire_artifacts/.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_control_wire "$@"

printf '%s' '{"from":"frontend","to":"worker-1","unix_ms":1764300000000,"proof":"ab12","holdings_epoch":7,"holdings_base":3}' >"$CORPUS/request"
printf '%s' '{"ok":true,"report":{"node":"worker-1","role":"worker","in_flight":1,"queued":0,"max_requests":8,"max_queue":16,"fingerprint":42,"prelude":[1,2,3],"uses_storage":true,"chunks_held":2,"store_bytes":0,"store_entries":0,"store_budget":0,"holdings":{"epoch":7,"base":0,"version":1,"full":true,"added":["00000000000000010000000000000002","00000000000000050000000000000006"],"removed":[]}}}' >"$CORPUS/full"
printf '%s' '{"ok":true,"report":{"node":"storage","role":"storage","in_flight":0,"queued":0,"max_requests":0,"max_queue":0,"fingerprint":0,"prelude":[],"uses_storage":false,"chunks_held":1,"store_bytes":4096,"store_entries":1,"store_budget":65536,"holdings":{"epoch":7,"base":1,"version":2,"full":false,"added":["00000000000000070000000000000008"],"removed":["00000000000000050000000000000006"]}}}' >"$CORPUS/delta"
printf '%s' '{"ok":false,"error":"control request refused"}' >"$CORPUS/error"

fuzz_run -max_len=4096 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
