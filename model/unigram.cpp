#include "model/unigram.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

namespace bs {

namespace {

size_t utf8_len(unsigned char b) {
  static const size_t lookup[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[b >> 4];  // a stray continuation byte is a character of its own
}

constexpr double kUnkPenalty = 10.0;  // Hugging Face's K_UNK_PENALTY, llama.cpp's unknown_token_score_penalty

}  // namespace

UnigramModel::UnigramModel(const std::vector<Piece>& pieces, int32_t unk_id, Rules rules, bool byte_fallback,
                           const std::array<int32_t, 256>& byte_token, const TokenIndex& index,
                           const TokenTexts& texts)
    : unk_id_(unk_id), hf_(rules == Rules::HuggingFace), byte_fallback_(byte_fallback), byte_token_(byte_token),
      index_(&index), texts_(&texts) {
  if (unk_id < 0 || static_cast<size_t>(unk_id) >= pieces.size())
    throw std::invalid_argument("tokenizer: a Unigram vocabulary needs its unknown piece (unk_id)");
  double min_score = std::numeric_limits<double>::max();
  std::vector<int32_t> matched;  // the pieces that may match, sorted by text below
  scores_.resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const bool normal = p.type == 1;
    if (hf_ ? true : normal) min_score = std::min(min_score, p.score);
    scores_[i] = !hf_ && p.type == 4 ? 0.0 : p.score;
    const bool matches = hf_ ? p.type != 3 : (normal || p.type == 4 || p.type == 5);
    if (matches && !p.text.empty()) matched.push_back(static_cast<int32_t>(i));
  }
  if (min_score == std::numeric_limits<double>::max()) min_score = 0;
  // llama.cpp keeps the scores and this difference in floats (a GGUF's scores are).
  unk_score_ = hf_ ? min_score - kUnkPenalty
                   : static_cast<double>(static_cast<float>(min_score) - static_cast<float>(kUnkPenalty));

  // The trie, breadth first: a node's children are the distinct next bytes of the
  // sorted texts below it, laid out together.
  std::sort(matched.begin(), matched.end(), [&](int32_t a, int32_t b) { return pieces[a].text < pieces[b].text; });
  struct Todo {
    uint32_t node, lo, hi, depth;  // matched[lo, hi) share the node's prefix of `depth` bytes
  };
  nodes_.emplace_back();
  std::deque<Todo> todo{{0, 0, static_cast<uint32_t>(matched.size()), 0}};
  while (!todo.empty()) {
    const Todo t = todo.front();
    todo.pop_front();
    uint32_t lo = t.lo;
    auto text = [&](uint32_t k) { return pieces[static_cast<size_t>(matched[k])].text; };
    if (lo < t.hi && text(lo).size() == t.depth) {  // the prefix is a piece (the last id of a text twice)
      nodes_[t.node].token = index.find(texts, text(lo));
      while (lo < t.hi && text(lo).size() == t.depth) ++lo;
    }
    const auto first = static_cast<uint32_t>(nodes_.size());
    std::vector<Todo> children;
    for (uint32_t k = lo; k < t.hi;) {
      const auto b = static_cast<uint8_t>(text(k)[t.depth]);
      uint32_t end = k;
      while (end < t.hi && static_cast<uint8_t>(text(end)[t.depth]) == b) ++end;
      Node n;
      n.byte = b;
      children.push_back({static_cast<uint32_t>(nodes_.size()), k, end, t.depth + 1});
      nodes_.push_back(n);
      k = end;
    }
    nodes_[t.node].first = first;
    nodes_[t.node].count = static_cast<uint16_t>(children.size());
    todo.insert(todo.end(), children.begin(), children.end());
  }
}

int32_t UnigramModel::child(int32_t node, uint8_t b) const {
  const Node& n = nodes_[static_cast<size_t>(node)];
  const auto begin = nodes_.begin() + n.first, end = begin + n.count;
  const auto it = std::lower_bound(begin, end, b, [](const Node& c, uint8_t v) { return c.byte < v; });
  return it != end && it->byte == b ? static_cast<int32_t>(it - nodes_.begin()) : -1;
}

void UnigramModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  const size_t n = text.size();
  if (n == 0) return;
  struct Best {
    double score;
    int32_t token;  // the last piece of the best segmentation of text[0, here)
    uint32_t from;  // where that piece starts
  };
  thread_local std::vector<Best> best;
  best.assign(n + 1, {-std::numeric_limits<double>::infinity(), -1, 0});
  best[0].score = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t at = 0; at < n;) {
    const size_t len = std::min(utf8_len(p[at]), n - at);
    const double base = best[at].score;
    bool one_char = false;
    int32_t node = 0;
    for (size_t end = at; end < n;) {
      node = child(node, p[end++]);
      if (node < 0) break;
      const int32_t tok = nodes_[static_cast<size_t>(node)].token;
      if (tok < 0) continue;
      one_char |= end - at == len;
      const double s = base + scores_[static_cast<size_t>(tok)];
      if (best[end].token < 0 || s > best[end].score) best[end] = {s, tok, static_cast<uint32_t>(at)};
    }
    if (!one_char) {
      const double s = base + unk_score_;
      if (best[at + len].token < 0 || s > best[at + len].score) best[at + len] = {s, unk_id_, static_cast<uint32_t>(at)};
    }
    at += len;
  }

  // Back from the end: the pieces in reverse, a run of unknowns as one span.
  thread_local std::vector<std::pair<uint32_t, uint32_t>> spans;  // [from, to); token, or -1: an unknown run
  thread_local std::vector<int32_t> ids;
  spans.clear();
  ids.clear();
  for (size_t end = n; end > 0;) {
    const Best& b = best[end];
    if (b.token == unk_id_ && !ids.empty() && ids.back() == -1) {
      spans.back().first = b.from;  // extends the run
    } else {
      spans.emplace_back(b.from, static_cast<uint32_t>(end));
      ids.push_back(b.token == unk_id_ ? -1 : b.token);
    }
    end = b.from;
  }
  for (size_t k = ids.size(); k-- > 0;) {
    if (ids[k] >= 0) {
      out.push_back(ids[k]);
      continue;
    }
    const std::string_view run = text.substr(spans[k].first, spans[k].second - spans[k].first);
    if (!hf_) {
      out.push_back(unk_id_);
      continue;
    }
    // Hugging Face: the run's own piece where it is one, else its bytes' pieces where
    // byte_fallback and all exist, else the unknown piece.
    if (const int32_t id = index_->find(*texts_, run); id >= 0) {
      out.push_back(id);
      continue;
    }
    bool all = byte_fallback_;
    for (unsigned char c : run) all = all && byte_token_[c] >= 0;
    if (!all) {
      out.push_back(unk_id_);
      continue;
    }
    for (unsigned char c : run) out.push_back(byte_token_[c]);
  }
}

void unigram_normalize_llamacpp(std::string_view text, bool prefix_space, bool remove_extra_whitespaces,
                                std::string& out) {
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581
  out.clear();
  bool prefixed = false, in_word = false;
  for (char c : text) {
    if (c != ' ') {
      if (!in_word) {
        in_word = true;
        if ((prefix_space && !prefixed) || remove_extra_whitespaces) {
          out += kSpace;
          prefixed = true;
        }
      }
      out.push_back(c);
    } else {
      in_word = false;
      if (!remove_extra_whitespaces) out += kSpace;
    }
  }
}

}  // namespace bs
