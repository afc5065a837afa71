#!/usr/bin/env python3
"""One-off generator of the dequantization fixtures (run by hand; CI reads its output).

Dequantizes with the independent reference implementation in gguf-py (`pip install
gguf`; numpy code, unrelated to ours) and records:
  tests/fixtures/dequant_reference.json         slices of rows of the default model
                                                 (Q4_1, Q8_0, F32)
  tests/fixtures/dequant_reference_gemma3.json  slices of rows of Gemma 3 270M Q4_K_M
                                                 (Q5_0, Q4_K, Q6_K, Q8_0, F32): real
                                                 K-quant files as llama.cpp writes them
  tests/fixtures/dequant_blocks_reference.json  random blocks of every block type we
                                                 read (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
                                                 Q4_K, Q5_K, Q6_K), bytes and values:
                                                 every bit of every field exercised,
                                                 Q5_K and Q5_1 included, which the two
                                                 files do not hold
tests/test_gguf.cpp checks that bs::kernels' dequantization reproduces every value
bit for bit.

Usage: tools/make_dequant_fixture.py [--smollm2 F.gguf] [--gemma3 F.gguf]
"""
import argparse
import json
import os

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

# tensor name -> rows to sample
SMOLLM2_PICKS = {
    "blk.0.attn_q.weight": [0, 287, 575],      # Q4_1, 576 x 576
    "blk.29.ffn_down.weight": [0, 300, 575],   # Q4_1, rows of 1536
    "token_embd.weight": [0, 1, 24576, 49151],  # Q8_0, 576 x 49152
    "blk.0.attn_norm.weight": [0],             # F32, one row of 576
    "output_norm.weight": [0],                 # F32
}
GEMMA3_PICKS = {
    "blk.0.attn_q.weight": [0, 511, 1023],     # Q5_0, rows of 640
    "blk.0.attn_output.weight": [0, 320, 639],  # Q4_K, rows of 1024
    "blk.0.ffn_down.weight": [0, 320, 639],    # Q6_K, rows of 2048
    "blk.17.ffn_down.weight": [7],             # Q6_K, the last layer
    "blk.0.attn_v.weight": [0, 255],           # Q8_0
    "token_embd.weight": [0, 2, 131072, 262143],  # Q8_0, 640 x 262144
    "blk.0.attn_q_norm.weight": [0],           # F32
}

# type -> (block bytes, byte offsets of its fp16 scale fields)
BLOCKS = {
    "Q4_0": (18, [0]),
    "Q4_1": (20, [0, 2]),
    "Q5_0": (22, [0]),
    "Q5_1": (24, [0, 2]),
    "Q8_0": (34, [0]),
    "Q4_K": (144, [0, 2]),
    "Q5_K": (176, [0, 2]),
    "Q6_K": (210, [208]),
}


def row_slices(model, picks):
    reader = GGUFReader(model)
    by_name = {t.name: t for t in reader.tensors}
    tensors = []
    for name, rows in picks.items():
        t = by_name[name]
        full = dequantize(t.data, t.tensor_type).astype(np.float32)
        ne0 = int(t.shape[0])  # ggml order: shape[0] is the row length
        full = full.reshape(-1, ne0)
        entry = {"name": name, "type": t.tensor_type.name, "dims": [int(d) for d in t.shape], "rows": []}
        for r in rows:
            row = full[r]
            mid = (ne0 // 2) // 32 * 32
            slices = [(0, 64), (mid, 64), (ne0 - 32, 32)]
            entry["rows"].append({
                "row": r,
                "slices": [{"start": s, "values": [float(v) for v in row[s:s + n]]} for s, n in slices],
            })
        tensors.append(entry)
    return {
        "generator": "tools/make_dequant_fixture.py (gguf-py GGUFReader + gguf.dequantize)",
        "model": os.path.basename(model),
        "tensors": tensors,
    }


def random_blocks(seed=20261201, per_type=6):
    rng = np.random.default_rng(seed)
    types = []
    for name, (nbytes, scale_at) in BLOCKS.items():
        raw = rng.integers(0, 256, size=(per_type, nbytes), dtype=np.uint8)
        # Finite scales of either sign over a wide range (fp16 subnormals included);
        # every other byte (quants, packed scales, high bits) stays uniformly random.
        for b in range(per_type):
            for at in scale_at:
                v = np.float16(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-26, 2))
                raw[b, at:at + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        values = dequantize(raw.reshape(-1), GGMLQuantizationType[name]).astype(np.float32)
        types.append({
            "type": name,
            "blocks": per_type,
            "bytes": raw.tobytes().hex(),
            "values": [float(v) for v in values.reshape(-1)],
        })
    return {"generator": "tools/make_dequant_fixture.py (random blocks, gguf.dequantize)", "types": types}


def write(doc, name):
    out = os.path.join(FIXTURES, name)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--gemma3", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    args = ap.parse_args()
    write(row_slices(args.smollm2, SMOLLM2_PICKS), "dequant_reference.json")
    write(row_slices(args.gemma3, GEMMA3_PICKS), "dequant_reference_gemma3.json")
    write(random_blocks(), "dequant_blocks_reference.json")


if __name__ == "__main__":
    main()
