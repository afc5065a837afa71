#!/usr/bin/env python3
"""One-off: build an independent tokenizer reference for tests/test_tokenizer.cpp.

Reconstructs SmolLM2's HuggingFace tokenizer from the vocab and merges stored in
the GGUF (nothing is downloaded): BPE(vocab, merges) with the pre-tokenizer of
SmolLM2's tokenizer.json, Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)], and the control tokens
(token_type 3) registered as special tokens so they are parsed in the text.
Writes tests/fixtures/tokenizer_hf_reference.json as
{"texts": [...], "ids": [[...], ...], "meta": {...}, "divergences": [...],
 "no_special": [{"index", "ids"}], "pre_variants": {"gpt2"|"llama3"|"qwen2": [[...], ...]}};
no_special gives the parse_special=False ids where they differ; pre_variants are the
ids of the same texts and vocabulary with another pre-tokenizer regex (HF Split
+ ByteLevel without its own regex), to check the other pre-tokenizer paths.

Cross-check for \\s: llama.cpp's \\s is the Unicode White_Space property. A
second HF tokenizer with the same regex but \\s spelled out as White_Space gives
llama.cpp-semantics ids; texts where the two disagree would be listed in
"divergences" as {"index", "ids_llama_semantics"} (none for the current texts).
The texts avoid bytes 0x04 0x06 0x13 0x14 0x16 0x1D, which have no token in
SmolLM2's vocabulary (they are dropped by both implementations).

Usage: python3 tools/make_tokenizer_fixture.py [model.gguf] [out.json]
"""
import json
import os
import sys

import tokenizers
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "fixtures", "tokenizer_hf_reference.json")


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_ints(reader, key):
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


# GPT-2 pattern with \\s written out as the Unicode White_Space set (llama.cpp's \\s).
WS = "\\t\\n\\v\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
GPT2_WS_PATTERN = (
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + WS + "\\p{L}\\p{N}]+"
    "|[" + WS + "]+(?![^" + WS + "])|[" + WS + "]+"
)


# Other pre-tokenizers the C++ tokenizer implements (tokenizer.ggml.pre), checked on
# the same vocabulary: regexes as in the models' tokenizer.json / llama.cpp.
PRE_VARIANTS = {
    "gpt2": "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "llama3": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "qwen2": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
}


