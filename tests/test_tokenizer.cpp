// Tokenizer and chat template tests against the SmolLM2 GGUF.
//
// Reference ids come from implementations we did not write:
//   tests/fixtures/golden_tokens.json          llama.cpp (llama-cpp-python), parse_special=True
//   tests/fixtures/tokenizer_hf_reference.json HuggingFace tokenizers rebuilt from the GGUF
//                                              vocab/merges (tools/fixtures/make_tokenizer_fixture.py)
// llama.cpp is the runtime the model was converted for, so where the two differ
// llama.cpp's ids are the ones to match.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "blend/rag_prompt.h"
#include "model/tokenizer.h"

namespace {

using bs::ChatMessage;
using bs::StreamDecoder;
using bs::Tokenizer;
using bs::TokenizerSpec;
using bs::gguf::GgufFile;
using nlohmann::json;

const std::string kModel = BLENDSERVE_DEFAULT_MODEL;
const std::string kFixtures = BLENDSERVE_FIXTURES;

struct Shared {
  GgufFile file;
  Tokenizer tok;
};

// Loaded once for the whole binary.
Shared* shared() {
  static std::unique_ptr<Shared> s = []() -> std::unique_ptr<Shared> {
    if (!std::filesystem::exists(kModel)) return nullptr;
    GgufFile f = GgufFile::open(kModel);
    Tokenizer t = Tokenizer::from_gguf(f);
    return std::unique_ptr<Shared>(new Shared{std::move(f), std::move(t)});
  }();
  return s.get();
}

#define REQUIRE_MODEL()                                                  \
  do {                                                                   \
    if (!shared()) FAIL() << "model file not found (run tools/setup.sh): " << kModel;   \
  } while (0)

std::optional<json> load_json(const std::string& name) {
  std::ifstream in(kFixtures + "/" + name);
  if (!in) return std::nullopt;
  return json::parse(in);
}

// Escapes a text for failure messages.
std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out.size() > 160 ? out.substr(0, 160) + "..." : out;
}

std::string show_ids(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size() && i < 64; ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  if (ids.size() > 64) out += ",...";
  return out + "] (" + std::to_string(ids.size()) + ")";
}

// Strict UTF-8 validation (no overlongs, surrogates or values > U+10FFFF).
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    const unsigned char b = p[i];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + need >= n) return false;
    for (size_t k = 1; k <= need; ++k) {
      if (p[i + k] < lo || p[i + k] > hi) return false;
      lo = 0x80;
      hi = 0xBF;
    }
    i += need + 1;
  }
  return true;
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// Expected ids of the HF reference: llama.cpp-semantics ids where the fixture lists a divergence.
std::vector<Case> hf_cases(const json& j) {
  std::vector<Case> cases;
  for (size_t i = 0; i < j.at("texts").size(); ++i) {
    cases.push_back({j["texts"][i].get<std::string>(), j["ids"][i].get<std::vector<int32_t>>()});
  }
  if (j.contains("divergences")) {
    for (const auto& d : j["divergences"]) {
      cases.at(d.at("index").get<size_t>()).ids = d.at("ids_llama_semantics").get<std::vector<int32_t>>();
    }
  }
  return cases;
}

std::vector<Case> golden_cases(const json& j) {
  std::vector<Case> cases;
  for (size_t i = 0; i < j.at("texts").size(); ++i) {
    cases.push_back({j["texts"][i].get<std::string>(), j["ids"][i].get<std::vector<int32_t>>()});
  }
  return cases;
}

// All fixture texts plus a few local ones.
std::vector<std::string> all_texts() {
  std::vector<std::string> texts;
  if (auto j = load_json("tokenizer_hf_reference.json")) {
    for (const auto& t : (*j)["texts"]) texts.push_back(t.get<std::string>());
  }
  if (auto j = load_json("golden_tokens.json")) {
    for (const auto& t : (*j)["texts"]) texts.push_back(t.get<std::string>());
  }
  texts.push_back("Emoji split across tokens: 🧑‍🚀🦄🫠 and CJK 𠀀𪚥 龘");
  texts.push_back("\xf0\x9f\x98\x80\xf0\x9f\x98\x81\xf0\x9f\x98\x82");
  return texts;
}

