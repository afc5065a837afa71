#include "model/spm_merge.h"

#include <queue>

namespace bs {
namespace {

struct Symbol {
  int32_t prev, next;
  size_t off, n;  // bytes [off, off + n) of the text; n = 0: merged into its left neighbour
};

struct Bigram {
  int32_t left, right;
  float score;
  size_t size;
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

class Session {
 public:
  Session(std::string_view text, const SpmVocab& v) : text_(text), v_(v) {}

  void run(std::vector<int32_t>& out) {
    for (size_t off = 0; off < text_.size();) {
      const size_t n = std::min(utf8_len(static_cast<unsigned char>(text_[off])), text_.size() - off);
      const auto index = static_cast<int32_t>(symbols_.size());
      symbols_.push_back({index - 1, off + n == text_.size() ? -1 : index + 1, off, n});
      off += n;
    }
    for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) try_add(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& l = symbols_[static_cast<size_t>(b.left)];
      Symbol& r = symbols_[static_cast<size_t>(b.right)];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // one of them merged since
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[static_cast<size_t>(r.next)].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int32_t i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[static_cast<size_t>(i)].next)
      resegment(symbols_[static_cast<size_t>(i)], out);
  }

 private:
  std::string_view piece(const Symbol& s) const { return text_.substr(s.off, s.n); }

  void try_add(int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[static_cast<size_t>(left)];
    const Symbol& r = symbols_[static_cast<size_t>(right)];
    const std::string text(text_.substr(l.off, l.n + r.n));
    float score = 0;
    if (v_.pair_ranks) {  // by the merge list: the pair must be one of its merges
      const int32_t a = v_.text_to_id->find(*v_.tokens, piece(l)), b = v_.text_to_id->find(*v_.tokens, piece(r));
      if (a < 0 || b < 0) return;
      const auto it = v_.pair_ranks->find(spm_pair_key(a, b));
      if (it == v_.pair_ranks->end()) return;
      score = -static_cast<float>(it->second);  // exact: ranks stay below 2^24
    } else {
      const int32_t id = v_.text_to_id->find(*v_.tokens, text);
      if (id < 0 || static_cast<size_t>(id) >= v_.scores->size()) return;
      score = (*v_.scores)[static_cast<size_t>(id)];
    }
    queue_.push({left, right, score, text.size()});
    rev_merge_[text] = {left, right};  // the latest pair that spells it, as llama.cpp keeps
  }

  // depth bounds the recursion: a piece that is no token is re-split along the pair
  // that last spelled it, whose symbols hold their final (possibly longer) extents, as
  // in llama.cpp; past any sensible depth it goes out as bytes instead of looping.
  void resegment(const Symbol& s, std::vector<int32_t>& out, size_t depth = 0) {
    const std::string text(piece(s));
    if (const int32_t id = v_.text_to_id->find(*v_.tokens, text); id >= 0) {
      out.push_back(id);
      return;
    }
    const auto m = rev_merge_.find(text);
    if (m == rev_merge_.end() || depth > text_.size()) {  // no token: its bytes
      for (unsigned char b : text)
        if ((*v_.byte_token)[b] >= 0) out.push_back((*v_.byte_token)[b]);
      return;
    }
    const auto [left, right] = m->second;
    resegment(symbols_[static_cast<size_t>(left)], out, depth + 1);
    resegment(symbols_[static_cast<size_t>(right)], out, depth + 1);
  }

  std::string_view text_;
  const SpmVocab& v_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue_;
  std::unordered_map<std::string, std::pair<int32_t, int32_t>> rev_merge_;
};

}  // namespace

void spm_tokenize(std::string_view text, const SpmVocab& vocab, std::vector<int32_t>& out) {
  Session(text, vocab).run(out);
}

}  // namespace bs
