#!/usr/bin/env python3
"""One-off: small Unigram tokenizers (SentencePiece's unigram model, as Hugging Face's
tokenizers `Unigram` applies it) and the ids Hugging Face's tokenizers gives for test
texts, for tests/test_tokenizer_unigram.cpp (model/hf_checkpoint.cpp reads a
checkpoint's tokenizer.json; model/unigram.h is the model).

Nothing is downloaded: one Unigram model of VOCAB pieces (with the special tokens) is
trained with tokenizers'
UnigramTrainer on MuSiQue passages (../shared/data/musique_half_a.jsonl: the first
60 questions' passages; the last questions' are among the test texts), then written
in two layouts:
  metaspace-split-bytes  Metaspace(prepend_scheme "always", split), byte_fallback with
                         the 256 <0xAB> pieces SentencePiece adds (score 0): the
                         Metaspace converted SentencePiece unigram checkpoints have
                         (T5's adds a Precompiled normalizer and WhitespaceSplit, which
                         we refuse)
  metaspace-first-unk    Metaspace(prepend_scheme "first", no split), no byte_fallback:
                         characters without a piece are the unknown piece, a run of them
                         one (Hugging Face's fuse_unk)
Writes tests/fixtures/unigram_tokenizer_json/NAME/{tokenizer.json.gz,
tokenizer_config.json} and NAME/expected.json: {"texts": [...], "ids": [[...]]} (ids:
encode(text, add_special_tokens=False), added tokens parsed as a chat prompt is).

The trainer runs on several threads and a rerun may give slightly different scores:
the test reads the committed files, made together by one run.

Run by hand in a throwaway venv (CI never installs it):
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install tokenizers
    /tmp/hfvenv/bin/python tools/make_unigram_tokenizer_fixture.py
"""
import gzip
import json
import os

import tokenizers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "musique_half_a.jsonl")
VOCABS = os.path.join(ROOT, "models", "llama.cpp")
OUT = os.path.join(ROOT, "tests", "fixtures", "unigram_tokenizer_json")
VOCAB = 3000
SPECIALS = ["<pad>", "</s>", "<unk>", "<s>"]  # ids 0..3, T5's first three in its order


def passages():
    with open(DATA, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f]
    return cases


def train(cases):
    # The first 60 questions' passages train it; the last ones' are test texts.
    corpus = [d for c in cases[:60] for d in c["documents"]] + [c["question"] for c in cases[:60]]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, unk_token="<unk>",
                                      max_piece_length=16, show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return json.loads(tok.to_str())


def layout(trained, name):
    t = json.loads(json.dumps(trained))
    vocab = t["model"]["vocab"]
    if name == "metaspace-split-bytes":
        have = {p for p, _ in vocab}
        vocab += [[f"<0x{b:02X}>", 0.0] for b in range(256) if f"<0x{b:02X}>" not in have]
        t["model"]["byte_fallback"] = True
        t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    else:
        t["model"]["byte_fallback"] = False
        t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    t["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": t["pre_tokenizer"]["prepend_scheme"],
                    "split": t["pre_tokenizer"]["split"]}
    return Tokenizer.from_str(json.dumps(t))


def inputs_of(gguf_name):
    """llama.cpp's test inputs for a vocabulary (its .inp file)."""
    with open(os.path.join(VOCABS, gguf_name + ".inp"), encoding="utf-8") as f:
        return [t for t in f.read().split("\n__ggml_vocab_test__\n") if t != ""]


def texts(cases):
    out = inputs_of("ggml-vocab-llama-spm.gguf")
    for c in cases[-4:]:  # passages it was not trained on
        out += c["documents"][:2] + [c["question"]]
    out += [
        "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass",
        "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size() > 2 ? 0 : 1; }",
        "Emoji: \U0001F999 \U0001F469\u200D\U0001F4BB \u2764\uFE0F and CJK: 日本語のテキスト、中文文本。한국어",
        "  two leading spaces, a tab\there,   runs   of   spaces   \n\n\n and newlines",
        " one leading space",
        "\u2581 a literal U+2581 first, and one\u2581inside",
        "\n starts with a newline",
        "trailing spaces   ",
        "Ünïcödé façade naïve — “quotes” … ½ ² ∑",
        "bytes without a piece: \u0001\u0002 \U0010FFFD ÿþ \u0800\u0801",
        "<0x41><0x42> written as byte pieces, <unk> and <s> as text",
        "ΑΒΓ δέλτα Ωμέγα Привет мир",
        "1234567890 3.14159 1,000,000 0x1F 1e-9",
        "a",
        "the",
        "The theory of the theatre: thermal, thermodynamic, thereafter.",
    ]
    for s in ["<s>", "</s>", "<unk>"]:
        out.append(f"{s}written as text{s} twice")
        out.append(f"before {s} after")
    return out


def write(name, tok, texts_):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    raw = tok.to_str().encode("utf-8")
    with gzip.GzipFile(os.path.join(d, "tokenizer.json.gz"), "wb", mtime=0) as f:
        f.write(raw)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                   "add_bos_token": False}, f, indent=1)
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts_]
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"made_by": f"tokenizers {tokenizers.__version__}", "texts": texts_, "ids": ids}, f,
                  ensure_ascii=False)
    print(name, len(texts_), "texts,", len(raw), "bytes of tokenizer.json")


def main():
    cases = passages()
    trained = train(cases)
    t = texts(cases)
    for name in ["metaspace-split-bytes", "metaspace-first-unk"]:
        write(name, layout(trained, name), t)


if __name__ == "__main__":
    main()
