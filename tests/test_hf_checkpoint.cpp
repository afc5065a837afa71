// The safetensors reader (model/safetensors.h) and Hugging Face checkpoint directories
// (model/hf_checkpoint.h): malformed files are errors naming the problem, and what a
// checkpoint asks for that we do not compute is refused at load by name. The tiny
// Llama checkpoint of tests/fixtures/arch/llama.hf (whose logits test_model_arch checks
// against transformers) is copied and changed one thing at a time.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/hf_checkpoint.h"
#include "model/llama_model.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "tests/model_fixture.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using bs::safetensors::File;
using bs::safetensors::SafetensorsError;
using nlohmann::json;

const fs::path kLlama = fs::path(BLENDSERVE_FIXTURES) / "arch" / "llama.hf";
const fs::path kGemma3 = fs::path(BLENDSERVE_FIXTURES) / "arch" / "gemma3.hf";

std::vector<uint8_t> st_bytes(const json& header, const std::vector<uint8_t>& data) {
  const std::string h = header.dump();
  std::vector<uint8_t> out(8);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void expect_error(const std::vector<uint8_t>& b, const std::string& needle) {
  try {
    File::parse(b.data(), b.size(), "test");
    ADD_FAILURE() << "parsed; expected an error naming '" << needle << "'";
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ParsesAValidFileAndRefusesEachMalformation) {
  std::vector<uint8_t> data(26);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  const json ok = {{"a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}},
                   {"b", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {16, 24}}}},
                   {"__metadata__", {{"format", "pt"}}}};
  const auto good = st_bytes(ok, data);
  const File f = File::parse(good.data(), good.size());
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f.tensors()[1].type, bs::kernels::TensorType::BF16);
  EXPECT_EQ(f.tensors()[1].data, good.data() + (good.size() - 26) + 16);

  expect_error({1, 2, 3}, "truncated");
  auto huge = good;
  huge[5] = 0x7f;
  expect_error(huge, "header length");
  expect_error(st_bytes(json::array({1, 2}), {}), "not a JSON object");
  std::vector<uint8_t> not_json = {4, 0, 0, 0, 0, 0, 0, 0, '{', 'x', 'y', 'z'};
  expect_error(not_json, "not JSON");
  expect_error(st_bytes({{"x", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}}}}, std::vector<uint8_t>(8)),
               "dtype I64");
  expect_error(st_bytes({{"x", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}}}, std::vector<uint8_t>(8)),
               "outside the data");
  expect_error(st_bytes({{"x", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}}}, std::vector<uint8_t>(8)),
               "holds 8 bytes for 3");
  expect_error(st_bytes({{"x", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}}}, std::vector<uint8_t>(4)),
               "invalid dimension");
  expect_error(st_bytes({{"x", {{"dtype", "F16"}, {"shape", {1}}}}}, std::vector<uint8_t>(2)), "lacks");
}

// A copy of the tiny Llama checkpoint to change.
struct Checkpoint {
  bs::testing::TempDir tmp{"bs_hf_checkpoint"};
  fs::path dir = tmp.path() / "tiny-llama";
  explicit Checkpoint(const fs::path& from = kLlama) { fs::copy(from, dir, fs::copy_options::recursive); }
  json read(const std::string& name) const {
    std::ifstream in(dir / name);
    return json::parse(in);
  }
  void write(const std::string& name, const json& j) const { std::ofstream(dir / name) << j.dump(); }
  void edit_config(const std::function<void(json&)>& f) const {
    json c = read("config.json");
    f(c);
    write("config.json", c);
  }
};

std::unique_ptr<bs::LlamaModel> load(const std::string& path) {
  return std::make_unique<bs::LlamaModel>(path, bs::testing::shared_backend(), bs::kernels::Precision::F32);
}

