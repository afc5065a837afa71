// A Hugging Face checkpoint's SentencePiece tokenizer.json (BPE with byte_fallback:
// Llama 2, Mistral, Gemma, Phi-3), read by model/hf_checkpoint.cpp, gives the ids
// Hugging Face's tokenizers gives, in each layout the checkpoints people download have
// (tools/fixtures/make_spm_tokenizer_fixture.py made the tokenizer.json files with transformers'
// own converter from llama.cpp's test vocabularies, and the expected ids with
// tokenizers; tests/fixtures/spm_tokenizer_json/). Layouts we do not implement are
// refused by what they are.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kFixtures = fs::path(BLENDSERVE_FIXTURES) / "spm_tokenizer_json";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// A checkpoint directory holding only the fixture's tokenizer files (tokenizer.json
// unpacked from its .gz), removed at the end of the test.
struct TokenizerDir {
  std::string name;  // the fixture: tests/fixtures/<name>/
  fs::path dir;
  explicit TokenizerDir(const std::string& fixture) : name(fixture) {
    std::random_device rd;
    dir = fs::temp_directory_path() / ("bs_tokenizer_json_" + name + "_" + std::to_string(rd()));
    fs::create_directories(dir);
    fs::copy_file(kFixtures / name / "tokenizer_config.json", dir / "tokenizer_config.json");
    const std::string cmd = "gzip -dc '" + (kFixtures / name / "tokenizer.json.gz").string() + "' > '" +
                            (dir / "tokenizer.json").string() + "'";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  }
  ~TokenizerDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // The fixture's file as it was copied, parsed once per fixture for the whole test
  // binary (these files are megabytes; under ASan each parse in the test's -O0 code
  // took seconds). Tests change a copy.
  json tokenizer_json() const {
    static std::map<std::string, json> parsed;
    auto it = parsed.find(name);
    if (it == parsed.end()) it = parsed.emplace(name, read_json(dir / "tokenizer.json")).first;
    return it->second;
  }
  void write_tokenizer_json(const json& j) const { std::ofstream(dir / "tokenizer.json") << j.dump(); }
  bs::Tokenizer load() const { return bs::Tokenizer::from_gguf(bs::open_hf_tokenizer(dir.string())); }
};

void expect_refused(const TokenizerDir& d, const std::string& needle) {
  try {
    d.load();
    ADD_FAILURE() << "loaded; expected a refusal naming '" << needle << "'";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

class SentencePieceTokenizerJson : public ::testing::TestWithParam<const char*> {};

// Every text (llama.cpp's test inputs for the vocabulary; MuSiQue passages, code,
// emoji, CJK, whitespace runs, leading spaces, bytes without a token, special tokens
// written in the text) tokenizes to Hugging Face's ids, special tokens parsed as a
// chat prompt parses them.
TEST_P(SentencePieceTokenizerJson, EveryTextTokenizesAsHuggingFacesTokenizers) {
  const std::string name = GetParam();
  const TokenizerDir d(name);
  const bs::Tokenizer tok = d.load();
  const json expected = read_json(kFixtures / name / "expected.json");
  const auto& texts = expected.at("texts");
  const auto& ids = expected.at("ids");
  ASSERT_EQ(texts.size(), ids.size());
  ASSERT_GT(texts.size(), 50u);
  size_t equal = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const auto want = ids[i].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, /*parse_special=*/true);
    EXPECT_EQ(got, want) << name << " text " << i << ": " << json(text).dump();
    equal += got == want;
  }
  std::printf("{\"layout\": \"%s\", \"texts\": %zu, \"equal_to_hf\": %zu}\n", name.c_str(), texts.size(), equal);
  // The model's BOS and EOS by name (tokenizer_config.json), BOS added as a SentencePiece
  // vocabulary's default.
  const json cfg = read_json(kFixtures / name / "tokenizer_config.json");
  EXPECT_EQ(tok.bos_id(), tok.token_id(cfg.at("bos_token").get<std::string>()));
  EXPECT_EQ(tok.eos_id(), tok.token_id(cfg.at("eos_token").get<std::string>()));
  EXPECT_GE(tok.bos_id(), 0);
  EXPECT_TRUE(tok.add_bos());
}

INSTANTIATE_TEST_SUITE_P(Layouts, SentencePieceTokenizerJson,
                         ::testing::Values("llama2-metaspace", "phi3-prepend", "llama2-gemma"));

// The same vocabulary read from its GGUF (llama.cpp's merging by score) and from its
// tokenizer.json in the legacy layout (Prepend + Replace: llama.cpp's own space rule)
// gives the same ids on plain text: the merge list and the scores agree.
TEST(SentencePieceTokenizerJsonVsGguf, TheLegacyLayoutEqualsTheGgufOnPlainText) {
  const TokenizerDir d("phi3-prepend");
  const bs::Tokenizer from_json = d.load();
  const bs::Tokenizer from_gguf = bs::Tokenizer::from_gguf(
      bs::gguf::GgufFile::open((fs::path(BLENDSERVE_LLAMACPP_MODELS) / "ggml-vocab-phi-3.gguf").string()));
  const json expected = read_json(kFixtures / "phi3-prepend" / "expected.json");
  for (const auto& t : expected.at("texts")) {
    const std::string text = t.get<std::string>();
    EXPECT_EQ(from_json.encode(text, false), from_gguf.encode(text, false)) << json(text).dump();
  }
}

TEST(SentencePieceTokenizerJsonRefusals, LayoutsWeDoNotImplementAreRefusedByWhatTheyAre) {
  {
    const TokenizerDir d("llama2-metaspace");
    json t = d.tokenizer_json();
    t["pre_tokenizer"]["split"] = true;
    d.write_tokenizer_json(t);
    expect_refused(d, "Metaspace");
  }
  {
    const TokenizerDir d("llama2-metaspace");
    json t = d.tokenizer_json();
    t["pre_tokenizer"]["prepend_scheme"] = "sometimes";
    d.write_tokenizer_json(t);
    expect_refused(d, "prepend_scheme 'sometimes'");
  }
  {
    const TokenizerDir d("phi3-prepend");
    json t = d.tokenizer_json();
    t["normalizer"] = {{"type", "NFKC"}};
    d.write_tokenizer_json(t);
    expect_refused(d, "NFKC");
  }
  {
    // Nothing turns spaces into U+2581.
    const TokenizerDir d("llama2-metaspace");
    json t = d.tokenizer_json();
    t["pre_tokenizer"] = nullptr;
    d.write_tokenizer_json(t);
    expect_refused(d, "\u2581");
  }
  {
    const TokenizerDir d("llama2-gemma");
    json t = d.tokenizer_json();
    t["model"]["ignore_merges"] = true;
    d.write_tokenizer_json(t);
    expect_refused(d, "ignore_merges");
  }
  {
    const TokenizerDir d("llama2-gemma");
    json t = d.tokenizer_json();
    t["model"]["dropout"] = 0.1;
    d.write_tokenizer_json(t);
    expect_refused(d, "dropout");
  }
}

}  // namespace