def build_tokenizer(path, whitespace_as_llama=False, pre_regex=None, specials=True):
    r = GGUFReader(path)
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    types = field_ints(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field_strings(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate token strings"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if pre_regex is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pre_regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif whitespace_as_llama:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(GPT2_WS_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
             for t, ty in zip(tokens, types) if ty == 3]
    if specials:
        tok.add_special_tokens(added)
    return tok, len(added)


TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple    spaces   between  words",
    " ",
    "   ",
    "tabs\tand\ttabs\t\t\tdouble\t",
    "newlines\nand\n\nparagraphs\n\n\n",
    "CRLF line\r\nnext line\r\n\r\nlast",
    "mixed \t\n whitespace \n\t  x",
    "I'm sure they're fine, we've done it, she'll go, he'd say, it's John's dog and it isn't mine.",
    "IT'S UPPERCASE: DON'T, WE'LL, THEY'RE, I'M, 'S 'T 'RE",
    "''s quotes ``double'' \"straight\" 'single' ’curly’ “curly”",
    "1234567890",
    "The year 2024 had 366 days; 3.14159265358979 is pi.",
    "-42 +17 1e10 0x1F 1,000,000 $19.99 50% 10:30pm",
    "Phone: +1 (555) 123-4567, zip 90210",
    "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
    "Mixed 123abc abc123 a1b2c3 v2.0.1-rc3",
    "Café naïve résumé façade Ångström Straße œuvre",
    "e\u0301 a\u0300 n\u0303 o\u0308 (combining marks)",
    "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u035a\u031ao\u0319\u0314\u036e\u0307\u0350\u0307",
    "日本語のテキストです。東京は大きい都市です。",
    "中文测试，你好世界！这是一个句子。",
    "한국어 텍스트 처리 테스트",
    "Привет, мир! Как дела?",
    "Ελληνικά γράμματα αβγ",
    "עברית: שלום עולם",
    "مرحبا بالعالم، كيف حالك؟",
    "Hello 👋🌍! 🎉🎉🎉 family: 👨\u200d👩\u200d👧\u200d👦 flag: 🇺🇸 skin: 👍🏽",
    "emoji-only:😀😃😄😁😆😅🤣😂🙂🙃",
    "numbers in other scripts: ٣٤٥ ௫ Ⅻ ½ ² ³ ① 〇",
    "non\u00a0breaking\u2003em\u3000ideographic\u2009thin\u202fnarrow",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "math: ∑_{i=1}^{n} x_i² ≤ ∞, α≠β ≈ γ → δ ⇒ ε ∈ ℝ",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() == 3 ? 0 : 1;\n}\n",
    '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": -1e-5}}',
    "<html><body class=\"main\"><p>Hello&nbsp;world</p></body></html>",
    "https://example.com/path/to/page?query=1&other=two#frag user@example.org",
    "# Title\n\n- item 1\n- item 2\n\n**bold** _italic_ `code` > quote\n\n```python\nprint('x')\n```",
    "!!!???...,,,;;; ------ ======== ******** ~~~ ^^^ |||",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "text<|im_end|>text <|im_end|> text",
    "<repo_name>blendserve<file_sep>main.cpp<filename>x<gh_stars>10",
    "partial <|im_start and <|im_end| and <|endoftext and im_start|>",
    "<|im_start|><|im_start|>",
    "supercalifragilisticexpialidocious" * 12,
    "a" * 1000,
    "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
    "x" + " " * 50 + "y",
    "\n" * 20,
    "\t \t \t",
    "bell\x07 and del\x7f and nul-free control \x1b[0m",
    "file separators \x1c\x1e\x1f end and a\x1c\x1cb  \x1f x",
    "next line\u0085 and line sep\u2028 para sep\u2029 end",
    "nbsp: x \u00a0y, x \u00a0the,  \u00a0the, \u0085the",
    "unicode spaces: a \u00a0 b\u3000\u3000c.\u2003\u2003!\u00a0\u00a0 end \u2028\u2028x\u00a0",
    "Ünïcödé ÀÉÎÕÜ ñ ç ø å ß",
    "मानक हिन्दी पाठ",
    "ภาษาไทย ทดสอบ",
    "Tiếng Việt có dấu",
    "private use \ue000\uf8ff and replacement \ufffd and unassigned \u0378",
    "astral: 𝒜𝓁𝓅𝒽𝒶 𝟙𝟚𝟛 𐍈 🀄",
]


def main():
    tok, n_special = build_tokenizer(MODEL)
    tok_ws, _ = build_tokenizer(MODEL, whitespace_as_llama=True)
    ids = []
    divergences = []
    for i, t in enumerate(TEXTS):
        enc = tok.encode(t, add_special_tokens=False).ids
        assert tok.decode(enc, skip_special_tokens=False) == t, repr(t)
        ids.append(enc)
        enc_ws = tok_ws.encode(t, add_special_tokens=False).ids
        assert tok_ws.decode(enc_ws, skip_special_tokens=False) == t, repr(t)
        if enc_ws != enc:
            divergences.append({"index": i, "ids_llama_semantics": enc_ws})
            print(f"divergence on text {i}: {t!r}")
    # parse_special=False: the same tokenizer without added tokens (control-token
    # texts are plain text); listed only where it differs from "ids".
    tok_plain, _ = build_tokenizer(MODEL, specials=False)
    no_special = []
    for i, t in enumerate(TEXTS):
        enc = tok_plain.encode(t, add_special_tokens=False).ids
        if enc != ids[i]:
            no_special.append({"index": i, "ids": enc})
    variants = {}
    for name, pattern in PRE_VARIANTS.items():
        tv, _ = build_tokenizer(MODEL, pre_regex=pattern)
        variants[name] = [tv.encode(t, add_special_tokens=False).ids for t in TEXTS]
    out = {
        "meta": {
            "source": "huggingface tokenizers " + tokenizers.__version__ +
                      ", BPE from GGUF vocab/merges, Sequence[Digits(individual_digits), ByteLevel(no prefix space)]",
            "model": os.path.basename(MODEL),
            "special_tokens": n_special,
            "parse_special": True,
        },
        "texts": TEXTS,
        "ids": ids,
        "divergences": divergences,
        "no_special": no_special,
        "pre_variants": variants,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=None)
        f.write("\n")
    print(f"wrote {len(TEXTS)} texts, {sum(map(len, ids))} tokens to {OUT}")


if __name__ == "__main__":
    main()
