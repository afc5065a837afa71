// The real SmolLM2-135M through the Hugging Face checkpoint path (model/hf_checkpoint.h):
// the default GGUF written out as a checkpoint directory the way transformers keeps it
// (config.json; model.safetensors with every tensor dequantized to F32 and Llama's q/k
// rows back in transformers' half-split order, the inverse of llama.cpp's converter
// permutation; tokenizer.json with SmolLM2's vocabulary, merges and its Digits +
// ByteLevel pre-tokenizer; tokenizer_config.json), then loaded as one. The same
// weights, half-split RoPE instead of interleaved: its logits must be the GGUF's within
// fp32 reordering and llama.cpp's golden, and its tokenizer the GGUF's token for token.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/transformer.h"
#include "tests/golden_fixture.h"
#include "tests/model_fixture.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// HF's name of a GGUF tensor (the inverse of model/hf_checkpoint.cpp's mapping).
std::string hf_name(const std::string& g) {
  static const std::vector<std::pair<std::string, std::string>> block = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},    {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  const size_t dot = g.find('.', 4);
  for (const auto& [ours, theirs] : block)
    if (g.substr(dot + 1) == ours) return "model.layers." + g.substr(4, dot - 4) + "." + theirs;
  ADD_FAILURE() << "no HF name for " << g;
  return g;
}

// rows [heads * head_dim] of GGUF's interleaved order back to transformers' half-split
// order: within each head, GGUF row 2i + j is HF row j * head_dim / 2 + i.
std::vector<float> unpermute(const std::vector<float>& w, int64_t heads, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(w.size()) / cols, hd = rows / heads, half = hd / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(&out[((h * hd) + j * half + i) * cols], &w[((h * hd) + 2 * i + j) * cols],
                    static_cast<size_t>(cols) * sizeof(float));
  return out;
}

// The GGUF at `gguf_path` as a checkpoint directory `dir`.
void export_checkpoint(const std::string& gguf_path, const fs::path& dir) {
  const auto f = bs::gguf::GgufFile::open(gguf_path);
  const std::string a = *f.get_string("general.architecture");
  const int64_t heads = *f.get_int(a + ".attention.head_count"), kv = *f.get_int(a + ".attention.head_count_kv");
  fs::create_directories(dir);
  // model.safetensors, every tensor F32.
  json header = json::object();
  std::vector<std::vector<float>> data;
  uint64_t offset = 0;
  for (const auto& t : f.tensors()) {
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    const int64_t row = t.row_elements(), row_bytes = bs::kernels::type_row_bytes(t.type, row);
    for (int64_t r = 0; r < t.n_rows(); ++r)
      bs::kernels::dequantize_row(t.type, t.data + r * row_bytes, v.data() + r * row, row);
    if (t.name.ends_with("attn_q.weight")) v = unpermute(v, heads, row);
    if (t.name.ends_with("attn_k.weight")) v = unpermute(v, kv, row);
    json shape = json::array();
    for (auto it = t.dims.rbegin(); it != t.dims.rend(); ++it) shape.push_back(*it);
    header[hf_name(t.name)] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + v.size() * 4}}};
    offset += v.size() * 4;
    data.push_back(std::move(v));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& v : data) out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  out.close();
  // config.json
  json cfg = {{"model_type", "llama"},
              {"architectures", {"LlamaForCausalLM"}},
              {"hidden_size", *f.get_int(a + ".embedding_length")},
              {"intermediate_size", *f.get_int(a + ".feed_forward_length")},
              {"num_hidden_layers", *f.get_int(a + ".block_count")},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv},
              {"max_position_embeddings", *f.get_int(a + ".context_length")},
              {"rms_norm_eps", *f.get_float(a + ".attention.layer_norm_rms_epsilon")},
              {"rope_theta", *f.get_float(a + ".rope.freq_base")},
              {"tie_word_embeddings", f.find_tensor("output.weight") == nullptr},
              {"torch_dtype", "float32"}};
  std::ofstream(dir / "config.json") << cfg.dump(1);
  // tokenizer.json: the vocabulary, merges, control tokens as special added tokens.
  const auto& tokens = *f.get_string_array("tokenizer.ggml.tokens");
  const auto& types = *f.get_int_array("tokenizer.ggml.token_type");
  json vocab = json::object(), added = json::array(), merges = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = i;
    if (types[i] == 3 || types[i] == 4)
      added.push_back({{"id", i}, {"content", tokens[i]}, {"special", types[i] == 3}});
  }
  for (const auto& m : *f.get_string_array("tokenizer.ggml.merges")) merges.push_back(m);
  EXPECT_EQ(*f.get_string("tokenizer.ggml.pre"), "smollm");
  json tok = {{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Digits"}, {"individual_digits", true}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}}}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false}}}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  json tc = {{"bos_token", tokens[*f.get_int("tokenizer.ggml.bos_token_id")]},
             {"eos_token", tokens[*f.get_int("tokenizer.ggml.eos_token_id")]},
             {"add_bos_token", false}};
  if (auto t = f.get_string("tokenizer.chat_template")) tc["chat_template"] = *t;
  std::ofstream(dir / "tokenizer_config.json") << tc.dump();
}