void expect_refused(const std::string& path, const std::vector<std::string>& needles) {
  try {
    load(path);
    ADD_FAILURE() << path << " loaded; expected an error naming '" << needles.front() << "'";
  } catch (const std::exception& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(HfCheckpoint, LoadsFromTheDirectoryOrItsSafetensorsFileAndNamesTheModelByIt) {
  Checkpoint c;
  const auto from_dir = load(c.dir.string());
  EXPECT_EQ(from_dir->config().architecture, "llama");
  EXPECT_EQ(from_dir->config().rope_style, bs::kernels::RopeStyle::HalfSplit) << "a checkpoint's q/k are half-split";
  EXPECT_EQ(from_dir->config().rope_scaling.type, "llama3") << "rope_freqs computed from the config's factors";
  const auto from_file = load((c.dir / "model.safetensors").string());
  EXPECT_EQ(from_file->fingerprint(), from_dir->fingerprint());
  EXPECT_EQ(bs::open_model_file(c.dir.string()).get_string("general.name"), "tiny-llama");
  EXPECT_EQ(from_dir->tokenizer().eos_id(), 259);
  bs::Transformer a(*from_dir), b(*from_file);
  auto ca = a.make_cache(4), cb = b.make_cache(4);
  EXPECT_EQ(a.forward(std::vector<int32_t>{1, 2, 3}, ca), b.forward(std::vector<int32_t>{1, 2, 3}, cb));
}

TEST(HfCheckpoint, ShardsNamedByTheIndexLoadAndAnUnknownTensorIsRefusedByItsName) {
  Checkpoint c;
  // The weights split in two shards (the index names which holds which).
  fs::rename(c.dir / "model.safetensors", c.dir / "model-00001-of-00002.safetensors");
  const std::vector<uint8_t> extra = st_bytes(
      {{"model.layers.0.mlp.experts.0.down_proj.weight", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}},
      std::vector<uint8_t>(4));
  json map = json::object();
  {
    const auto st = File::open((c.dir / "model-00001-of-00002.safetensors").string());
    for (const auto& t : st.tensors()) map[t.name] = "model-00001-of-00002.safetensors";
  }
  c.write("model.safetensors.index.json", {{"metadata", json::object()}, {"weight_map", map}});
  EXPECT_NO_THROW(load(c.dir.string()));
  std::ofstream(c.dir / "model-00002-of-00002.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(extra.data()), static_cast<std::streamsize>(extra.size()));
  map["model.layers.0.mlp.experts.0.down_proj.weight"] = "model-00002-of-00002.safetensors";
  c.write("model.safetensors.index.json", {{"metadata", json::object()}, {"weight_map", map}});
  expect_refused(c.dir.string(), {"'model.layers.0.mlp.experts.0.down_proj.weight'"});
  map["x"] = "../elsewhere.safetensors";
  c.write("model.safetensors.index.json", {{"weight_map", map}});
  expect_refused(c.dir.string(), {"invalid file"});
}

// Gemma 3 (gemma3_text): what its config says is read (test_model_arch checks the
// logits of tests/fixtures/arch/gemma3.hf), and each thing we do not compute is refused
// by name: another activation, a bidirectional encoder (EmbeddingGemma), a layer type
// we do not know, local layers with scaled RoPE, soft-capping.
TEST(HfCheckpoint, Gemma3ConfigIsReadAndWhatItAsksBeyondIsRefusedByName) {
  {
    Checkpoint c(kGemma3);
    const auto file = bs::open_model_file(c.dir.string());
    EXPECT_EQ(file.get_string("general.architecture"), "gemma3");
    EXPECT_EQ(file.get_int("gemma3.attention.sliding_window"), 8);
    EXPECT_EQ(file.get_float("gemma3.rope.freq_base_swa"), 10000.0);
    EXPECT_EQ(file.get_float("gemma3.rope.freq_base"), 1e6);
    EXPECT_EQ(file.get_string("gemma3.rope.scaling.type"), "linear");
    EXPECT_EQ(file.get_float("blendserve.query_pre_attn_scalar"), 64.0);
    // Norms held as 1 + w: the checkpoint's w is near 0, the view's near 1.
    const auto& n = file.tensor("blk.0.post_attention_norm.weight");
    EXPECT_EQ(n.type, bs::kernels::TensorType::F32);
    EXPECT_NEAR(reinterpret_cast<const float*>(n.data)[0], 1.0f, 0.9f);
    EXPECT_TRUE(file.find_tensor("blk.5.post_ffw_norm.weight"));
    const auto m = load(c.dir.string());
    const auto& cfg = m->config();
    EXPECT_EQ(cfg.local_layers, (std::vector<bool>{true, true, true, true, true, false}));
    EXPECT_EQ(m->window(0), 8);
    EXPECT_EQ(m->window(5), 0);
    EXPECT_FLOAT_EQ(cfg.attn_scale, 0.125f);
    EXPECT_NE(m->rope(0).table.inv_freq, m->rope(5).table.inv_freq);
    // The older key: a period (transformers 4's sliding_window_pattern).
    c.edit_config([](json& j) {
      j.erase("layer_types");
      j["sliding_window_pattern"] = 3;
    });
    EXPECT_EQ(load(c.dir.string())->config().local_layers, (std::vector<bool>{true, true, false, true, true, false}));
  }
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"activation", [](json& c) { c["hidden_activation"] = "gelu"; }, {"hidden_act 'gelu'", "gelu_pytorch_tanh"}},
      {"encoder", [](json& c) { c["use_bidirectional_attention"] = true; }, {"use_bidirectional_attention"}},
      {"layer type", [](json& c) { c["layer_types"][2] = "chunked_attention"; }, {"layer_types", "chunked_attention"}},
      {"local rope",
       [](json& c) { c["rope_parameters"]["sliding_attention"] = {{"rope_type", "linear"}, {"factor", 2.0}}; },
       {"sliding_attention", "'linear'"}},
      {"softcap", [](json& c) { c["final_logit_softcapping"] = 30.0; }, {"final_logit_softcapping", "soft-capping"}},
      {"multimodal", [](json& c) { c["model_type"] = "gemma3"; c["text_config"] = json::object(); }, {"multimodal"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Checkpoint c(kGemma3);
    c.edit_config(k.edit);
    expect_refused(c.dir.string(), k.needles);
  }
}

// Each config feature we do not compute is refused, naming it.
TEST(HfCheckpoint, ConfigFeaturesWeDoNotComputeAreRefusedByName) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"arch", [](json& c) { c["model_type"] = "gemma2"; }, {"'gemma2'", "supported: llama"}},
      {"activation", [](json& c) { c["hidden_act"] = "gelu"; }, {"hidden_act 'gelu'", "silu"}},
      {"yarn", [](json& c) { c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}, {"factor", 4.0}}; },
       {"'yarn'"}},
      {"window", [](json& c) { c["sliding_window"] = 16; }, {"sliding_window", "sliding-window"}},
      {"softcap", [](json& c) { c["final_logit_softcapping"] = 30.0; }, {"final_logit_softcapping", "soft-capping"}},
      {"partial", [](json& c) { c["partial_rotary_factor"] = 0.5; }, {"rope.dimension_count", "partial rotary"}},
      {"experts", [](json& c) { c["num_local_experts"] = 8; }, {"expert_count", "mixture-of-experts"}},
      {"multimodal", [](json& c) { c["text_config"] = {{"hidden_size", 8}}; }, {"multimodal"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Checkpoint c;
    c.edit_config(k.edit);
    expect_refused(c.dir.string(), k.needles);
  }
}

