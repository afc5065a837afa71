#!/usr/bin/env bash
# tools/ci/fuzz_safetensors.sh — build and run the libFuzzer target for the safetensors
# reader (model/safetensors.h: Hugging Face checkpoints' weight files).
#
#   tools/ci/fuzz_safetensors.sh [SECONDS] [extra libFuzzer flags...]
#
# As tools/ci/fuzz_gguf.sh: the sanitizer build (build-asan, or $BUILD_DIR), a corpus seeded
# with small synthetic files and the head of a real checkpoint's
# (tests/fixtures/arch/llama.hf/model.safetensors), SECONDS of fuzzing (default 60);
# non-zero exit on a crash, leak, timeout or out-of-memory, the reproducer in
# build-asan/fuzz_safetensors_artifacts/.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_safetensors "$@"

python3 - "$CORPUS" <<'PY'
import json, os, struct, sys

out = sys.argv[1]

def st(header, data):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data

seeds = {
    "valid.safetensors": st({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                             "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]},
                             "c": {"dtype": "BF16", "shape": [], "data_offsets": [24, 26]},
                             "__metadata__": {"format": "pt"}}, bytes(range(26))),
    "empty.safetensors": st({}, b""),
    "i64.safetensors": st({"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
}
for name, blob in seeds.items():
    with open(os.path.join(out, "seed_" + name), "wb") as f:
        f.write(blob)
PY
REAL="$ROOT/tests/fixtures/arch/llama.hf/model.safetensors"
if [ -f "$REAL" ]; then
  head -c 65536 "$REAL" >"$CORPUS/seed_real_head_64k.safetensors"
fi

fuzz_dict <<'DICT_END'
"dtype"
"shape"
"data_offsets"
"__metadata__"
"F32"
"F16"
"BF16"
"\x00\x00\x00\x00\x00\x00\x00\x00"
"\xff\xff\xff\xff\xff\xff\xff\xff"
DICT_END

fuzz_run -dict="$DICT" -max_len=131072 -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1