size_t compare_cases(const Tokenizer& tok, const std::vector<Case>& cases, const char* what) {
  size_t bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok.encode(cases[i].text, /*parse_special=*/true);
    if (got != cases[i].ids) {
      ++bad;
      ADD_FAILURE() << what << " text #" << i << " \"" << show(cases[i].text) << "\"\n  expected "
                    << show_ids(cases[i].ids) << "\n  got      " << show_ids(got);
    }
  }
  return bad;
}

TokenizerSpec spec_from_file(const GgufFile& f) {
  TokenizerSpec s;
  s.model = f.get_string("tokenizer.ggml.model").value();
  s.pre = f.get_string("tokenizer.ggml.pre").value();
  s.tokens = *f.get_string_array("tokenizer.ggml.tokens");
  s.token_types = *f.get_int_array("tokenizer.ggml.token_type");
  s.merges = *f.get_string_array("tokenizer.ggml.merges");
  s.bos_id = static_cast<int32_t>(f.get_int("tokenizer.ggml.bos_token_id").value());
  s.eos_id = static_cast<int32_t>(f.get_int("tokenizer.ggml.eos_token_id").value());
  return s;
}

// ---- vocabulary ------------------------------------------------------------------------

TEST(Tokenizer, Metadata) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  for (int32_t id = 0; id <= 16; ++id) EXPECT_TRUE(tok.is_control(id)) << id;
  EXPECT_FALSE(tok.is_control(17));
  EXPECT_FALSE(tok.is_control(-1));
  EXPECT_FALSE(tok.is_control(tok.vocab_size()));
  EXPECT_EQ(tok.token_id("<|endoftext|>"), 0);
  EXPECT_EQ(tok.token_id("<|im_start|>"), 1);
  EXPECT_EQ(tok.token_id("<|im_end|>"), 2);
  EXPECT_EQ(tok.token_id("<repo_name>"), 3);
  EXPECT_EQ(tok.token_id("<empty_output>"), 16);
  EXPECT_EQ(tok.token_id("no such token, surely"), -1);
  // Raw text falls back to its byte-level form.
  EXPECT_EQ(tok.token_id("\n"), tok.token_id("\xC4\x8A"));  // "Ċ"
  EXPECT_GE(tok.token_id(" the"), 0);
  EXPECT_EQ(tok.token_bytes(1), "<|im_start|>");
  EXPECT_EQ(tok.token_bytes(tok.token_id(" the")), " the");
  EXPECT_EQ(tok.token_bytes(tok.token_id("\n")), "\n");
  EXPECT_THROW(tok.token_bytes(-1), std::out_of_range);
  EXPECT_THROW(tok.token_bytes(49152), std::out_of_range);
}

// The end tokens a GGUF declares besides its EOS (tokenizer.ggml.eot_token_id,
// eom_token_id: Llama 3.1's <|eot_id|> and <|eom_id|>) end a generation; other plain
// tokens do not.
TEST(Tokenizer, EndOfTurnTokensEndAGeneration) {
  bs::GgufWriter w;
  w.str("tokenizer.ggml.model", "gpt2").str_array("tokenizer.ggml.tokens", bs::byte_level_alphabet());
  w.i32("tokenizer.ggml.eos_token_id", 10).i32("tokenizer.ggml.eot_token_id", 65).i32("tokenizer.ggml.eom_token_id", 66);
  const auto bytes = w.bytes();
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::parse(bytes.data(), bytes.size()));
  for (int32_t id : {10, 65, 66}) EXPECT_TRUE(tok.ends_generation(id)) << id;
  for (int32_t id : {11, 64, 67}) EXPECT_FALSE(tok.ends_generation(id)) << id;
}

