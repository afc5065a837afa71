#!/usr/bin/env python3
"""One-off generator of tests/fixtures/dequant_reference.json.

Dequantizes a few tensors of the default model with the independent reference
implementation in gguf-py (`pip install gguf`; numpy code, unrelated to ours) and
records slices of specific rows. tests/test_gguf.cpp checks that bs::gguf's
dequantization reproduces these values exactly.

Usage: tools/make_dequant_fixture.py [MODEL.gguf] [OUT.json]
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader, dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "fixtures", "dequant_reference.json")

# tensor name -> rows to sample
PICKS = {
    "blk.0.attn_q.weight": [0, 287, 575],      # Q4_1, 576 x 576
    "blk.29.ffn_down.weight": [0, 300, 575],   # Q4_1, rows of 1536
    "token_embd.weight": [0, 1, 24576, 49151],  # Q8_0, 576 x 49152
    "blk.0.attn_norm.weight": [0],             # F32, one row of 576
    "output_norm.weight": [0],                 # F32
}


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else MODEL
    out = sys.argv[2] if len(sys.argv) > 2 else OUT
    reader = GGUFReader(model)
    by_name = {t.name: t for t in reader.tensors}
    tensors = []
    for name, rows in PICKS.items():
        t = by_name[name]
        full = dequantize(t.data, t.tensor_type).astype(np.float32)
        ne0 = int(t.shape[0])  # ggml order: shape[0] is the row length
        full = full.reshape(-1, ne0)
        entry = {
            "name": name,
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "rows": [],
        }
        for r in rows:
            row = full[r]
            mid = (ne0 // 2) // 32 * 32
            slices = [(0, 64), (mid, 64), (ne0 - 32, 32)]
            entry["rows"].append({
                "row": r,
                "slices": [
                    {"start": s, "values": [float(v) for v in row[s:s + n]]}
                    for s, n in slices
                ],
            })
        tensors.append(entry)
    doc = {
        "generator": "tools/make_dequant_fixture.py (gguf-py GGUFReader + gguf.dequantize)",
        "model": os.path.basename(model),
        "tensors": tensors,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
