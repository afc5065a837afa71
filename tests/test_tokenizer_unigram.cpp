// SentencePiece Unigram (model/unigram.h) against Hugging Face's tokenizers: a small
// Unigram model trained with tokenizers on MuSiQue passages, in two layouts
// (tools/fixtures/make_unigram_tokenizer_fixture.py made them and the ids tokenizers gives;
// tests/fixtures/unigram_tokenizer_json/), read through a checkpoint's tokenizer.json
// (model/hf_checkpoint.cpp): every text's ids as Hugging Face's. The same vocabulary
// under llama.cpp's rules (a GGUF's "t5") gives them where the two rules agree, and
// what we do not implement (SentencePiece's Precompiled normalizer, subword sampling,
// ...) is refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/tokenizer.h"
#include "model/unigram.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kFixtures = fs::path(BLENDSERVE_FIXTURES) / "unigram_tokenizer_json";
const std::string kSpace = "\xE2\x96\x81";  // U+2581

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// A checkpoint directory holding only the fixture's tokenizer files (tokenizer.json
// unpacked from its .gz), removed at the end of the test.
struct TokenizerDir {
  fs::path dir;
  explicit TokenizerDir(const std::string& name) {
    std::random_device rd;
    dir = fs::temp_directory_path() / ("bs_tokenizer_unigram_" + name + "_" + std::to_string(rd()));
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
  json tokenizer_json() const { return read_json(dir / "tokenizer.json"); }
  void write_tokenizer_json(const json& j) const { std::ofstream(dir / "tokenizer.json") << j.dump(); }
  bs::Tokenizer load() const { return bs::Tokenizer::from_gguf(bs::open_hf_tokenizer(dir.string())); }
};

bool has_special_text(const std::string& t) {
  for (const char* s : {"<s>", "</s>", "<unk>", "<pad>"})
    if (t.find(s) != std::string::npos) return true;
  return false;
}

class UnigramTokenizerJson : public ::testing::TestWithParam<const char*> {};

// Every text (llama.cpp's test inputs, MuSiQue passages the model was not trained on,
// code, emoji, CJK, whitespace runs, a literal U+2581, bytes without a piece, byte
// pieces and special tokens written as text) tokenizes to Hugging Face's ids, special
// tokens parsed as a chat prompt parses them; again from the word cache.
TEST_P(UnigramTokenizerJson, EveryTextTokenizesAsHuggingFacesTokenizers) {
  const std::string name = GetParam();
  const TokenizerDir d(name);
  const bs::Tokenizer tok = d.load();
  const json expected = read_json(kFixtures / name / "expected.json");
  const auto& texts = expected.at("texts");
  const auto& ids = expected.at("ids");
  ASSERT_EQ(texts.size(), ids.size());
  ASSERT_GT(texts.size(), 70u);
  size_t equal = 0;
  for (const bool again : {false, true}) {
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto want = ids[i].get<std::vector<int32_t>>();
      const auto got = tok.encode(text, /*parse_special=*/true);
      EXPECT_EQ(got, want) << name << (again ? " (again)" : "") << " text " << i << ": " << json(text).dump();
      equal += !again && got == want;
    }
  }
  std::printf("{\"layout\": \"%s\", \"texts\": %zu, \"equal_to_hf\": %zu}\n", name.c_str(), texts.size(), equal);
  const json cfg = read_json(kFixtures / name / "tokenizer_config.json");
  EXPECT_EQ(tok.bos_id(), tok.token_id(cfg.at("bos_token").get<std::string>()));
  EXPECT_EQ(tok.eos_id(), tok.token_id(cfg.at("eos_token").get<std::string>()));
  EXPECT_FALSE(tok.add_bos());
  // Decoding: U+2581 back to spaces, byte pieces to their bytes. Where nothing is
  // unknown (the byte_fallback layout), the ids give the text back, with the space
  // prefix Metaspace put in front of it.
  if (name == "metaspace-split-bytes") {
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      if (text.find(kSpace) != std::string::npos || has_special_text(text) || text.find("<0x") != std::string::npos)
        continue;
      EXPECT_EQ(tok.decode(ids[i].get<std::vector<int32_t>>()), (text.starts_with(' ') ? "" : " ") + text) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, UnigramTokenizerJson, ::testing::Values("metaspace-split-bytes", "metaspace-first-unk"));

// The fixture's vocabulary as a GGUF's "t5" (llama.cpp's rules: float scores, the
// space prefix before the first other character, no byte fallback) gives Hugging
// Face's ids for the no-split layout wherever the two rules agree: every text but
// those starting with a space (Metaspace puts no prefix there, llama.cpp one before
// the first other character) or holding a special token's text.
TEST(UnigramGguf, LlamaCppsRulesGiveHuggingFacesIdsWhereTheyAgree) {
  const TokenizerDir d("metaspace-first-unk");
  const json t = d.tokenizer_json();
  bs::TokenizerSpec spec;
  spec.model = "t5";
  for (const auto& piece : t.at("model").at("vocab")) {
    spec.tokens.push_back(piece[0].get<std::string>());
    spec.scores.push_back(static_cast<float>(piece[1].get<double>()));  // a GGUF's scores are floats
    spec.token_types.push_back(spec.tokens.size() <= 4 ? 3 : 1);  // <pad> </s> <unk> <s>: control
  }
  spec.unk_id = t.at("model").at("unk_id").get<int32_t>();
  spec.token_types[static_cast<size_t>(spec.unk_id)] = 2;
  spec.add_space_prefix = true;
  const bs::Tokenizer tok(spec);
  const json expected = read_json(kFixtures / "metaspace-first-unk" / "expected.json");
  size_t compared = 0;
  for (size_t i = 0; i < expected.at("texts").size(); ++i) {
    const std::string text = expected["texts"][i].get<std::string>();
    if (text.starts_with(' ') || text.starts_with(kSpace) || has_special_text(text)) continue;
    EXPECT_EQ(tok.encode(text, false), expected["ids"][i].get<std::vector<int32_t>>()) << json(text).dump();
    ++compared;
  }
  EXPECT_GT(compared, 50u);
}

// llama.cpp's UGM normalizer without a character map, case by case as its code reads.
TEST(UnigramGguf, LlamaCppsNormalizer) {
  const std::string s = kSpace;
  auto norm = [](const std::string& text, bool prefix, bool merge) {
    std::string out;
    bs::unigram_normalize_llamacpp(text, prefix, merge, out);
    return out;
  };
  EXPECT_EQ(norm("a b", false, false), "a" + s + "b");
  EXPECT_EQ(norm("a b", true, false), s + "a" + s + "b");
  EXPECT_EQ(norm("  a  b ", true, false), s + s + s + "a" + s + s + "b" + s);  // the prefix before the 'a'
  EXPECT_EQ(norm("  a  b ", false, true), s + "a" + s + "b");  // runs of spaces one, none at the ends
  EXPECT_EQ(norm("  a  b ", true, true), s + "a" + s + "b");
  EXPECT_EQ(norm("   ", true, false), s + s + s);
  EXPECT_EQ(norm("   ", true, true), "");
  EXPECT_EQ(norm("", true, false), "");
}

// With remove_extra_whitespaces (llama.cpp's key), extra spaces change nothing.
TEST(UnigramGguf, RemoveExtraWhitespaces) {
  const TokenizerDir d("metaspace-first-unk");
  const json t = d.tokenizer_json();
  bs::TokenizerSpec spec;
  spec.model = "t5";
  for (const auto& piece : t.at("model").at("vocab")) {
    spec.tokens.push_back(piece[0].get<std::string>());
    spec.scores.push_back(piece[1].get<double>());
  }
  spec.unk_id = t.at("model").at("unk_id").get<int32_t>();
  spec.add_space_prefix = true;
  spec.remove_extra_whitespaces = true;
  const bs::Tokenizer tok(spec);
  EXPECT_EQ(tok.encode("  the   theory of\t the  theatre ", false), tok.encode("the theory of\t the theatre", false));
  EXPECT_EQ(tok.decode(tok.encode("the theory", false)), " the theory");
}

void expect_refused(const TokenizerDir& d, const std::string& needle) {
  try {
    d.load();
    ADD_FAILURE() << "loaded; expected a refusal naming '" << needle << "'";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(UnigramRefusals, WhatWeDoNotImplementIsRefusedByName) {
  {  // T5's layout: SentencePiece's character map, then WhitespaceSplit before Metaspace
    const TokenizerDir d("metaspace-split-bytes");
    json t = d.tokenizer_json();
    t["normalizer"] = {{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "Precompiled"}, {"precompiled_charsmap", std::string(400, 'A')}},
                         {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}}}};
    d.write_tokenizer_json(t);
    expect_refused(d, "Precompiled");
  }
  {
    const TokenizerDir d("metaspace-split-bytes");
    json t = d.tokenizer_json();
    t["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "WhitespaceSplit"}}, t["pre_tokenizer"]}}};
    d.write_tokenizer_json(t);
    expect_refused(d, "Sequence[WhitespaceSplit, Metaspace]");
  }
  {
    const TokenizerDir d("metaspace-first-unk");
    json t = d.tokenizer_json();
    t["model"]["unk_id"] = nullptr;
    d.write_tokenizer_json(t);
    expect_refused(d, "unk_id");
  }
  {
    const TokenizerDir d("metaspace-first-unk");
    json t = d.tokenizer_json();
    t["model"]["alpha"] = 0.1;
    d.write_tokenizer_json(t);
    expect_refused(d, "subword sampling");
  }
  {
    const TokenizerDir d("metaspace-first-unk");
    json t = d.tokenizer_json();
    t["pre_tokenizer"]["prepend_scheme"] = "sometimes";
    d.write_tokenizer_json(t);
    expect_refused(d, "prepend_scheme 'sometimes'");
  }
  {
    const TokenizerDir d("metaspace-first-unk");
    json t = d.tokenizer_json();
    t["model"]["type"] = "WordPiece";
    d.write_tokenizer_json(t);
    expect_refused(d, "'WordPiece'");
  }
}

// A GGUF "t5" vocabulary with SentencePiece's character map: llama.cpp's models/
// folder has one (nomic-bert-moe's), refused by what it is.
TEST(UnigramRefusals, TheCharacterMapOfARealGgufIsRefusedByName) {
  const auto file = bs::gguf::GgufFile::open(
      (fs::path(BLENDSERVE_LLAMACPP_MODELS) / "ggml-vocab-nomic-bert-moe.gguf").string());
  try {
    bs::Tokenizer::from_gguf(file);
    ADD_FAILURE() << "loaded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("Precompiled"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.precompiled_charsmap"), std::string::npos) << e.what();
  }
}

}  // namespace