TEST(Tokenizer, RejectsUnsupportedSpecs) {
  TokenizerSpec s;
  s.tokens = {"a", "b", "ab"};
  s.merges = {"a b"};
  s.model = "llama";  // SentencePiece: not implemented
  EXPECT_THROW(Tokenizer{s}, std::invalid_argument);
  s.model = "gpt2";
  s.pre = "no-such-pre";
  EXPECT_THROW(Tokenizer{s}, std::invalid_argument);
  s.pre = "default";
  s.token_types = {1, 1};
  EXPECT_THROW(Tokenizer{s}, std::invalid_argument);
  s.token_types.clear();
  Tokenizer t(s);
  EXPECT_EQ(t.encode("abab", false), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(t.encode("ba", false), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(t.encode("ac", false), (std::vector<int32_t>{0}));  // 'c' has no token: dropped
  EXPECT_EQ(t.bos_id(), -1);
}

TEST(Tokenizer, BpeTiesMergeLeftmostFirst) {
  TokenizerSpec s;
  s.tokens = {"a", "aa", "aaa"};
  s.merges = {"a a", "aa a"};
  Tokenizer t(s);
  EXPECT_EQ(t.encode("aaa", false), (std::vector<int32_t>{2}));
  EXPECT_EQ(t.encode("aaaa", false), (std::vector<int32_t>{1, 1}));  // rank 0 everywhere before rank 1
  EXPECT_EQ(t.encode("aaaaa", false), (std::vector<int32_t>{1, 2}));
}

// ---- reference ids ---------------------------------------------------------------------

TEST(Tokenizer, MatchesHuggingFaceReference) {
  REQUIRE_MODEL();
  auto j = load_json("tokenizer_hf_reference.json");
  ASSERT_TRUE(j) << "missing fixture tokenizer_hf_reference.json (tools/fixtures/make_tokenizer_fixture.py)";
  const auto cases = hf_cases(*j);
  ASSERT_GE(cases.size(), 40u);
  EXPECT_EQ(compare_cases(shared()->tok, cases, "hf"), 0u);
}

// parse_special=false: control-token texts are tokenized as plain text.
TEST(Tokenizer, MatchesHuggingFaceReferenceWithoutSpecial) {
  REQUIRE_MODEL();
  auto j = load_json("tokenizer_hf_reference.json");
  ASSERT_TRUE(j);
  if (!j->contains("no_special")) FAIL() << "fixture has no no_special ids";
  auto cases = hf_cases(*j);
  for (const auto& d : (*j)["no_special"]) {
    cases.at(d.at("index").get<size_t>()).ids = d.at("ids").get<std::vector<int32_t>>();
  }
  ASSERT_GT((*j)["no_special"].size(), 0u);
  const Tokenizer& tok = shared()->tok;
  size_t bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok.encode(cases[i].text, /*parse_special=*/false);
    if (got != cases[i].ids) {
      ++bad;
      ADD_FAILURE() << "hf (no special) text #" << i << " \"" << show(cases[i].text) << "\"\n  expected "
                    << show_ids(cases[i].ids) << "\n  got      " << show_ids(got);
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Tokenizer, MatchesLlamaCppGolden) {
  REQUIRE_MODEL();
  auto j = load_json("golden_tokens.json");
  if (!j) FAIL() << "tests/fixtures/golden_tokens.json not present";
  const auto cases = golden_cases(*j);
  ASSERT_FALSE(cases.empty());
  EXPECT_EQ(compare_cases(shared()->tok, cases, "llama.cpp"), 0u);
}

// The other pre-tokenizers (gpt2, llama3, qwen2) on the same vocabulary.
TEST(Tokenizer, OtherPreTokenizersMatchReference) {
  REQUIRE_MODEL();
  auto j = load_json("tokenizer_hf_reference.json");
  ASSERT_TRUE(j);
  if (!j->contains("pre_variants")) FAIL() << "fixture has no pre_variants";
  for (const auto& [pre, ids] : (*j)["pre_variants"].items()) {
    TokenizerSpec s = spec_from_file(shared()->file);
    s.pre = pre;
    Tokenizer tok(std::move(s));
    std::vector<Case> cases;
    for (size_t i = 0; i < ids.size(); ++i) {
      cases.push_back({(*j)["texts"][i].get<std::string>(), ids[i].get<std::vector<int32_t>>()});
    }
    EXPECT_EQ(compare_cases(tok, cases, pre.c_str()), 0u) << "pre=" << pre;
  }
}

TEST(Tokenizer, SpecialTokens) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  EXPECT_EQ(tok.encode("<|im_start|>", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok.encode("<|im_start|><|im_end|><|endoftext|>", true), (std::vector<int32_t>{1, 2, 0}));
  const auto plain = tok.encode("<|im_start|>user", false);
  EXPECT_GT(plain.size(), 2u);
  for (int32_t id : plain) EXPECT_FALSE(tok.is_control(id)) << id;
  EXPECT_EQ(tok.decode(plain), "<|im_start|>user");
  // Special tokens split the text; the pieces around them are tokenized on their own.
  const auto a = tok.encode("Hi<|im_end|>\nthere", true);
  std::vector<int32_t> b = tok.encode("Hi", true);
  b.push_back(2);
  const auto c = tok.encode("\nthere", true);
  b.insert(b.end(), c.begin(), c.end());
  EXPECT_EQ(a, b);
  // Partial special tokens are plain text.
  for (int32_t id : tok.encode("<|im_start and <|im_end|", true)) EXPECT_FALSE(tok.is_control(id));
  EXPECT_TRUE(tok.encode("", true).empty());
}

// ---- decoding ---------------------------------------------------------------------------

TEST(Tokenizer, DecodeRoundTrip) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  const auto texts = all_texts();
  ASSERT_GE(texts.size(), 40u);
  for (const auto& t : texts) {
    EXPECT_EQ(tok.decode(tok.encode(t, true)), t) << show(t);
    EXPECT_EQ(tok.decode(tok.encode(t, false)), t) << show(t);
  }
}

TEST(Tokenizer, InvalidUtf8InputIsByteEncoded) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  // Lone continuation byte, truncated 3-byte sequence, overlong "/", surrogate.
  for (std::string t : {std::string("abc\x80xyz"), std::string("end\xE2\x82"), std::string("\xE2\x82 x"),
                        std::string("\xE0\x80\xAF/"), std::string("s\xED\xA0\x80s")}) {
    EXPECT_EQ(tok.decode(tok.encode(t, true)), t) << show(t);
  }
  // Bytes without a token of their own in this vocabulary (e.g. 0xFF) are dropped, as in llama.cpp.
  EXPECT_EQ(tok.decode(tok.encode("a\xFF" "b", true)), "ab");
}

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool* chunks_valid) {
  StreamDecoder sd(tok);
  std::string out;
  *chunks_valid = true;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    if (!valid_utf8(piece)) *chunks_valid = false;
    out += piece;
  }
  const std::string rest = sd.flush();
  if (!valid_utf8(rest)) *chunks_valid = false;
  return out + rest;
}

