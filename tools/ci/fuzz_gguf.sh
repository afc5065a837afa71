#!/usr/bin/env bash
# tools/ci/fuzz_gguf.sh — build and run the libFuzzer target for the GGUF reader.
#
#   tools/ci/fuzz_gguf.sh [SECONDS] [extra libFuzzer flags...]
#
# Configures the sanitizer build directory (build-asan, or $BUILD_DIR) with clang,
# -DBLENDSERVE_SANITIZE=ON and -DBLENDSERVE_FUZZ=ON, builds the fuzz_gguf target, seeds a
# corpus with small synthetic GGUF files (and the first 64 KiB of the default model when present), then
# fuzzes for SECONDS (default 60) with -max_total_time. Exits non-zero when the fuzzer
# finds a crash, leak, timeout or out-of-memory; the reproducer is written to
# build-asan/fuzz_gguf_artifacts/ (rerun it with: build-asan/fuzz_gguf FILE).
#
# Environment: BUILD_DIR, JOBS (default 2), BLENDSERVE_CMAKE_ARGS (extra cmake arguments,
# word-split), FUZZ_FORKS (run N parallel jobs with -fork=N; default: one process).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_gguf "$@"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# ---- seed corpus ------------------------------------------------------------------------
python3 - "$CORPUS" <<'PY'
import struct, sys, os

out = sys.argv[1]

def s(x: bytes) -> bytes:
    return struct.pack("<Q", len(x)) + x

def kv(key, vtype, payload):
    return s(key.encode()) + struct.pack("<I", vtype) + payload

def arr(etype, items):
    return struct.pack("<IQ", etype, len(items)) + b"".join(items)

def gguf(version, kvs, tensors, data, alignment=32):
    h = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    for name, dims, ttype, off in tensors:
        h += s(name.encode()) + struct.pack("<I", len(dims))
        h += b"".join(struct.pack("<Q", d) for d in dims)
        h += struct.pack("<IQ", ttype, off)
    h += b"\0" * (-len(h) % alignment)
    return h + data

kvs = [
    kv("general.architecture", 8, s(b"llama")),
    kv("llama.block_count", 4, struct.pack("<I", 2)),
    kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
    kv("test.f64", 12, struct.pack("<d", 0.5)),
    kv("test.i64", 11, struct.pack("<q", -7)),
    kv("test.u64", 10, struct.pack("<Q", 2**63 + 5)),
    kv("test.i8", 1, struct.pack("<b", -3)),
    kv("test.u16", 2, struct.pack("<H", 65535)),
    kv("tokenizer.ggml.add_bos_token", 7, b"\x01"),
    kv("tokenizer.ggml.tokens", 9, arr(8, [s(b"<s>"), s(b"a"), s(b"")])),
    kv("tokenizer.ggml.token_type", 9, arr(5, [struct.pack("<i", v) for v in (3, 1, 1)])),
    kv("tokenizer.ggml.scores", 9, arr(6, [struct.pack("<f", v) for v in (0.0, -1.5, 2.0)])),
    kv("test.bools", 9, arr(7, [b"\x00", b"\x01"])),
]

def blk_q4_0(): return struct.pack("<H", 0x3800) + bytes(range(16))
def blk_q4_1(): return struct.pack("<HH", 0x3400, 0xbc00) + bytes(range(16, 32))
def blk_q8_0(): return struct.pack("<H", 0x4000) + bytes((i * 7) & 0xff for i in range(32))

# (name, dims, type, payload)
items = [
    ("f32", [4, 2], 0, struct.pack("<8f", *range(8))),
    ("f16", [8], 1, struct.pack("<8H", 0x3c00, 0xc000, 0x7bff, 1, 0x8000, 0x7c00, 0x3555, 0)),
    ("bf16", [4], 30, struct.pack("<4H", 0x3f80, 0xc0a0, 0x7fc0, 0)),
    ("q4_0", [32, 2], 2, blk_q4_0() * 2),
    ("q4_1", [64], 3, blk_q4_1() * 2),
    ("q8_0", [32, 1, 1, 1], 8, blk_q8_0()),
]
tensors, data = [], b""
for name, dims, ttype, payload in items:
    data += b"\0" * (-len(data) % 32)
    tensors.append((name, dims, ttype, len(data)))
    data += payload

seeds = {
    "valid_v3.gguf": gguf(3, kvs, tensors, data),
    "valid_v2.gguf": gguf(2, kvs[:3], tensors[:2], data[:64]),
    "align64.gguf": gguf(3, [kv("general.alignment", 4, struct.pack("<I", 64))],
                         [("t", [16], 0, 64)], b"\0" * 128, alignment=64),
    "empty.gguf": gguf(3, [], [], b""),
    "meta_only.gguf": gguf(3, kvs, [], b""),
}
for name, blob in seeds.items():
    with open(os.path.join(out, "seed_" + name), "wb") as f:
        f.write(blob)
PY
if [ -f "$MODEL" ]; then
  head -c 65536 "$MODEL" >"$CORPUS/seed_real_head_64k.gguf"
fi

fuzz_dict <<'EOF'
"GGUF"
"general.alignment"
"general.architecture"
"llama"
"tokenizer.ggml.tokens"
"blk.0.attn_q.weight"
"token_embd.weight"
"\x20\x00\x00\x00"
"\x40\x00\x00\x00"
"\xff\xff\xff\xff\xff\xff\xff\xff"
"\x00\x00\x00\x00\x00\x00\x00\x80"
EOF

# ---- run --------------------------------------------------------------------------------
fuzz_run -dict="$DICT" -max_len=131072 -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1
