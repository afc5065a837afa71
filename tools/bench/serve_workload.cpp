#include "tools/bench/serve_workload.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <random>
#include <stdexcept>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "model/hf_checkpoint.h"
#include "tools/bench/bench_serve.h"

namespace bs::tools {

ZipfSampler::ZipfSampler(int n, double s) {
  if (n <= 0) throw std::invalid_argument("ZipfSampler: empty population");
  weights_.resize(n);
  for (int k = 0; k < n; ++k) {
    weights_[k] = 1.0 / std::pow(static_cast<double>(k + 1), s);
    total_ += weights_[k];
  }
}

std::vector<int> ZipfSampler::draw(int count, std::mt19937_64& rng) const {
  const int n = static_cast<int>(weights_.size());
  if (count > n) throw std::invalid_argument("ZipfSampler: more distinct draws than items");
  std::vector<double> w = weights_;
  double total = total_;
  std::vector<int> out;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < count; ++i) {
    double x = u(rng) * total;
    int pick = -1;
    for (int k = 0; k < n; ++k) {
      if (w[k] <= 0) continue;
      pick = k;  // the last positive weight absorbs rounding
      if (x < w[k]) break;
      x -= w[k];
    }
    out.push_back(pick);
    total -= w[pick];
    w[pick] = 0;
  }
  return out;
}

}  // namespace bs::tools

namespace bs::tools::serve {

using json = nlohmann::json;

TokenCounter::TokenCounter(const std::string& model_path) {
  try {
    file_ = std::make_unique<gguf::GgufFile>(open_model_file(model_path));
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench serve: no tokenizer (%s); sizing documents at ~4 characters per token\n", e.what());
    tok_.reset();
  }
}

Corpus load_corpus(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open dataset " + path + " (--dataset)");
  Corpus c;
  std::unordered_set<std::string> seen;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    if (j.contains("documents")) {
      for (const auto& d : j.at("documents")) {
        auto s = d.get<std::string>();
        if (!s.empty() && seen.insert(s).second) c.passages.push_back(std::move(s));
      }
    }
    if (j.contains("question")) c.questions.push_back(j.at("question").get<std::string>());
  }
  if (c.passages.empty()) throw std::runtime_error("dataset " + path + " has no documents");
  if (c.questions.empty()) c.questions.push_back("Which of the facts above happened first? Answer briefly.");
  return c;
}

std::vector<std::string> make_documents(const Corpus& corpus, const TokenCounter& tc, int count, int doc_tokens,
                                        uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<int> order(corpus.passages.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::shuffle(order.begin(), order.end(), rng);
  size_t cursor = 0;
  auto next_passage = [&]() -> const std::string& {
    if (cursor == order.size()) {
      std::shuffle(order.begin(), order.end(), rng);
      cursor = 0;
    }
    return corpus.passages[order[cursor++]];
  };
  std::vector<std::string> docs;
  std::unordered_set<std::string> seen;
  while (static_cast<int>(docs.size()) < count) {
    std::string text;
    int tokens = 0;
    while (tokens < doc_tokens) {
      const std::string piece = (text.empty() ? "" : "\n\n") + next_passage();
      const int pt = tc.count(piece);
      if (tokens + pt <= doc_tokens) {
        text += piece;
        tokens += pt;
        continue;
      }
      std::string cut = tc.prefix(piece, doc_tokens - tokens);
      size_t end = cut.rfind(". ");
      if (end != std::string::npos && end + 1 >= cut.size() / 2) {
        cut.resize(end + 1);
      } else if ((end = cut.find_last_of(" \n")) != std::string::npos) {
        cut.resize(end);
      }
      text += cut;
      break;
    }
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    if (!text.empty() && seen.insert(text).second) docs.push_back(std::move(text));
  }
  return docs;
}

std::vector<RagRequest> make_requests(int n, int pool, int retrieve, double zipf, int questions, uint64_t seed) {
  const ZipfSampler z(pool, zipf);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> q(0, questions - 1);
  std::vector<RagRequest> out(n);
  for (auto& r : out) {
    r.docs = z.draw(retrieve, rng);
    r.question = q(rng);
  }
  return out;
}

}  // namespace bs::tools::serve