// generation_config.json's eos_token_id list (Llama 3.1 Instruct has three): every id in
// it ends a generation, the first is the EOS where tokenizer_config.json names none, and
// a token outside it (not a control token) does not end one.
TEST(HfCheckpoint, EveryEosTokenOfTheGenerationConfigEndsAGeneration) {
  Checkpoint c;
  json tc = c.read("tokenizer_config.json");
  tc.erase("eos_token");
  c.write("tokenizer_config.json", tc);
  c.write("generation_config.json", json{{"eos_token_id", {100, 120}}});
  const auto m = load(c.dir.string());
  const bs::Tokenizer& tok = m->tokenizer();
  ASSERT_FALSE(tok.is_control(100) || tok.is_control(120) || tok.is_control(121));
  EXPECT_EQ(tok.eos_id(), 100);
  EXPECT_TRUE(tok.ends_generation(100));
  EXPECT_TRUE(tok.ends_generation(120));
  EXPECT_FALSE(tok.ends_generation(121));
  // A generation that draws 120 stops there, with the text before it.
  bs::SamplingParams p;
  p.max_tokens = 8;
  bs::DecodeSession s(tok, m->config().vocab, p);
  EXPECT_FALSE(s.step_token(121, true).done);
  const auto last = s.step_token(120, true);
  EXPECT_TRUE(last.done);
  EXPECT_EQ(s.finish_reason(), "stop");
  EXPECT_EQ(s.tokens(), std::vector<int32_t>{121});
}