TEST(Tokenizer, StreamDecoderMatchesDecode) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  size_t split_tokens = 0;  // tokens whose bytes are not complete UTF-8 by themselves
  for (const auto& t : all_texts()) {
    const auto ids = tok.encode(t, true);
    for (int32_t id : ids) split_tokens += !valid_utf8(tok.token_bytes(id));
    bool chunks_valid;
    EXPECT_EQ(stream_decode(tok, ids, &chunks_valid), tok.decode(ids)) << show(t);
    EXPECT_TRUE(chunks_valid) << show(t);
  }
  EXPECT_GT(split_tokens, 10u) << "the texts should include characters split across tokens";

  // An emoji whose 4 bytes come in several tokens appears only once complete.
  const auto ids = tok.encode("\xF0\x9F\xAB\xA0", true);  // U+1FAE0
  ASSERT_GT(ids.size(), 1u);
  StreamDecoder sd(tok);
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(sd.push(ids[i]), "");
  EXPECT_EQ(sd.push(ids.back()), "\xF0\x9F\xAB\xA0");
  EXPECT_EQ(sd.flush(), "");
}

TEST(Tokenizer, StreamDecoderReplacesInvalidBytes) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  const int32_t cont = tok.token_id("\x80");   // lone continuation byte
  const int32_t lead = tok.token_id("\xE2");   // 3-byte lead
  const int32_t a = tok.token_id("a");
  ASSERT_GE(cont, 0);
  ASSERT_GE(lead, 0);
  ASSERT_GE(a, 0);
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(a), "a");
  EXPECT_EQ(sd.push(cont), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(lead), "");
  EXPECT_EQ(sd.push(a), "\xEF\xBF\xBD" "a");  // lead byte followed by ASCII
  EXPECT_EQ(sd.push(lead), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");      // truncated tail
  EXPECT_EQ(sd.flush(), "");
  EXPECT_EQ(sd.push(tok.token_id("<|im_end|>")), "<|im_end|>");
}

