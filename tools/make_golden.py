#!/usr/bin/env python3
"""Generate golden test fixtures for blendserve from an independent implementation
(llama.cpp, through llama-cpp-python).  One-off script: the fixtures it writes are
committed under tests/fixtures/golden_*, so neither the tests nor the build ever run it.

How to run (from the repository root, after tools/setup.sh has fetched the model):

    python3 -m venv .venv-golden
    CMAKE_BUILD_PARALLEL_LEVEL=2 MAX_JOBS=2 \
        .venv-golden/bin/pip install -r tools/golden_requirements.txt
    .venv-golden/bin/python tools/make_golden.py            # all steps
    .venv-golden/bin/python tools/make_golden.py tokens     # just one step
                                                 # (steps: tokens export logits)

Versions used for the committed fixtures (pinned in tools/golden_requirements.txt):
    llama-cpp-python 0.3.36 (built from the PyPI sdist with default CMAKE_ARGS,
    i.e. CPU backend, GGML_NATIVE=ON, OpenMP; ~6 min on 2 cores), gguf 0.19.0,
    numpy 2.4.6, CPython 3.11.7, Debian 12 x86-64.

With --gemma3 the same steps run on Gemma 3 270M Q4_K_M (models/gemma-3-270m-q4_k_m.gguf,
tools/setup.sh installs it): its SentencePiece vocabulary, its F32 export (every K-quant
tensor dequantized, ~1.1 GB, models/gemma-3-270m.F32.gguf) and its logits, into
tests/fixtures/golden_gemma3_*; the prompts begin with the model's BOS (add_bos_token is
true), one is longer than the 512-token sliding window of its local layers; 16 greedy
tokens; no float64 cross-check (Float64Reference computes the Llama block only).

Steps:
  tokens  llama.cpp tokenization (add_bos=False, special=True) of a varied text set
          -> tests/fixtures/golden_tokens.json  {"generator","texts","ids"}.
          Uses the Q4_1 file with vocab_only=True (tokenization does not depend on the
          weights); the export step re-checks the same ids with the F32 export.
  export  models/SmolLM2-135M-Instruct.F32.gguf: every tensor of the Q4_1 file
          dequantized to F32 (gguf.quants.dequantize), same names/shapes/order, all
          metadata KV pairs copied byte-for-byte except general.file_type (-> 0,
          ALL_F32).  Loaded back in llama-cpp-python as a check.
  logits  Runs the F32 export in llama.cpp for a few prompts and writes
          tests/fixtures/golden_logits.json plus golden_logits_<i>.f32 (final-position
          logits, 49152 little-endian float32 each).  Per prompt: token ids, the greedy
          32-token continuation (argmax every step, no EOS stop; each step a 1-token
          decode), and the teacher-forced argmax at every prompt position
          (position_top1[i] = argmax of the logits after ids[0..i]), each with its
          top-1/top-2 logit margin.  Every run is done twice (must be bit-identical)
          and cross-checked against a plain float64 numpy forward pass of the same
          weights (Float64Reference below); the max |difference| is recorded.

Why an F32 export instead of running the Q4_1 file directly: llama.cpp multiplies
Q4_1 weights with activations quantized to 8 bits (Q8_1 vec-dot), which would put
llama.cpp's own quantization error into the reference.  F32 weights that are exactly
our dequantized Q4_1/Q8_0 weights make llama.cpp an exact-arithmetic (fp32) reference
for the same model that blendserve computes.  (Dequantization is exact in fp32: q*d
with q a 4/8-bit integer and d an fp16 scale is exactly representable, so "q*d + m"
rounds once whether or not a compiler fuses it into an FMA.)
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GEMMA3 = "--gemma3" in sys.argv
if GEMMA3:
    sys.argv.remove("--gemma3")
    MODEL_Q4 = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
    MODEL_F32 = ROOT / "models" / "gemma-3-270m.F32.gguf"
    MODEL_Q4_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    PREFIX = "golden_gemma3_"
else:
    MODEL_Q4 = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    MODEL_F32 = ROOT / "models" / "SmolLM2-135M-Instruct.F32.gguf"
    MODEL_Q4_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    PREFIX = "golden_"
FIXTURES = ROOT / "tests" / "fixtures"
N_THREADS = 2
N_GREEDY = 16 if GEMMA3 else 32
GGML_TYPE_F32 = 0

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(user: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


# --------------------------------------------------------------------- texts
TEXTS: list[str] = [
    # empty / trivial
    "",
    " ",
    "a",
    # English prose
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    "In 1492, Columbus sailed the ocean blue. It was a long voyage, and the crew grew restless.",
    "Machine learning models are trained on large datasets to recognize patterns and make predictions.",
    # contractions, including uppercase 'S and friends
    "It's a dog's life; they're here, we'll go, I'd say you've done it, I'm sure they don't.",
    "IT'S JOHN'S CAR. THEY'RE HERE AND WE'LL SEE. I'M SURE HE'D SAY YOU'VE WON.",
    "don't won't can't shouldn't y'all o'clock rock'n'roll",
    # unicode: accents, combining marks, CJK, emoji, RTL
    "Café crème brûlée, naïve façade, jalapeño, Zürich, Ångström, São Paulo.",
    "Cafe\u0301 with combining acute, n\u0303 and a\u0308 and e\u0300\u0323 stacked.",
    "日本語のテキストです。東京は日本の首都です。",
    "我爱自然语言处理。你好，世界！",
    "한국어 문장도 토큰화합니다.",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖 and more 🚀🚀🚀",
    "مرحبا بالعالم! هذه جملة باللغة العربية.",
    "שלום עולם, זה משפט בעברית.",
    "Mixed: English العربية עברית 中文 русский ελληνικά हिन्दी",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Zero\u200bwidth\u200cjoiners\u200dand\ufeffBOM and non\u00a0breaking\u2009spaces",
    # digits and numbers
    "0123456789",
    "3.14159265358979323846264338327950288419716939937510",
    "The year 2024 had 366 days; 1,000,000 people; $12.99; 50% off; -42; 1e-9; 0x1F.",
    "12345678901234567890123456789012345678901234567890",
    "Phone: +1 (555) 123-4567, IP 192.168.0.1, date 2023-11-05T14:30:00Z",
    # whitespace
    "multiple   spaces    between     words",
    "\t\ttabs\tand\ttabs\t",
    "line one\nline two\n\nline four\n\n\n",
    "windows\r\nline\r\nendings\r\n",
    "   leading and trailing spaces   ",
    "\n\n\n\n",
    "                                ",
    # code
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"Hello, %s!\\n\", \"world\");\n\treturn 0;\n}\n",
    "function add(a, b) { return a + b; }\nconst xs = [1, 2, 3].map(x => x * 2);",
    "fn main() {\n    let v: Vec<i32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "<html><body><div class=\"main\">Hi &amp; bye</div></body></html>",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    # chat markup
    chatml("What is the capital of France?"),
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    "<|endoftext|>text after the end token<|im_end|>",
    "<|im_start|><|im_end|><|im_start|>",
    # long word, repeated punctuation
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "a" * 200,
    "!!!!!!!!!!?????????.........,,,,,,,;;;;;;------======******",
    "Wait... what?!?! No way!!! ...really???",
    "____init____ ---- //// \\\\\\\\ @@@@ #### $$$$ %%%% ^^^^ &&&&",
]

# --------------------------------------------------------------------- prompts
LONG_PROSE = (
    "The printing press, developed by Johannes Gutenberg around 1440, transformed the way "
    "information spread across Europe. Before its invention, books were copied by hand, "
    "usually by monks working in scriptoria, and a single volume could take months or even "
    "years to complete. As a result, books were rare, expensive, and available mostly to "
    "the clergy and the wealthy. Gutenberg combined several existing technologies: the "
    "screw press used for making wine and olive oil, oil-based inks, and a new method for "
    "casting movable metal type in large quantities. This combination made it possible to "
    "produce hundreds of identical copies of a text in a fraction of the time that hand "
    "copying required. Within a few decades, printing shops had appeared in more than two "
    "hundred cities, and millions of books were in circulation. The consequences were "
    "profound. Literacy rates began to rise, scientific ideas could be shared and checked "
    "by scholars in distant places, and standardized spelling and grammar slowly emerged "
    "in many languages. The Reformation, the Renaissance, and the Scientific Revolution "
    "all owed part of their momentum to the rapid and relatively cheap reproduction of "
    "texts. Historians still debate how much credit should go to the press itself rather "
    "than to the social and economic conditions that allowed it to flourish, but few "
    "doubt that it was one of the most important inventions of the second millennium. "
    "In the centuries that followed, improvements such as the steam-powered rotary press "
    "and, much later, digital publishing continued the same trend toward faster and "
    "cheaper distribution of knowledge. Newspapers, pamphlets, encyclopedias, and public "
    "libraries each widened the audience further, until reading became an ordinary part of "
    "daily life for most people in industrialized countries. Today, when we"
)

if GEMMA3:  # Gemma's own turn markup, as text (its control tokens parsed)
    TEXTS += [
        "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n",
        "<eos>text after the end token<end_of_turn>",
    ]


def gemma_turn(user: str) -> str:
    return f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


PROMPTS: list[str] = [
    gemma_turn("What is the capital of France?"),
    # over the 512-token window of the local layers
    LONG_PROSE + " can read almost anything we want.\n\nQuestion: who developed the printing press?\n\n" + LONG_PROSE,
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
] if GEMMA3 else [
    chatml("What is the capital of France?"),
    chatml("Write a short poem about the sea."),
    "Once upon a time, in a small village at the edge of a great forest,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    LONG_PROSE,
    "1, 2, 3, 4, 5, 6, 7,",
]


# --------------------------------------------------------------------- helpers
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def generator_string(what: str) -> str:
    import gguf  # noqa: F401
    import llama_cpp
    return (f"llama-cpp-python {llama_cpp.__version__} (llama.cpp CPU backend) on {what}; "
            f"numpy {np.__version__}; tools/make_golden.py")


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def json_compact(obj, indent: int = 0) -> str:
    """JSON with one list of ints per line (readable diffs, small files).  ASCII-only
    (\\uXXXX escapes) so combining marks / zero-width chars survive any editor."""
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f'{pad}  {json.dumps(k)}: {json_compact(v, indent + 2).lstrip()}'
                 for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and not all(isinstance(x, (int, float)) for x in obj):
        items = [json_compact(v, indent + 2) for v in obj]
        return pad + "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return pad + json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


def tokenize(llm, text: str) -> list[int]:
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))


def prompt_ids(llm, text: str) -> list[int]:
    # Gemma is trained with BOS first (add_bos_token: true); SmolLM2 without.
    return ([llm.token_bos()] if GEMMA3 else []) + tokenize(llm, text)


# --------------------------------------------------------------------- steps
def step_tokens() -> None:
    from llama_cpp import Llama
    t0 = time.time()
    llm = Llama(model_path=str(MODEL_Q4), vocab_only=True, verbose=False)
    ids = [tokenize(llm, t) for t in TEXTS]
    # round-trip sanity: detokenize(special) gives back the text for every entry
    for t, i in zip(TEXTS, ids):
        back = llm.detokenize(i, special=True).decode("utf-8")
        if back != t:
            print(f"  note: detokenize round-trip differs for {t[:30]!r}: {back[:30]!r}")
    out = {
        "generator": generator_string(f"{MODEL_Q4.name} (vocab_only)")
                     + "; tokenize(add_bos=False, special=True)",
        "model_sha256": MODEL_Q4_SHA256,
        "texts": TEXTS,
        "ids": ids,
    }
    FIXTURES.mkdir(parents=True, exist_ok=True)
    write_atomic(FIXTURES / f"{PREFIX}tokens.json", (json_compact(out) + "\n").encode("utf-8"))
    print(f"tokens: {len(TEXTS)} texts, {sum(map(len, ids))} ids "
          f"-> tests/fixtures/{PREFIX}tokens.json ({time.time() - t0:.1f}s)")


def step_export() -> None:
    import gguf
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    t0 = time.time()
    got = sha256_file(MODEL_Q4)
    if got != MODEL_Q4_SHA256:
        sys.exit(f"export: {MODEL_Q4} sha256 {got} != {MODEL_Q4_SHA256}")
    reader = GGUFReader(MODEL_Q4)
    arch = reader.fields["general.architecture"].contents()
    tmp = MODEL_F32.with_name(f".{MODEL_F32.name}.tmp{os.getpid()}")
    writer = GGUFWriter(tmp, arch)  # adds general.architecture itself
    if "general.alignment" in reader.fields:
        writer.data_alignment = int(reader.fields["general.alignment"].contents())

    n_kv = 0
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        if key == "general.file_type":
            writer.add_key_value(key, int(gguf.LlamaFileType.ALL_F32), vtype)
        elif vtype == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                val = [bytes(field.parts[i].tobytes()) for i in field.data]  # byte-exact
            else:
                val = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_key_value(key, val, vtype, sub_type=sub)
        elif vtype == GGUFValueType.STRING:
            writer.add_key_value(key, bytes(field.parts[field.data[0]].tobytes()), vtype)
        else:
            writer.add_key_value(key, field.parts[field.data[0]].tolist()[0], vtype)
        n_kv += 1

    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(tuple(reversed(t.shape.tolist())))
        writer.add_tensor(t.name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, MODEL_F32)
    print(f"export: {len(reader.tensors)} tensors, {n_kv + 1} KV pairs -> {MODEL_F32} "
          f"({MODEL_F32.stat().st_size / 1e6:.0f} MB, {time.time() - t0:.1f}s)")

    # verify: metadata equal (except file_type), tensors equal to the dequantized originals
    back = GGUFReader(MODEL_F32)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.file_type":
            continue
        f2 = back.fields.get(key)
        assert f2 is not None and f2.types == field.types, key
        assert [p.tobytes() for p in f2.parts[-len(field.data):]] == \
               [p.tobytes() for p in field.parts[-len(field.data):]] or \
               f2.contents() == field.contents(), key
    assert len(back.tensors) == len(reader.tensors)
    for t1, t2 in zip(reader.tensors, back.tensors):
        assert t1.name == t2.name and t1.shape.tolist() == t2.shape.tolist(), t1.name
        assert t2.tensor_type == gguf.GGMLQuantizationType.F32, t2.name
        ref = gguf.quants.dequantize(t1.data, t1.tensor_type).reshape(-1)
        assert np.array_equal(np.asarray(t2.data).reshape(-1), ref), t1.name
    print("export: re-read OK (metadata and dequantized tensors identical)")

    # verify: llama.cpp loads it and tokenizes identically to the Q4_1 file
    from llama_cpp import Llama
    llm = Llama(model_path=str(MODEL_F32), n_ctx=256, n_threads=N_THREADS, verbose=False)
    tok_path = FIXTURES / f"{PREFIX}tokens.json"
    if tok_path.exists():
        golden = json.loads(tok_path.read_text(encoding="utf-8"))
        for text, ids in zip(golden["texts"], golden["ids"]):
            assert tokenize(llm, text) == ids, f"tokenization differs for {text[:30]!r}"
        print("export: llama.cpp loads the F32 export; tokenization identical to Q4_1")
    else:
        print("export: llama.cpp loads the F32 export")
    del llm


def make_llm():
    from llama_cpp import Llama
    return Llama(
        model_path=str(MODEL_F32), n_ctx=4096, n_batch=512, n_ubatch=512,
        n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=True,
        flash_attn=False,                            # -> LLAMA_FLASH_ATTN_TYPE_DISABLED
        type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,  # fp32 KV cache (default is f16)
        seed=0, verbose=False)


def margin(row: np.ndarray) -> float:
    """top-1 minus top-2 logit (how safe the argmax is against rounding noise)."""
    a, b = np.partition(row, -2)[-2:]
    return round(float(b - a), 4)


def run_prompt(llm, ids: list[int]):
    llm.reset()
    llm.eval(ids)
    scores = np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)
    final = scores[-1].copy()
    position_top1 = [int(np.argmax(r)) for r in scores]
    position_margin = [margin(r) for r in scores]
    greedy, greedy_margin = [], []
    logits = final
    for _ in range(N_GREEDY):
        nxt = int(np.argmax(logits))
        greedy.append(nxt)
        greedy_margin.append(margin(logits))
        llm.eval([nxt])                      # 1-token decode step
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
    return final, scores, position_top1, position_margin, greedy, greedy_margin


class Float64Reference:
    """Plain numpy float64 forward pass of the F32 export (the Llama architecture of
    SmolLM2-135M: RMSNorm, RoPE on adjacent pairs, grouped-query attention, SwiGLU),
    used only to cross-check llama.cpp; its differences to llama.cpp are
    recorded per prompt as f64_final_max_abs_diff."""

    def __init__(self, path: Path):
        from gguf import GGUFReader
        r = GGUFReader(path)
        f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")
             and v.types and v.types[0].name != "ARRAY"}
        self.L = int(f["llama.block_count"])
        self.H = int(f["llama.attention.head_count"])
        self.KV = int(f["llama.attention.head_count_kv"])
        self.D = int(f["llama.embedding_length"]) // self.H
        self.eps = float(f["llama.attention.layer_norm_rms_epsilon"])
        self.theta = float(f["llama.rope.freq_base"])
        self.W = {t.name: np.asarray(t.data, dtype=np.float64) for t in r.tensors}

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):  # GGUF llama Q/K are permuted: rotate adjacent pairs
        D = self.D
        ang = pos[:, None] * self.theta ** (-2 * np.arange(D // 2) / D)[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        W, T, H, KV, D = self.W, len(ids), self.H, self.KV, self.D
        pos = np.arange(T, dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        x = W["token_embd.weight"][ids]
        for l in range(self.L):
            p = f"blk.{l}."
            h = self._rms(x, W[p + "attn_norm.weight"])
            q = self._rope((h @ W[p + "attn_q.weight"].T).reshape(T, H, D), pos)
            k = self._rope((h @ W[p + "attn_k.weight"].T).reshape(T, KV, D), pos)
            v = (h @ W[p + "attn_v.weight"].T).reshape(T, KV, D)
            o = np.empty((T, H, D))
            for hh in range(H):
                kh = hh // (H // KV)
                sc = q[:, hh] @ k[:, kh].T / np.sqrt(D) + mask
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                o[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, kh]
            x = x + o.reshape(T, H * D) @ W[p + "attn_output.weight"].T
            h = self._rms(x, W[p + "ffn_norm.weight"])
            g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ W[p + "ffn_down.weight"].T
        x = self._rms(x, W["output_norm.weight"])
        out = W["output.weight"] if "output.weight" in W else W["token_embd.weight"]
        return x @ out.T


def step_logits() -> None:
    if not MODEL_F32.exists():
        sys.exit(f"logits: {MODEL_F32} missing; run the export step first")
    t0 = time.time()
    llm = make_llm()
    f64 = None if GEMMA3 else Float64Reference(MODEL_F32)
    n_vocab = llm.n_vocab()
    prompts = []
    for i, text in enumerate(PROMPTS):
        ids = prompt_ids(llm, text)
        final, scores, top1, top1_margin, greedy, greedy_margin = run_prompt(llm, ids)
        # determinism check: a second run from scratch must be bit-identical
        final2, scores2, top1_2, _, greedy2, _ = run_prompt(llm, ids)
        assert np.array_equal(scores, scores2) and greedy == greedy2, \
            f"prompt {i}: llama.cpp run not deterministic"
        assert final.shape == (n_vocab,) and np.isfinite(final).all()
        # independent cross-check against a float64 numpy forward pass (Llama block only)
        if f64:
            ref = f64.logits(ids)
            f64_diff = float(np.abs(ref - scores).max())
            f64_final_diff = float(np.abs(ref[-1] - final).max())
            f64_top1 = ref.argmax(-1).tolist()
            assert f64_final_diff < 1e-3 and f64_diff < 1e-3, f"prompt {i}: llama.cpp vs f64 {f64_diff}"
        name = f"{PREFIX}logits_{i}.f32"
        write_atomic(FIXTURES / name, final.astype("<f4").tobytes())
        text_out = llm.detokenize(greedy, special=True).decode("utf-8", errors="replace")
        g = f"greedy{N_GREEDY}"
        entry = {
            "text": text,
            "ids": ids,
            "final_logits_file": name,
            g: greedy,
            g + "_text": text_out,
            g + "_margin": greedy_margin,
            "position_top1": top1,
            "position_top1_margin": top1_margin,
        }
        if f64:
            entry.update({
                "f64_final_max_abs_diff": float(f"{f64_final_diff:.3e}"),
                "f64_all_positions_max_abs_diff": float(f"{f64_diff:.3e}"),
                "f64_position_top1_agree": sum(a == b for a, b in zip(f64_top1, top1)),
            })
        prompts.append(entry)
        print(f"logits: prompt {i}: {len(ids)} tokens, top1={int(np.argmax(final))} "
              f"max={final.max():.4f}, |llama.cpp - f64| <= {f64_diff if f64 else float('nan'):.2e}, "
              f"min greedy margin {min(greedy_margin):.3f}; greedy: {text_out[:60]!r}")
    out = {
        "model_sha256": MODEL_Q4_SHA256,
        "model_f32_export_sha256": sha256_file(MODEL_F32),
        "generator": generator_string(f"F32 export ({MODEL_F32.name})"),
        "notes": (
            "Reference = llama.cpp CPU backend on an F32 GGUF whose tensors are exactly the "
            "dequantized tensors of the Q4_1 model (Q4_1 and the Q8_0 token_embd; tied output), "
            "so every weight matmul is fp32 x fp32 (no Q8 activation quantization). "
            "Context: n_ctx=4096, n_batch=n_ubatch=512, n_threads=2, flash_attn disabled "
            "(LLAMA_FLASH_ATTN_TYPE_DISABLED; the plain softmax(QK^T)V path in fp32), "
            "KV cache type_k=type_v=GGML_TYPE_F32 (default would be f16, which rounds K/V), "
            "logits_all=True. Token ids via tokenize(add_bos=False, special=True); no BOS is "
            "prepended (the model's add_bos_token is false). "
            "Prompt logits come from one batched decode of the whole prompt; greedy32 is the "
            "argmax at the prompt's last position followed by 31 one-token decode steps "
            "(argmax each step, no EOS stop). position_top1[i] is the argmax of the logits "
            "after token i in the batched prompt decode (teacher forcing). Runs were checked "
            "bit-identical when repeated. Cross-check: a plain float64 numpy forward pass of the same F32 weights "
            "agrees with these logits to the per-prompt f64_*_max_abs_diff (all positions; ~1e-5 "
            "abs). *_margin = top-1 minus top-2 logit; an argmax with a margin near that noise "
            "level is fragile. Remaining differences to expect vs another fp32 "
            "implementation are summation-order effects only (llama.cpp uses tinyBLAS sgemm "
            "for batched F32 matmuls, AVX2/FMA vec-dot for single tokens, vectorized expf)."
        ),
        "n_vocab": n_vocab,
        "prompts": prompts,
    }
    if GEMMA3:
        out["notes"] = out["notes"].replace("the Q4_1 model (Q4_1 and the Q8_0 token_embd; tied output)",
                                            "the Q4_K_M model (Q5_0, Q4_K, Q6_K and Q8_0 tensors; tied output)")
        out["notes"] = out["notes"].replace("no BOS is prepended (the model's add_bos_token is false)",
                                            "BOS (id 2) is prepended (the model's add_bos_token is true)")
        out["notes"] = out["notes"].replace("Cross-check: a plain float64", "(SmolLM2 only: a plain float64")
        out["notes"] = out["notes"].replace("greedy32 is the argmax at the prompt's last position followed by 31",
                                            "greedy16 is the argmax at the prompt's last position followed by 15")
    write_atomic(FIXTURES / f"{PREFIX}logits.json", (json_compact(out) + "\n").encode("utf-8"))
    print(f"logits: {len(PROMPTS)} prompts -> tests/fixtures/{PREFIX}logits.json "
          f"({time.time() - t0:.1f}s)")


STEPS = {"tokens": step_tokens, "export": step_export, "logits": step_logits}


def main(argv: list[str]) -> None:
    steps = argv or list(STEPS)
    for s in steps:
        if s not in STEPS:
            sys.exit(f"unknown step {s!r}; choose from {' '.join(STEPS)}")
    for s in steps:
        STEPS[s]()


if __name__ == "__main__":
    main(sys.argv[1:])
