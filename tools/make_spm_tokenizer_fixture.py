#!/usr/bin/env python3
"""One-off: tokenizer.json files of SentencePiece BPE vocabularies as Hugging Face makes
them, and the ids Hugging Face's tokenizers gives for test texts, for
tests/test_tokenizer_json.cpp (model/hf_checkpoint.cpp reads a checkpoint's
tokenizer.json).

Nothing is downloaded: the vocabularies are llama.cpp's test GGUFs (tools/setup.sh
puts them in models/llama.cpp/), turned into tokenizer.json by transformers' own GGUF
converter (transformers.integrations.gguf: the class each family's checkpoints use,
its normalizer, pre-tokenizer and decoder), in three layouts the checkpoints people
download have:
  llama2-metaspace  Llama 2's vocabulary as LlamaTokenizer writes it today (Mistral's
                    layout too): Metaspace(prepend_scheme "first"), no normalizer
  phi3-prepend      Phi-3's vocabulary with Prepend("▁") + Replace(" ", "▁") (Llama 2's
                    legacy layout), its added tokens (<|user|>, <|end|>, ...)
  llama2-gemma      Llama 2's vocabulary in GemmaTokenizer's layout (Gemma 2/3):
                    Replace(" ", "▁"), Split(" "), no space prefix
Writes tests/fixtures/spm_tokenizer_json/NAME/{tokenizer.json.gz, tokenizer_config.json}
and NAME/expected.json: {"texts": [...], "ids": [[...]], "ids_special": [[...]]}
(ids: encode(text, add_special_tokens=False) with added tokens parsed, as a chat
prompt is; the same texts the test feeds our tokenizer).

Run by hand in a throwaway venv (CI never installs it; no torch needed):
    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install transformers tokenizers gguf sentencepiece
    /tmp/hf/bin/python tools/make_spm_tokenizer_fixture.py
"""
import gzip
import json
import os

import tokenizers
import transformers
from gguf import GGUFReader, GGUFValueType
from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCABS = os.path.join(ROOT, "models", "llama.cpp")
OUT = os.path.join(ROOT, "tests", "fixtures", "spm_tokenizer_json")


def gguf_metadata(path):
    reader = GGUFReader(path)
    meta = {}
    for name, field in reader.fields.items():
        if not (name.startswith("tokenizer.") or name == "general.architecture"):
            continue
        def value(part, kind):
            return bytes(part).decode("utf-8") if kind == GGUFValueType.STRING else part.tolist()[0]
        parts = [field.parts[i] for i in field.data]
        if field.types[0] == GGUFValueType.ARRAY:
            meta[name] = [value(p, field.types[1]) for p in parts]
        else:
            meta[name] = value(parts[0], field.types[0])
    return meta


def convert(gguf_name, builder_arch):
    """transformers' GGUF tokenizer conversion (get_gguf_tokenizer + convert_gguf_tokenizer,
    without the GGUF reader that needs torch)."""
    meta = gguf_metadata(os.path.join(VOCABS, gguf_name))
    tdict = {name: meta[f"tokenizer.{key}"] for key, name in mapping.GGUF_TOKENIZER_MAPPING["tokenizer"].items()
             if f"tokenizer.{key}" in meta}
    tok = mapping.select_tokenizer_builder(builder_arch, tdict.get("tokenizer_type"))(tdict)
    tok = mapping.add_gguf_special_tokens(tok, tdict)
    return mapping.set_split_regex(tok, tdict)


def inputs_of(gguf_name):
    """llama.cpp's test inputs for the vocabulary (its .inp file)."""
    with open(os.path.join(VOCABS, gguf_name + ".inp"), encoding="utf-8") as f:
        return [t for t in f.read().split("\n__ggml_vocab_test__\n") if t != ""]


def extra_texts(specials):
    with open(os.path.join(ROOT, "tests", "data", "rag_qa.jsonl"), encoding="utf-8") as f:
        case = json.loads(f.readline())
    texts = case["documents"][:3] + [case["question"]]
    texts += [
        "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass",
        "Emoji: \U0001F999 \U0001F469\u200D\U0001F4BB \u2764\uFE0F and CJK: 日本語のテキスト、中文文本。한국어",
        "  two leading spaces, a tab\there,   runs   of   spaces   \n\n\n and newlines",
        " one leading space",
        "\n starts with a newline",
        "Ünïcödé façade naïve — “quotes” … ½ ² ∑",
        "bytes without a token: \u0001\u0002 \U0010FFFD",
    ]
    for s in specials:
        texts.append(f"{s}written as text{s} twice")
        texts.append(f"before {s} after")
    return texts


def write(name, tok, texts):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok.save_pretrained(d)
    with open(os.path.join(d, "tokenizer.json"), "rb") as f:
        raw = f.read()
    with gzip.GzipFile(os.path.join(d, "tokenizer.json.gz"), "wb", mtime=0) as f:
        f.write(raw)
    os.remove(os.path.join(d, "tokenizer.json"))
    backend = tok.backend_tokenizer
    ids = [backend.encode(t, add_special_tokens=False).ids for t in texts]
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"made_by": f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}",
                   "texts": texts, "ids": ids}, f, ensure_ascii=False)
    print(name, len(texts), "texts,", len(raw), "bytes of tokenizer.json")


def main():
    llama = convert("ggml-vocab-llama-spm.gguf", "llama")
    write("llama2-metaspace", llama, inputs_of("ggml-vocab-llama-spm.gguf") + extra_texts(["<s>", "</s>"]))
    phi3 = convert("ggml-vocab-phi-3.gguf", "phi3")
    write("phi3-prepend", phi3, inputs_of("ggml-vocab-phi-3.gguf") + extra_texts(["<|user|>", "<|end|>", "<s>"]))
    gemma = convert("ggml-vocab-llama-spm.gguf", "gemma3")
    write("llama2-gemma", gemma, inputs_of("ggml-vocab-llama-spm.gguf") + extra_texts(["<s>", "</s>"]))


if __name__ == "__main__":
    main()
