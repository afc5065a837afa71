#include "model/spm_merge.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace bs {
namespace {

struct Symbol {
  int32_t prev, next;
  size_t off, n;  // bytes [off, off + n) of the text; n = 0: merged into its left neighbour
  int32_t id;     // by the merge list: its token (-1: a character without one); by score: unused
};

struct Bigram {
  int32_t left, right;
  double score;  // a GGUF's float scores, or the negated rank (exact either way)
  size_t size;
  int32_t result;  // by the merge list: the token the merge makes
};

// llama.cpp's llm_bigram_spm::comparator: the highest score on top, then the leftmost.
struct Lower {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

size_t utf8_len(unsigned char b) {
  static const size_t lookup[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[b >> 4];  // llama.cpp's unicode_len_utf8: a stray continuation byte is 1
}

// The merge of one word, in scratch space a thread reuses (no allocation per word once
// warm).
struct Scratch {
  std::vector<Symbol> symbols;
  std::vector<Bigram> heap;
};

class Session {
 public:
  Session(std::string_view text, const SpmVocab& v, Scratch& s) : text_(text), v_(v), symbols_(s.symbols), heap_(s.heap) {
    symbols_.clear();
    heap_.clear();
  }

  void run(std::vector<int32_t>& out) {
    for (size_t off = 0; off < text_.size();) {
      const size_t n = std::min(utf8_len(static_cast<unsigned char>(text_[off])), text_.size() - off);
      const auto index = static_cast<int32_t>(symbols_.size());
      const int32_t id = v_.pair_ranks ? v_.text_to_id->find(*v_.tokens, text_.substr(off, n)) : -1;
      symbols_.push_back({index - 1, off + n == text_.size() ? -1 : index + 1, off, n, id});
      off += n;
    }
    for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) try_add(i - 1, i);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Lower());
      const Bigram b = heap_.back();
      heap_.pop_back();
      Symbol& l = symbols_[static_cast<size_t>(b.left)];
      Symbol& r = symbols_[static_cast<size_t>(b.right)];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // one of them merged since
      l.n += r.n;
      l.id = b.result;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[static_cast<size_t>(r.next)].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int32_t i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[static_cast<size_t>(i)].next)
      emit(symbols_[static_cast<size_t>(i)], out);
  }

 private:
  std::string_view piece(const Symbol& s) const { return text_.substr(s.off, s.n); }

  void try_add(int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[static_cast<size_t>(left)];
    const Symbol& r = symbols_[static_cast<size_t>(right)];
    double score = 0;
    int32_t result = -1;
    if (v_.pair_ranks) {  // by the merge list: the pair must be one of its merges
      if (l.id < 0 || r.id < 0) return;
      const auto it = v_.pair_ranks->find(spm_pair_key(l.id, r.id));
      if (it == v_.pair_ranks->end()) return;
      score = -static_cast<double>(it->second.rank);
      result = it->second.result;
    } else {
      const int32_t id = v_.text_to_id->find(*v_.tokens, text_.substr(l.off, l.n + r.n));
      if (id < 0 || static_cast<size_t>(id) >= v_.scores->size()) return;
      score = (*v_.scores)[static_cast<size_t>(id)];
    }
    heap_.push_back({left, right, score, l.n + r.n, result});
    std::push_heap(heap_.begin(), heap_.end(), Lower());
  }

  // A final symbol: its token, or its bytes as byte tokens. Every merged symbol is a
  // token (a pair merges only into one), so only a lone character can be neither; where
  // llama.cpp re-splits a symbol along the merges that made it, none is ever needed.
  void emit(const Symbol& s, std::vector<int32_t>& out) const {
    const std::string_view text = piece(s);
    if (const int32_t id = v_.pair_ranks ? s.id : v_.text_to_id->find(*v_.tokens, text); id >= 0) {
      out.push_back(id);
      return;
    }
    for (unsigned char b : text)
      if ((*v_.byte_token)[b] >= 0) out.push_back((*v_.byte_token)[b]);
  }

  std::string_view text_;
  const SpmVocab& v_;
  std::vector<Symbol>& symbols_;
  std::vector<Bigram>& heap_;  // a max-heap by Lower
};

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

// Where `text` may be cut into words merged apart: before a U+2581 that follows another
// character, unless one of the boundary tokens stands across it there.
void word_ends(std::string_view text, const std::vector<std::string>& boundary_tokens, std::vector<size_t>& ends) {
  ends.clear();
  // Spans [from, to) no cut may fall inside: the boundary tokens' occurrences.
  std::vector<std::pair<size_t, size_t>> keep;
  for (const auto& t : boundary_tokens)
    for (size_t at = text.find(t); at != std::string_view::npos; at = text.find(t, at + 1))
      keep.emplace_back(at, at + t.size());
  std::sort(keep.begin(), keep.end());
  size_t k = 0;
  for (size_t at = text.find(kSpace, 1); at != std::string_view::npos; at = text.find(kSpace, at + 1)) {
    if (at >= 3 && text.substr(at - 3, 3) == kSpace) continue;  // inside a run of spaces
    while (k < keep.size() && keep[k].second <= at) ++k;
    bool inside = false;
    for (size_t j = k; j < keep.size() && keep[j].first < at; ++j)
      if (at > keep[j].first && at < keep[j].second) inside = true;
    if (!inside) ends.push_back(at);
  }
  ends.push_back(text.size());
}

}  // namespace

std::vector<std::string> spm_boundary_tokens(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  for (const auto& t : tokens)
    for (size_t at = t.find(kSpace, 1); at != std::string::npos; at = t.find(kSpace, at + 1))
      if (at < 3 || std::string_view(t).substr(at - 3, 3) != kSpace) {
        out.push_back(t);
        break;
      }
  return out;
}

void spm_tokenize(std::string_view text, const SpmVocab& vocab, std::vector<int32_t>& out) {
  thread_local Scratch scratch;
  if (!vocab.boundary_tokens) {
    Session(text, vocab, scratch).run(out);
    return;
  }
  // Word by word (no merge crosses a cut: a piece across one would be a boundary token,
  // which stands there), each word merged once: a word met before (in the cache's
  // earlier texts and this one; without a cache, in this text) is looked up.
  thread_local std::vector<size_t> ends;
  thread_local std::unordered_map<std::string_view, std::pair<size_t, size_t>> done;  // word -> its ids in `out`
  word_ends(text, *vocab.boundary_tokens, ends);
  done.clear();
  size_t from = 0;
  for (size_t end : ends) {
    const std::string_view word = text.substr(from, end - from);
    from = end;
    if (word.empty()) continue;
    if (vocab.cache) {
      const size_t at = out.size();
      if (word.size() > 3 && vocab.cache->find(word, out)) continue;  // 3 bytes: one character
      Session(word, vocab, scratch).run(out);
      if (word.size() > 3) vocab.cache->add(word, out.data() + at, out.size() - at);
      continue;
    }
    if (const auto it = done.find(word); it != done.end()) {
      const auto [at, n] = it->second;
      for (size_t i = 0; i < n; ++i) out.push_back(out[at + i]);
      continue;
    }
    const size_t at = out.size();
    Session(word, vocab, scratch).run(out);
    done.emplace(word, std::make_pair(at, out.size() - at));
  }
  done.clear();  // its keys point into `text`
}

}  // namespace bs
