#!/usr/bin/env bash
# tools/ci/fuzz_kv_file.sh — build and run the libFuzzer target for the SSD tier's file
# reader (tests/fuzz/fuzz_kv_file.cpp, storage/disk_store.*): any content of a .bskv
# file is served with its header's shape and checksummed bytes, or is a miss that
# removes it — never a crash, an out-of-bounds read or an absurd allocation.
#
#   tools/ci/fuzz_kv_file.sh [SECONDS] [extra libFuzzer flags...]
#
# Seeds: valid entries (f32, f16, bf16) the target itself writes through DiskKvStore
# (BLENDSERVE_FUZZ_SEED_DIR), so mutations start from files that pass every check.
# Builds and runs through tools/ci/fuzz_lib.sh; exits non-zero when the fuzzer finds a
# crash, leak, timeout or out-of-memory.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_kv_file "$@"

BLENDSERVE_FUZZ_SEED_DIR="$CORPUS" "$BUILD/fuzz_kv_file" -runs=0 "$CORPUS" >/dev/null 2>&1 ||
  { log "writing the seed entries failed"; exit 1; }

fuzz_run -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10
