// Real tokenizers token for token: every vocabulary-only GGUF of llama.cpp's models/
// folder (tools/setup.sh puts it in models/llama.cpp/ from the llama-cpp-python sdist)
// with the .inp/.out test vectors llama.cpp's tests check (the ids Hugging Face's
// tokenizers give: llama.cpp's test-tokenizer-0 program; no special tokens added, none
// parsed). A vocabulary we load must give exactly those ids on every input and decode
// them back to the input; one we do not implement must be refused at load, naming
// what it is: never loaded and wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {

namespace fs = std::filesystem;
const fs::path kDir = BLENDSERVE_LLAMACPP_MODELS;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// llama.cpp's format: inputs each followed by "\n__ggml_vocab_test__\n" (the last one's
// may be missing), one line of ids per input.
struct Vectors {
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> ids;
};
Vectors read_vectors(const fs::path& gguf) {
  Vectors v;
  const std::string inp = slurp(gguf.string() + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t at = 0;
  for (;;) {
    const size_t next = inp.find(sep, at);
    if (next == std::string::npos) break;
    v.inputs.push_back(inp.substr(at, next - at));
    at = next + sep.size();
  }
  if (at < inp.size()) v.inputs.push_back(inp.substr(at));  // the last without a separator after it (Gemma 4's)
  std::ifstream out(gguf.string() + ".out");
  std::string line;
  while (std::getline(out, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    v.ids.push_back(std::move(ids));
  }
  return v;
}

// What each vocabulary is: loaded and checked, or refused with the words that name why.
const std::map<std::string, std::string> kExpected = {
    {"ggml-vocab-llama-spm.gguf", ""},  // Llama 2: SentencePiece BPE
    {"ggml-vocab-phi-3.gguf", ""},      // Phi-3: SentencePiece BPE
    {"ggml-vocab-llama-bpe.gguf", ""},  // Llama 3
    {"ggml-vocab-qwen2.gguf", ""},
    {"ggml-vocab-gpt-2.gguf", ""},
    {"ggml-vocab-starcoder.gguf", ""},
    {"ggml-vocab-refact.gguf", ""},
    {"ggml-vocab-command-r.gguf", ""},
    {"ggml-vocab-mpt.gguf", ""},
    // Pre-tokenizers that are sequences of regexes (model/pre_tokenizer_regex.h).
    {"ggml-vocab-deepseek-coder.gguf", ""},
    {"ggml-vocab-deepseek-llm.gguf", ""},
    {"ggml-vocab-falcon.gguf", ""},
    {"ggml-vocab-qwen35.gguf", ""},
    {"ggml-vocab-gemma-4.gguf", ""},  // Gemma 4: SentencePiece-style BPE by its merge list
    {"ggml-vocab-bert-bge.gguf", "WordPiece"},
};

TEST(TokenizerVocabs, EveryTestVectorOfEveryVocabularyWeLoadAndTheOthersRefusedByName) {
  ASSERT_TRUE(fs::is_directory(kDir)) << kDir << " missing: tools/setup.sh fetches it";
  int checked_vocabs = 0, checked_inputs = 0;
  for (const auto& [name, refusal] : kExpected) {
    SCOPED_TRACE(name);
    const fs::path path = kDir / name;
    ASSERT_TRUE(fs::exists(path.string() + ".inp")) << path;
    const auto file = bs::gguf::GgufFile::open(path.string());
    std::unique_ptr<bs::Tokenizer> tok;
    try {
      tok = std::make_unique<bs::Tokenizer>(bs::Tokenizer::from_gguf(file));
    } catch (const std::exception& e) {
      EXPECT_FALSE(refusal.empty()) << "refused: " << e.what();
      if (!refusal.empty()) {
        EXPECT_NE(std::string(e.what()).find(refusal), std::string::npos) << e.what();
      }
      continue;
    }
    ASSERT_TRUE(refusal.empty()) << "loaded; expected a refusal naming " << refusal;
    const Vectors v = read_vectors(path);
    ASSERT_EQ(v.inputs.size(), v.ids.size());
    ASSERT_GT(v.inputs.size(), 30u);
    // The expected ids decode back to the input (with the space a SentencePiece
    // vocabulary's add_space_prefix puts in front).
    const bool space_prefix = name == "ggml-vocab-llama-spm.gguf" || name == "ggml-vocab-phi-3.gguf";
    for (size_t i = 0; i < v.inputs.size(); ++i)
      EXPECT_EQ(tok->decode(v.ids[i]), (space_prefix && !v.inputs[i].empty() ? " " : "") + v.inputs[i]) << "input " << i;
    // Twice: the second pass, in reverse order, takes each piece the first merged
    // from the tokenizer's word cache (model/word_cache.h).
    int wrong = 0;
    for (const bool cached : {false, true}) {
      for (size_t k = 0; k < v.inputs.size(); ++k) {
        const size_t i = cached ? v.inputs.size() - 1 - k : k;
        const auto got = tok->encode(v.inputs[i], /*parse_special=*/false);
        if (got != v.ids[i] && ++wrong <= 5) {
          std::string g, w;
          for (int32_t id : got) g += std::to_string(id) + " ";
          for (int32_t id : v.ids[i]) w += std::to_string(id) + " ";
          ADD_FAILURE() << (cached ? "(cached) " : "") << "input " << i << " '" << v.inputs[i] << "': got " << g
                        << "want " << w;
        }
        checked_inputs += !cached;
      }
      if (!cached) {
        EXPECT_GT(tok->cached_words(), 10u);
      }
    }
    EXPECT_EQ(wrong, 0);
    ++checked_vocabs;
  }
  EXPECT_EQ(checked_vocabs, 14);
  EXPECT_EQ(checked_inputs, 13 * 46 + 50);  // llama.cpp's 46 inputs each, Qwen 3.5's 50
}

// SentencePiece decoding: U+2581 back to spaces, byte tokens to their bytes, so the
// ids of any input decode to the input with the leading space add_space_prefix added.
TEST(TokenizerVocabs, SentencePieceIdsDecodeBackToTheirText) {
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"}) {
    SCOPED_TRACE(name);
    const auto file = bs::gguf::GgufFile::open((kDir / name).string());
    const auto tok = bs::Tokenizer::from_gguf(file);
    const Vectors v = read_vectors(kDir / name);
    for (size_t i = 0; i < v.inputs.size(); ++i) {
      if (v.inputs[i].empty()) continue;
      EXPECT_EQ(tok.decode(v.ids[i]), " " + v.inputs[i]) << "input " << i;
    }
    // Bytes without a token of their own go out as byte tokens (<0xF0> ...).
    const auto ids = tok.encode("\xF0\x9F\xA6\x99 llama", false);
    EXPECT_EQ(tok.decode(ids), " \xF0\x9F\xA6\x99 llama");
  }
}

// A text that continues a longer one (a RAG prompt's documents and question) gets no
// space prefix at its start, and still one after each special token in it: the tokens
// encode() gives for the whole text, from where the continuation starts.
TEST(TokenizerVocabs, AContinuationHasNoSpacePrefixAtItsStart) {
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-llama-bpe.gguf"}) {
    SCOPED_TRACE(name);
    const auto tok = bs::Tokenizer::from_gguf(bs::gguf::GgufFile::open((kDir / name).string()));
    const bool spm = std::string(name).find("spm") != std::string::npos || std::string(name).find("phi") != std::string::npos;
    const std::string head = "Documents:\n";
    const std::string rest = "The tower is 330 metres tall.</s>Next";
    const auto whole = tok.encode(head + rest, true);
    const auto first = tok.encode(head, true);
    const auto cont = tok.encode_continuation(rest, true);
    std::vector<int32_t> joined(first);
    joined.insert(joined.end(), cont.begin(), cont.end());
    EXPECT_EQ(joined, whole);
    EXPECT_EQ(tok.decode(cont), spm ? "The tower is 330 metres tall.</s> Next" : rest);
    // At the start of an input, encode() puts the space there (SentencePiece).
    EXPECT_EQ(tok.decode(tok.encode(rest, true)).front() == ' ', spm);
  }
}

