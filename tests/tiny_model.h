// A tiny synthetic Llama as a GGUF (model/gguf_writer.h): a few layers of random F32
// weights, dim 64, 4 query / 2 KV heads, tied embeddings, a ~300-token byte-level BPE
// tokenizer with ChatML control tokens. Loads through LlamaModel like the real model,
// in milliseconds, so code over the model (the blend engine) can run under the
// sanitizers without the real model's minutes. Tests change one key of the writer to
// make a variant (tests/test_model_unsupported.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "blend/rag_prompt.h"
#include "model/gguf_writer.h"
#include "model/tokenizer.h"

namespace bs::testing {

constexpr int kDefaultLayers = 2;
constexpr int kDim = 64, kHeads = 4, kKvHeads = 2, kHeadDim = kDim / kHeads;
constexpr int kFf = 256;  // a multiple of 256, so ffn_down rows hold whole K-quant blocks
constexpr int kKvDim = kKvHeads * kHeadDim;

// GPT-2's byte-level alphabet: byte b as the UTF-8 of its printable stand-in.
inline std::vector<std::string> byte_level_alphabet() {
  std::vector<int> cp(256, -1);
  auto keep = [&](int lo, int hi) {
    for (int b = lo; b <= hi; ++b) cp[b] = b;
  };
  keep('!', '~');
  keep(0xA1, 0xAC);
  keep(0xAE, 0xFF);
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (cp[b] < 0) cp[b] = 256 + n++;
  std::vector<std::string> out;
  for (int c : cp) {
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    out.push_back(s);
  }
  return out;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  int32_t bos = -1, eos = -1;
  size_t n_special = 0;  // the last n_special tokens are control tokens
};

// 256 byte tokens, merges building common pieces ("hi", "Ġthe", "Ġworld", ...), then
// three control tokens: about 300 tokens.
inline Vocab bpe_vocab() {
  Vocab v;
  v.tokens = byte_level_alphabet();
  v.types.assign(v.tokens.size(), 1);
  const char* pairs[][2] = {
      {"h", "i"},   {"t", "h"},    {"e", "r"},    {"i", "n"},    {"a", "n"},    {"o", "n"},   {"r", "e"},
      {"e", "n"},   {"a", "t"},    {"o", "r"},    {"h", "e"},    {"l", "l"},    {"i", "s"},   {"i", "t"},
      {"e", "s"},   {"e", "d"},    {"o", "u"},    {"l", "d"},    {"Ġ", "t"},    {"Ġ", "a"},   {"Ġ", "h"},
      {"Ġ", "w"},   {"Ġ", "o"},    {"Ġ", "i"},    {"Ġ", "y"},    {"Ġ", "th"},   {"Ġth", "e"}, {"Ġh", "i"},
      {"he", "ll"}, {"hell", "o"}, {"or", "ld"},  {"Ġw", "orld"}, {"Ġ", "is"},  {"Ġ", "it"}, {"Ġo", "f"},
      {"Ġy", "ou"}, {"Ġa", "n"},   {"Ġan", "d"},  {"Ġ", "in"},   {"Ġ", "on"},   {"Ġa", "t"},  {"Ġ", "hello"},
  };
  for (const auto& p : pairs) {
    v.merges.push_back(std::string(p[0]) + " " + p[1]);
    v.tokens.push_back(std::string(p[0]) + p[1]);
    v.types.push_back(1);
  }
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(s);
    v.types.push_back(3);
  }
  v.n_special = 3;
  v.bos = static_cast<int32_t>(v.tokens.size()) - 3;
  v.eos = static_cast<int32_t>(v.tokens.size()) - 1;
  return v;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = d(rng);
  return out;
}

// Width, head counts and vocabulary of a tiny model (head_dim = dim / heads; the CPU
// attention kernels take multiples of 16).
// extra_control_tokens: more control tokens after the three (zero embedding rows, so
// never emitted), to make the vocabulary a multiple of a tensor parallel degree
// (301 + 3 = 304 = 4 * 76: the LM head splits across 2 or 4 ranks).
struct TinyShape {
  int dim = kDim;
  int heads = kHeads;
  int kv_heads = kKvHeads;
  int extra_control_tokens = 0;
};

