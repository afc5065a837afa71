#!/usr/bin/env python3
"""Hugging Face `tokenizers` (Rust) encoding the prompt `blendctl bench text` encodes, for
issue 58's "no slower than HF tokenizers on the same machine". SmolLM2's tokenizer is
rebuilt from its GGUF exactly as tools/fixtures/make_tokenizer_fixture.py does (the token ids
equal ours: tests/test_tokenizer.cpp); the prompt is the first --dataset case's
documents, each followed by a blank line, then its question. Median and fastest of
--repeats encodes after one warm-up; one JSON object on stdout.

Run by hand in a throwaway venv (CI never installs it):
    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install tokenizers gguf numpy
    /tmp/hf/bin/python tools/bench/bench_tokenize_hf.py [--model F.gguf | --tokenizer-json F] [--dataset tests/data/rag_qa.jsonl]
Set RAYON_NUM_THREADS=1 to compare one thread with one thread (ours encodes on one).
"""
import argparse
import importlib.util
import json
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--dataset", default=os.path.join(ROOT, "tests", "data", "rag_qa.jsonl"))
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--tokenizer-json", help="time this tokenizer.json instead (e.g. Gemma 3's, made from its GGUF "
                    "by transformers' converter as tools/fixtures/make_spm_tokenizer_fixture.py does)")
    args = ap.parse_args()
    if args.tokenizer_json:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(args.tokenizer_json)
        args.model = args.tokenizer_json
    else:
        spec = importlib.util.spec_from_file_location("fixture", os.path.join(ROOT, "tools", "make_tokenizer_fixture.py"))
        fixture = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fixture)
        tok, _ = fixture.build_tokenizer(args.model)
    with open(args.dataset) as f:
        case = json.loads(f.readline())
    prompt = "".join(d + "\n\n" for d in case["documents"]) + case["question"]
    ids = tok.encode(prompt, add_special_tokens=False).ids  # warm-up
    ms = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        tok.encode(prompt, add_special_tokens=False)
        ms.append((time.perf_counter() - t0) * 1e3)
    import tokenizers
    print(json.dumps({"bench": "text_hf_tokenizers", "tokenizers_version": tokenizers.__version__,
                      "model": args.model, "dataset": args.dataset, "prompt_bytes": len(prompt.encode()),
                      "prompt_tokens": len(ids), "repeats": args.repeats,
                      "rayon_threads": os.environ.get("RAYON_NUM_THREADS", "default"),
                      "encode": {"median_ms": statistics.median(ms), "min_ms": min(ms)}}))


if __name__ == "__main__":
    main()