// Whether prompts begin with BOS: the file's tokenizer.ggml.add_bos_token, else
// llama.cpp's default (SentencePiece and the Llama 3 pre-tokenizers add it).
TEST(TokenizerVocabs, AddBosFollowsTheFileOrLlamaCppsDefault) {
  const std::map<std::string, bool> want = {
      {"ggml-vocab-llama-spm.gguf", true}, {"ggml-vocab-phi-3.gguf", true},  {"ggml-vocab-llama-bpe.gguf", true},
      {"ggml-vocab-qwen2.gguf", false},    {"ggml-vocab-gpt-2.gguf", false}, {"ggml-vocab-command-r.gguf", true},
      {"ggml-vocab-gemma-4.gguf", true},   {"ggml-vocab-falcon.gguf", false}, {"ggml-vocab-deepseek-llm.gguf", true},
  };
  for (const auto& [name, add] : want) {
    SCOPED_TRACE(name);
    const auto tok = bs::Tokenizer::from_gguf(bs::gguf::GgufFile::open((kDir / name).string()));
    EXPECT_EQ(tok.add_bos(), add);
    EXPECT_EQ(tok.bos_prefix().size(), add ? 1u : 0u);
    if (add) {
      EXPECT_EQ(tok.bos_prefix()[0], tok.bos_id());
    }
  }
}

}  // namespace