TEST(HfCheckpoint, TokenizersOtherThanByteLevelBpeAndMissingFilesAreRefusedByName) {
  {
    Checkpoint c;
    json t = c.read("tokenizer.json");
    t["model"]["type"] = "WordPiece";
    c.write("tokenizer.json", t);
    expect_refused(c.dir.string(), {"model.type 'WordPiece'"});
  }
  {
    // A Unigram model is read (tests/test_tokenizer_unigram.cpp), with a Metaspace
    // pre-tokenizer, not a byte-level one.
    Checkpoint c;
    json t = c.read("tokenizer.json");
    t["model"]["type"] = "Unigram";
    c.write("tokenizer.json", t);
    expect_refused(c.dir.string(), {"pre_tokenizer ByteLevel", "Unigram"});
  }
  {
    Checkpoint c;
    json t = c.read("tokenizer.json");
    t["model"]["byte_fallback"] = true;
    c.write("tokenizer.json", t);
    expect_refused(c.dir.string(), {"pre_tokenizer", "SentencePiece BPE"});
  }
  {
    Checkpoint c;
    json t = c.read("tokenizer.json");
    t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
    c.write("tokenizer.json", t);
    expect_refused(c.dir.string(), {"pre_tokenizer", "Metaspace"});
  }
  {
    Checkpoint c;
    fs::remove(c.dir / "tokenizer.json");
    expect_refused(c.dir.string(), {"tokenizer.json"});
  }
  {
    Checkpoint c;
    fs::remove(c.dir / "config.json");
    expect_refused(c.dir.string(), {"without a config.json"});
    expect_refused((c.dir / "model.safetensors").string(), {"has no config"});
  }
  {
    Checkpoint c;
    std::ofstream(c.dir / "config.json") << "{ not json";
    expect_refused(c.dir.string(), {"config.json", "not JSON"});
  }
}

// The id /v1/models lists: a checkpoint's directory name (dots and all), a GGUF file's
// name without .gguf and its quantization suffix.
TEST(HfCheckpoint, ModelsAreNamedByTheirDirectoryOrFileName) {
  Checkpoint c;
  const fs::path dotted = c.tmp.path() / "Llama-3.1-8B-Instruct";
  fs::rename(c.dir, dotted);
  EXPECT_EQ(bs::model_display_name(dotted.string()), "Llama-3.1-8B-Instruct");
  EXPECT_EQ(bs::model_display_name(dotted.string() + "/"), "Llama-3.1-8B-Instruct");
  EXPECT_EQ(bs::model_display_name((dotted / "model.safetensors").string()), "Llama-3.1-8B-Instruct");
  EXPECT_EQ(bs::model_display_name("/m/SmolLM2-135M-Instruct.Q4_1.gguf"), "SmolLM2-135M-Instruct");
  EXPECT_EQ(bs::model_display_name("/m/Llama-3.1-8B-Instruct-Q4_K_M.gguf"), "Llama-3.1-8B-Instruct");
  EXPECT_EQ(bs::model_display_name("/m/qwen2.5-7b-instruct.gguf"), "qwen2.5-7b-instruct");
  EXPECT_EQ(bs::model_display_name("random:llama-3.1-8b"), "random:llama-3.1-8b");
}

}  // namespace
