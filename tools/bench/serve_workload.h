// The workload of `blendctl bench serve` (tools/bench/bench_serve.cpp): the dataset's
// passages and questions, documents of about N tokens made of whole passages, and the
// requests (each a Zipf-skewed draw of distinct documents and one question), all
// deterministic from the seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace bs::tools::serve {

struct Corpus {
  std::vector<std::string> passages;
  std::vector<std::string> questions;
};

// Every distinct passage (`documents`) and every question of a JSON-lines dataset.
Corpus load_corpus(const std::string& path);

// Token counting for sizing documents: the model's tokenizer when it loads, else
// about 4 characters per token.
class TokenCounter {
 public:
  explicit TokenCounter(const std::string& model_path);
  bool exact() const { return tok_ != nullptr; }
  int count(const std::string& s) const {
    return tok_ ? static_cast<int>(tok_->encode(s, false).size()) : static_cast<int>((s.size() + 3) / 4);
  }
  // The longest prefix of about `tokens` tokens.
  std::string prefix(const std::string& s, int tokens) const {
    if (!tok_) return s.substr(0, std::min(s.size(), static_cast<size_t>(tokens) * 4));
    auto ids = tok_->encode(s, false);
    if (static_cast<int>(ids.size()) <= tokens) return s;
    ids.resize(tokens);
    return tok_->decode(ids);
  }

 private:
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
};

// Documents of about `doc_tokens` tokens, each made of whole passages in a seeded
// order, the last one cut at a sentence (or word) end; every passage is used once
// until the pool is exhausted.
std::vector<std::string> make_documents(const Corpus& corpus, const TokenCounter& tc, int count, int doc_tokens,
                                        uint64_t seed);

struct RagRequest {
  std::vector<int> docs;  // indices into the document pool, in prompt order
  int question = 0;
};

// `n` requests over a pool of `pool` documents: `retrieve` distinct ones each, Zipf(`zipf`).
std::vector<RagRequest> make_requests(int n, int pool, int retrieve, double zipf, int questions, uint64_t seed);

}  // namespace bs::tools::serve