// Random texts from a pool of awkward fragments: round trip and streaming properties.
TEST(Tokenizer, RandomizedProperties) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  const std::vector<std::string> pool = {
      "a", "Z", "the", " ", "  ", "\t", "\n", "\r\n", "\xC2\xA0", "\xE3\x80\x80", "0", "7", "42", "'s", "'LL",
      "'", "!", "...", "<|im_start|>", "<|im_end|>", "<|im_", "|>", "<", "\xC3\xA9", "e\xCC\x81", "\xE4\xB8\xAD",
      "\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "\xD9\xA3", "\xE2\x85\xAB", "\x01", "\x7F", "_", "-"};
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string t;
    const int n = static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) t += pool[rng() % pool.size()];
    const bool special = rng() % 2;
    const auto ids = tok.encode(t, special);
    ASSERT_EQ(tok.decode(ids), t) << show(t);
    bool chunks_valid;
    ASSERT_EQ(stream_decode(tok, ids, &chunks_valid), t) << show(t);
    ASSERT_TRUE(chunks_valid) << show(t);
  }
  // Arbitrary bytes: never crash, streamed output is always valid UTF-8.
  for (int iter = 0; iter < 2000; ++iter) {
    std::string t(rng() % 40, '\0');
    for (char& c : t) c = static_cast<char>(rng());
    const auto ids = tok.encode(t, true);
    bool chunks_valid;
    stream_decode(tok, ids, &chunks_valid);
    ASSERT_TRUE(chunks_valid) << show(t);
    if (valid_utf8(t) && t.find_first_of(std::string("\x04\x06\x13\x14\x16\x1D", 6)) == std::string::npos) {
      ASSERT_EQ(tok.decode(ids), t) << show(t);
    }
  }
}

// max_token_bytes is the longest token's bytes, and no text takes fewer tokens than its
// bytes over it (the bound the intake checks before it tokenizes a prompt): random
// texts of the pool above, long runs of one character (BPE's longest merges), and the
// text a token stands for, repeated.
TEST(Tokenizer, NoTextTakesFewerTokensThanItsBytesOverTheLongestToken) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  size_t longest = 0;
  int32_t longest_id = -1;
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (tok.token_bytes(id).size() > longest) longest = tok.token_bytes(id).size(), longest_id = id;
  EXPECT_EQ(tok.max_token_bytes(), longest);
  EXPECT_GT(longest, 4u);
  auto check = [&](const std::string& t, bool special) {
    const size_t at_least = (t.size() + longest - 1) / longest;
    EXPECT_GE(tok.encode(t, special).size(), at_least) << show(t.substr(0, 40));
  };
  for (char c : {' ', 'a', '\n', '=', '-', '0'}) check(std::string(5000, c), false);
  std::string repeated;
  for (int i = 0; i < 50; ++i) repeated += tok.token_bytes(longest_id);
  check(repeated, false);
  check(repeated, true);
  std::mt19937 rng(7);
  const std::vector<std::string> pool = {"the", " ", "<|im_start|>", "\n\n", "    ", "abc", "\xC3\xA9", "42"};
  for (int iter = 0; iter < 300; ++iter) {
    std::string t;
    for (int i = 0, n = static_cast<int>(rng() % 200); i < n; ++i) t += pool[rng() % pool.size()];
    check(t, iter % 2 == 0);
  }
}

// ---- speed (reported, not asserted) -------------------------------------------------------

TEST(Tokenizer, Throughput) {
  REQUIRE_MODEL();
  const Tokenizer& tok = shared()->tok;
  std::string text;
  const auto texts = all_texts();
  while (text.size() < (1u << 20)) {
    for (const auto& t : texts) text += t + "\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(text, true);
  const auto t1 = std::chrono::steady_clock::now();
  const std::string back = tok.decode(ids);
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(back, text);
  const double enc_s = std::chrono::duration<double>(t1 - t0).count();
  const double dec_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("[ perf     ] encode %.2f MB -> %zu tokens in %.3f s: %.2f MB/s, %.0f tokens/s; decode %.3f s\n",
              text.size() / 1e6, ids.size(), enc_s, text.size() / 1e6 / enc_s, ids.size() / enc_s, dec_s);
}

}  // namespace