// A complete Llama GGUF: metadata under `arch`, F32 weights, tied embeddings, a
// byte-level BPE tokenizer. The control tokens' embedding rows are zero, so (tied) their
// logits are 0 while some ordinary token's is positive: greedy decoding always emits an
// ordinary token.
inline GgufWriter tiny_llama_writer(const std::string& arch = "llama", int layers = kDefaultLayers,
                                    TinyShape shape = {}) {
  Vocab v = bpe_vocab();
  for (int i = 0; i < shape.extra_control_tokens; ++i) {
    v.tokens.push_back("<|extra_" + std::to_string(i) + "|>");
    v.types.push_back(3);
    ++v.n_special;
  }
  const auto n_vocab = static_cast<int>(v.tokens.size());
  const int dim = shape.dim;
  const int kv_dim = shape.kv_heads * (dim / shape.heads);
  GgufWriter w;
  w.str("general.architecture", arch);
  w.str("general.name", "tiny synthetic " + arch);
  w.u32(arch + ".block_count", static_cast<uint32_t>(layers));
  w.u32(arch + ".context_length", 2048);
  w.u32(arch + ".embedding_length", dim);
  w.u32(arch + ".feed_forward_length", kFf);
  w.u32(arch + ".attention.head_count", static_cast<uint32_t>(shape.heads));
  w.u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(shape.kv_heads));
  w.f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.f32(arch + ".rope.freq_base", 10000.0f);
  w.u32(arch + ".vocab_size", static_cast<uint32_t>(n_vocab));
  w.str("tokenizer.ggml.model", "gpt2");
  w.str("tokenizer.ggml.pre", "gpt-2");  // llama.cpp's name for it
  w.str_array("tokenizer.ggml.tokens", v.tokens);
  w.i32_array("tokenizer.ggml.token_type", v.types);
  w.str_array("tokenizer.ggml.merges", v.merges);
  w.u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
  w.u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos));
  w.boolean("tokenizer.ggml.add_bos_token", false);

  uint32_t seed = 1;
  auto matrix = [&](const std::string& name, int out, int in) {
    w.tensor(name, {static_cast<uint64_t>(in), static_cast<uint64_t>(out)}, 0,
             GgufWriter::f32_bytes(random_floats(static_cast<size_t>(out) * in, seed++, 0.1f)));
  };
  auto ones = [&](const std::string& name) {
    w.tensor(name, {static_cast<uint64_t>(dim)}, 0, GgufWriter::f32_bytes(std::vector<float>(dim, 1.0f)));
  };
  std::vector<float> embd = random_floats(static_cast<size_t>(n_vocab) * dim, seed++, 0.5f);
  std::fill(embd.end() - static_cast<ptrdiff_t>(v.n_special * dim), embd.end(), 0.0f);
  w.tensor("token_embd.weight", {static_cast<uint64_t>(dim), static_cast<uint64_t>(n_vocab)}, 0,
           GgufWriter::f32_bytes(embd));
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ones(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", dim, dim);
    matrix(p + "attn_k.weight", kv_dim, dim);
    matrix(p + "attn_v.weight", kv_dim, dim);
    matrix(p + "attn_output.weight", dim, dim);
    ones(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", kFf, dim);
    matrix(p + "ffn_up.weight", kFf, dim);
    matrix(p + "ffn_down.weight", dim, kFf);
  }
  ones("output_norm.weight");
  return w;
}

// A RAG prompt in the tiny vocabulary: a system prefix, four short documents (the
// chunks) and a question (the suffix).
inline RagPrompt tiny_rag_prompt(const Tokenizer& tok) {
  RagPrompt p;
  p.prefix = tok.encode("<|im_start|>system\nyou read<|im_end|>\n<|im_start|>user\n", true);
  for (const char* doc : {"hello world and the world is on it\n\n", "the hill and the inn at the end of it\n\n",
                          "you and i in the hello world of worlds\n\n", "on and on at the hotel in the north\n\n"})
    p.chunks.push_back(tok.encode(doc, false));
  p.suffix = tok.encode("what is it<|im_end|>\n<|im_start|>assistant\n", true);
  return p;
}

}  // namespace bs::testing
