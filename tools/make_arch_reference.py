#!/usr/bin/env python3
"""Generator of tests/fixtures/arch/: tiny random models of each architecture we
compute, written as GGUF, with Hugging Face transformers' own logits for them.
Run by hand, never in CI (it needs torch, transformers and gguf from PyPI; use a
throwaway venv: `python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch
transformers gguf numpy`); its outputs are committed, and tests/test_model_arch.cpp
checks our logits against them.

For each family a transformers config with its features switched on builds a
random-weight model (2 layers, GQA 4:2, head_dim 64, width 256, vocabulary 260):
  llama    LlamaForCausalLM, Llama 3.1 RoPE scaling with a short original context
           (64) so the scaling changes many frequencies; as llama.cpp's converter
           writes it: rope_freqs.weight, q and k rows permuted to GGUF's interleaved
           RoPE order (convert_hf_to_gguf.py's LlamaModel.permute)
  mistral  MistralForCausalLM (no sliding window), files say `llama`, permuted likewise
  qwen2    Qwen2ForCausalLM, q/k/v biases, half-split RoPE, tied embeddings
  qwen3    Qwen3ForCausalLM, per-head q/k RMSNorm, head_dim independent of the width
  gemma3   Gemma3ForCausalLM, 6 layers: 5 local (sliding window 8, shorter than the
           prompts; RoPE base 10000) and 1 global (base 1e6, linear scaling 8), GeGLU,
           pre and post norms ((1 + w): GGUF stores 1 + w as llama.cpp's converter
           does), per-head q/k norms, embeddings scaled by sqrt(width), tied head.
           Its K-quant file states the layers with the per-layer bool array of
           attention.sliding_window_pattern and the local base with
           rope.freq_base_swa (the real Gemma 3 270M file leaves both to llama.cpp's
           defaults, period 6 and 10000); its weights in 16 bits come as the BF16
           checkpoint only (the fixtures stay small).
Each is written in several tensor types; the matrices of a quantized file are
quantized here (gguf-py's quantizers for Q8_0/Q5_0/Q5_1, a plain min-max one of ours
for the K-quants: any valid blocks will do), dequantized back with gguf-py, and
loaded into the transformers model before its logits are taken, so the reference is
exactly the math of the file's weights:
  <family>.f32.gguf   all F32 (llama)
  <family>.f16.gguf   matrices F16 (qwen2, qwen3)
  <family>.kq.gguf    (every family) a K-quant mix: attn_q Q4_K, attn_k Q5_K, attn_v Q6_K,
                      attn_output Q5_0, ffn_gate Q5_1, ffn_up Q4_K, ffn_down Q6_K,
                      token_embd Q8_0
  <family>.hf/         llama (F16) and qwen3 (BF16) also as Hugging Face checkpoint
                      directories (config.json, model.safetensors, tokenizer.json,
                      tokenizer_config.json), half-split q/k rows as transformers has them
and <family>.<kind>.json names the prompts (token ids) whose transformers fp32 logits
of every position <family>.<kind>.logits.f32 holds. The llama F32 file says its
scaling with the llama3 keys (factor, original context), the others with rope_freqs. The tokenizer is a byte-level BPE of 256 byte tokens, one
merge and three control tokens (the tests feed token ids).

Usage: tools/make_arch_reference.py [OUT_DIR] [--only FAMILY]
(--only: write one family's files; the others' bytes do not change with it, since each
family's weights come from the seed in order and the new ones come last.)
"""
import json
import math
import os
import sys

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, dequantize, quantize
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
if ONLY in ARGS:
    ARGS.remove(ONLY)
OUT = ARGS[0] if ARGS else os.path.join(ROOT, "tests", "fixtures", "arch")
VOCAB = 260
PROMPTS = [[256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100],
           [259 - 3] + list(range(40, 40 + 47)),
           [7, 7, 7, 200, 13, 99, 1, 0, 255, 128, 64, 32, 16, 8, 4, 2, 1, 3, 5, 9, 17, 33, 65, 129]]
COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.08,
              torch_dtype="float32")
# The files per family, few to keep the fixtures small: F32 once (llama), F16 where no
# checkpoint below carries the family's 16-bit weights, a K-quant mix for every family.
KINDS = {"llama": ["f32", "kq"], "mistral": ["kq"], "qwen2": ["f16", "kq"], "qwen3": ["f16", "kq"],
         "gemma3": ["kq"]}
HF_DIRS = {"llama": torch.float16, "qwen3": torch.bfloat16,
           "gemma3": torch.bfloat16}  # the families also written as checkpoints
GEMMA3_LAYERS = ["sliding_attention"] * 5 + ["full_attention"]
KQ_MIX = {"attn_q": QT.Q4_K, "attn_k": QT.Q5_K, "attn_v": QT.Q6_K, "attn_output": QT.Q5_0, "ffn_gate": QT.Q5_1,
          "ffn_up": QT.Q4_K, "ffn_down": QT.Q6_K, "token_embd": QT.Q8_0}


def rope(theta):
    return {"rope_type": "default", "rope_theta": theta}


def families():
    yield "llama", "llama", LlamaForCausalLM(LlamaConfig(
        **COMMON, head_dim=64, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    yield "mistral", "llama", MistralForCausalLM(MistralConfig(
        **COMMON, head_dim=64, rope_parameters=rope(1e6), sliding_window=None, tie_word_embeddings=False))
    yield "qwen2", "qwen2", Qwen2ForCausalLM(Qwen2Config(
        **COMMON, rope_parameters=rope(1e6), tie_word_embeddings=True, use_sliding_window=False))
    # head_dim 128: q_dim 512 != the width 256, head_dim is its own
    yield "qwen3", "qwen3", Qwen3ForCausalLM(Qwen3Config(
        **COMMON, head_dim=128, rope_parameters=rope(1e6), tie_word_embeddings=False, attention_bias=False))
    gemma = dict(COMMON, num_hidden_layers=len(GEMMA3_LAYERS), rms_norm_eps=1e-6)
    yield "gemma3", "gemma3", Gemma3ForCausalLM(Gemma3TextConfig(
        **gemma, head_dim=64, query_pre_attn_scalar=64, sliding_window=8, layer_types=GEMMA3_LAYERS,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
        pad_token_id=0, bos_token_id=257, eos_token_id=259))


def byte_alphabet():
    # GPT-2's bytes_to_unicode, in byte order.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def permute(w, n_head, n_head_kv):
    # convert_hf_to_gguf.py LlamaModel.permute: HF's half-split rows to GGUF's pairs.
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def quantize_k(w, qtype):
    """Plain min-max K-quant blocks of rows of w (fp32 [rows, cols], cols % 256 == 0)."""
    rows, cols = w.shape
    blocks = w.reshape(-1, 8, 32).astype(np.float32)  # super-blocks of 8 sub-blocks
    out = []
    for sb in blocks:
        if qtype == QT.Q6_K:
            amax = np.abs(sb.reshape(16, 16)).max(axis=1)  # 16 scales of 16
            d = np.float16(max(amax.max() / 32.0 / 127.0, 1e-8))
            sc = np.clip(np.round(amax / 32.0 / np.float32(d)), -128, 127).astype(np.int8)
            eff = np.float32(d) * sc.astype(np.float32)
            q = np.zeros(256, np.int32)
            for i in range(16):
                if eff[i] != 0:
                    q[16 * i:16 * i + 16] = np.clip(np.round(sb.reshape(16, 16)[i] / eff[i]), -32, 31)
            q = (q + 32).astype(np.uint8)
            ql = np.zeros(128, np.uint8)
            qh = np.zeros(64, np.uint8)
            for n in range(2):
                for l in range(32):
                    base = 128 * n
                    q1, q2, q3, q4 = q[base + l], q[base + l + 32], q[base + l + 64], q[base + l + 96]
                    ql[64 * n + l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                    ql[64 * n + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
                    qh[32 * n + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
            out.append(ql.tobytes() + qh.tobytes() + sc.tobytes() + d.tobytes())
            continue
        nmax = 15 if qtype == QT.Q4_K else 31
        mn = np.minimum(sb.min(axis=1), 0)
        mx = sb.max(axis=1)
        scale = (mx - mn) / nmax
        d = np.float16(max(scale.max() / 63.0, 1e-8))
        dmin = np.float16(max((-mn).max() / 63.0, 1e-8))
        ls = np.clip(np.round(scale / np.float32(d)), 0, 63).astype(np.uint8)
        lm = np.clip(np.round(-mn / np.float32(dmin)), 0, 63).astype(np.uint8)
        scales = np.zeros(12, np.uint8)
        for j in range(8):  # ggml's packing (inverse of get_scale_min_k4)
            if j < 4:
                scales[j] = ls[j]
                scales[j + 4] = lm[j]
            else:
                scales[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
                scales[j - 4] |= (ls[j] >> 4) << 6
                scales[j] |= (lm[j] >> 4) << 6
        q = np.zeros((8, 32), np.int32)
        for j in range(8):
            dj, mj = np.float32(d) * ls[j], np.float32(dmin) * lm[j]
            if dj > 0:
                q[j] = np.clip(np.round((sb[j] + mj) / dj), 0, nmax)
        qs = np.zeros(128, np.uint8)
        for c in range(4):
            qs[32 * c:32 * c + 32] = (q[2 * c] & 0xF) | ((q[2 * c + 1] & 0xF) << 4)
        head = d.tobytes() + dmin.tobytes() + scales.tobytes()
        if qtype == QT.Q5_K:
            qh = np.zeros(32, np.uint8)
            for j in range(8):
                qh |= (((q[j] >> 4) & 1) << j).astype(np.uint8)
            out.append(head + qh.tobytes() + qs.tobytes())
        else:
            out.append(head + qs.tobytes())
    return np.frombuffer(b"".join(out), np.uint8).reshape(rows, -1)


def encode(w, qtype):
    """(raw array for the writer, the dequantized fp32 weights the file holds)."""
    if qtype == QT.F32:
        return w.astype(np.float32), w.astype(np.float32)
    if qtype == QT.F16:
        h = w.astype(np.float16)
        return h, h.astype(np.float32)
    raw = quantize_k(w, qtype) if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else quantize(w.astype(np.float32), qtype)
    return raw, dequantize(raw, qtype).reshape(w.shape).astype(np.float32)


def write_reference(model, stem, file):
    """Transformers' logits of every position of every prompt, fp32 little endian, prompt
    after prompt ([positions, vocab] each), in <stem>.logits.f32; the ids in <stem>.json."""
    blobs = []
    with torch.no_grad():
        for ids in PROMPTS:
            blobs.append(model(torch.tensor([ids])).logits[0].float().numpy().astype("<f4").tobytes())
    with open(os.path.join(OUT, f"{stem}.logits.f32"), "wb") as f:
        f.write(b"".join(blobs))
    with open(os.path.join(OUT, f"{stem}.json"), "w") as f:
        json.dump({"generator": "tools/make_arch_reference.py (transformers %s, torch %s)" % (
            __import__("transformers").__version__, torch.__version__), "file": file, "vocab": VOCAB,
            "prompts": PROMPTS}, f)


def write_family(name, arch, model, sd, kind):
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    path = os.path.join(OUT, f"{name}.{kind}.gguf")
    w = GGUFWriter(path, arch)
    w.add_name(f"tiny random {name} ({kind})")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rp = cfg.rope_parameters  # transformers 5: theta and scaling together
    gemma = arch == "gemma3"
    if gemma:  # the global layers' RoPE; the local layers' window, pattern and base
        full, local = rp["full_attention"], rp["sliding_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        w.add_string("gemma3.rope.scaling.type", "linear")
        w.add_rope_scaling_factor(full["factor"])
        w.add_sliding_window(cfg.sliding_window)
        # (the real Gemma 3 270M file leaves both to the defaults: period 6, base 10000)
        w.add_array("gemma3.attention.sliding_window_pattern", [t == "sliding_attention" for t in cfg.layer_types])
        w.add_float32("gemma3.rope.freq_base_swa", local["rope_theta"])
    else:
        w.add_rope_freq_base(rp["rope_theta"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    tokens = byte_alphabet() + ["Ġt", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3] * 3)
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(259)
    w.add_add_bos_token(False)
    permuted = arch == "llama"
    if name == "llama" and kind == "f32":  # Llama 3.1 scaling from the keys
        w.add_string("llama.rope.scaling.type", "llama3")  # gguf-py has no enum value for it
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    elif name == "llama":  # as llama.cpp's converter writes it: rope_freqs
        rs = rp
        freqs = 1.0 / (rp["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
        old, lo, hi = rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"]
        factors = []
        for f in freqs:
            wl = 2 * math.pi / f
            if wl < old / hi:
                factors.append(1.0)
            elif wl > old / lo:
                factors.append(rs["factor"])
            else:
                smooth = (old / wl - lo) / (hi - lo)
                factors.append(1.0 / ((1 - smooth) / rs["factor"] + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))

    held = {}  # HF name -> the fp32 values the file holds (in HF's layout)

    def put(gguf_name, hf_name, kind_of, perm=None):
        x = sd[hf_name]
        qtype = QT.F32
        if x.ndim == 2 and kind != "f32":
            qtype = QT.F16 if kind == "f16" else KQ_MIX[kind_of]
        stored = permute(x, *perm) if perm else x
        shift = gemma and hf_name.endswith("norm.weight")  # GGUF holds Gemma's 1 + w
        if shift:
            stored = (stored + np.float32(1.0)).astype(np.float32)
        raw, values = encode(stored, qtype)
        if shift:  # exact: values are fl(1 + w), near 1
            values = values - np.float32(1.0)
        w.add_tensor(gguf_name, raw, raw_dtype=qtype if qtype not in (QT.F32, QT.F16) else None)
        if perm:  # back to HF's row order: the inverse permutation
            n = perm[1] if perm[1] is not None and perm[0] != perm[1] else perm[0]
            values = values.reshape(n, values.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(x.shape)
        held[hf_name] = values

    put("token_embd.weight", "model.embed_tokens.weight", "token_embd")
    put("output_norm.weight", "model.norm.weight", None)
    if not cfg.tie_word_embeddings:
        put("output.weight", "lm_head.weight", "ffn_down")
    for l in range(cfg.num_hidden_layers):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        put(g + "attn_norm.weight", p + "input_layernorm.weight", None)
        if gemma:  # Gemma's post_attention_layernorm is a post norm, its pre-FFN norm apart
            put(g + "post_attention_norm.weight", p + "post_attention_layernorm.weight", None)
            put(g + "ffn_norm.weight", p + "pre_feedforward_layernorm.weight", None)
            put(g + "post_ffw_norm.weight", p + "post_feedforward_layernorm.weight", None)
        else:
            put(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", None)
        put(g + "attn_q.weight", p + "self_attn.q_proj.weight", "attn_q", (heads, heads) if permuted else None)
        put(g + "attn_k.weight", p + "self_attn.k_proj.weight", "attn_k", (heads, kv_heads) if permuted else None)
        put(g + "attn_v.weight", p + "self_attn.v_proj.weight", "attn_v")
        put(g + "attn_output.weight", p + "self_attn.o_proj.weight", "attn_output")
        put(g + "ffn_gate.weight", p + "mlp.gate_proj.weight", "ffn_gate")
        put(g + "ffn_up.weight", p + "mlp.up_proj.weight", "ffn_up")
        put(g + "ffn_down.weight", p + "mlp.down_proj.weight", "ffn_down")
        for b in ("q", "k", "v"):
            if p + f"self_attn.{b}_proj.bias" in sd:
                put(g + f"attn_{b}.bias", p + f"self_attn.{b}_proj.bias", None)
        if p + "self_attn.q_norm.weight" in sd:
            put(g + "attn_q_norm.weight", p + "self_attn.q_norm.weight", None)
            put(g + "attn_k_norm.weight", p + "self_attn.k_norm.weight", None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # The reference: the model with exactly the file's weights.
    ref = {k: torch.from_numpy(v) for k, v in held.items()}
    if cfg.tie_word_embeddings:
        ref["lm_head.weight"] = ref["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(ref, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    write_reference(model, f"{name}.{kind}", os.path.basename(path))
    print("wrote", path, os.path.getsize(path), "bytes", file=sys.stderr)


def write_hf(name, model, sd, dtype):
    """<family>.hf/: the model as a Hugging Face checkpoint (config.json, model.safetensors
    with the matrices in `dtype` and the norms and biases in F32, tokenizer.json,
    tokenizer_config.json), transformers' logits for exactly those weights beside it."""
    from safetensors.numpy import save_file
    out_dir = os.path.join(OUT, f"{name}.hf")
    os.makedirs(out_dir, exist_ok=True)
    model.config.to_json_file(os.path.join(out_dir, "config.json"))
    held, tensors = {}, {}
    for k, v in sd.items():
        if k == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if v.ndim == 2:
            t = torch.from_numpy(v).to(dtype)
            held[k] = t.float()
            tensors[k] = t.view(torch.int16).numpy() if dtype == torch.bfloat16 else t.numpy()
        else:
            held[k] = torch.from_numpy(v)
            tensors[k] = v
    if dtype == torch.bfloat16:  # numpy has no bf16: write the torch tensors
        from safetensors.torch import save_file as save_torch
        save_torch({k: (torch.from_numpy(sd[k]).to(dtype) if sd[k].ndim == 2 else torch.from_numpy(sd[k])).contiguous()
                    for k in tensors}, os.path.join(out_dir, "model.safetensors"))
    else:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    alphabet = byte_alphabet()
    vocab = {t: i for i, t in enumerate(alphabet + ["Ġt"])}
    added = [{"id": 257 + i, "content": c, "special": True, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False} for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": [["Ġ", "t"]], "byte_fallback": False}}
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": False}, f)
    if model.config.tie_word_embeddings:
        held["lm_head.weight"] = held["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(held, strict=False)
    assert not [m for m in missing if "rotary_emb" not in m] and not unexpected, (missing, unexpected)
    write_reference(model, f"{name}.hf", f"{name}.hf")
    print("wrote", out_dir, file=sys.stderr)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(20261201)
    for name, arch, model in families():
        model = model.float().eval()
        # Norm weights and biases away from their initial 1 and 0, so each is tested
        # (Gemma's norms scale by 1 + w: w near 0).
        with torch.no_grad():
            for k, v in model.named_parameters():
                if k.endswith("norm.weight"):
                    v.copy_((0.0 if arch == "gemma3" else 1.0) + 0.2 * torch.randn_like(v))
                elif k.endswith(".bias"):
                    v.copy_(0.1 * torch.randn_like(v))
        sd = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
        if ONLY and name != ONLY:
            continue
        kinds = KINDS[name]
        for kind in kinds:
            write_family(name, arch, model, sd, kind)
        if name in HF_DIRS:
            write_hf(name, model, sd, HF_DIRS[name])


if __name__ == "__main__":
    main()