TEST(ModelHf, SmolLM2AsACheckpointComputesTheGgufsLogitsAndTokens) {
  REQUIRE_MODEL();
  bs::testing::TempDir tmp{"bs_model_hf"};
  const fs::path dir = tmp.path() / "SmolLM2-135M-Instruct";
  export_checkpoint(bs::testing::model_path(), dir);
  auto& be = bs::testing::shared_backend();
  bs::LlamaModel gguf(bs::testing::model_path(), be, bs::kernels::Precision::F32);
  bs::LlamaModel hf(dir.string(), be, bs::kernels::Precision::F32);
  EXPECT_EQ(hf.config().rope_style, bs::kernels::RopeStyle::HalfSplit);
  EXPECT_EQ(gguf.config().rope_style, bs::kernels::RopeStyle::Interleaved);
  // The checkpoint's tokenizer_config.json chat_template is the GGUF's: the same chats.
  EXPECT_FALSE(hf.chat_template().builtin());
  const std::vector<bs::ChatMessage> chat = {{"user", "Hi"}, {"assistant", "Hello."}, {"user", "Who are you?"}};
  EXPECT_EQ(hf.chat_template().apply(chat, true), gguf.chat_template().apply(chat, true));
  for (const char* text : {"The Eiffel Tower is 330 metres tall, built in 1889.", "  code(x) == 42\n\t\u00e9t\u00e9 \u4e2d\u6587 \U0001F600",
                           "<|im_start|>user\nhi<|im_end|>"}) {
    EXPECT_EQ(hf.tokenizer().encode(text, true), gguf.tokenizer().encode(text, true)) << text;
  }
  EXPECT_EQ(hf.tokenizer().eos_id(), gguf.tokenizer().eos_id());
  bs::Transformer tg(gguf), th(hf);
  for (const auto& g : bs::testing::golden()) {
    auto cg = tg.make_cache(static_cast<int64_t>(g.ids.size())), ch = th.make_cache(static_cast<int64_t>(g.ids.size()));
    const auto a = tg.forward(g.ids, cg, true), b = th.forward(g.ids, ch, true);
    double err = 0, mag = 1e-12;
    for (size_t i = 0; i < a.size(); ++i) {
      err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
      mag = std::max(mag, static_cast<double>(std::fabs(a[i])));
    }
    EXPECT_LT(err / mag, 1e-4) << g.ids.size() << " tokens: every position's logits, relative to the largest";
    double to_golden = 0;
    const float* last = b.data() + (g.ids.size() - 1) * hf.config().vocab;
    for (size_t i = 0; i < g.final_logits.size(); ++i)
      to_golden = std::max(to_golden, static_cast<double>(std::fabs(last[i] - g.final_logits[i])));
    EXPECT_LT(to_golden, 1e-3) << "llama.cpp's golden, the fp32 path's bound";
  }
}

}  // namespace
