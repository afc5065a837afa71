// The words a tokenizer has merged, with their tokens, so that a word met again (most
// of a prompt's: " the", " of", a document's names) costs one lookup instead of a
// merge: as Hugging Face's BPE keeps its words (tokenizers' `cache_capacity`). Used by
// the byte-level BPE (a pre-token's bytes -> its tokens) and by SentencePiece word by
// word (model/spm_merge.h). A word's tokens depend on the word alone, so the cache
// never changes a result.
//
// Shared by the threads encoding with one tokenizer (one mutex); bounded: kMaxWords
// words of at most kMaxWordBytes bytes (~2 MB), emptied when full.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bs {

class WordCache {
 public:
  static constexpr size_t kMaxWords = 32768;
  static constexpr size_t kMaxWordBytes = 64;  // longer runs are rare and would crowd the cache

  // Appends the word's tokens to `out` and returns true if it is known.
  bool find(std::string_view word, std::vector<int32_t>& out) const;
  // Keeps ids[0..n) as the word's tokens (a word too long is not kept).
  void add(std::string_view word, const int32_t* ids, size_t n);
  size_t size() const;

 private:
  struct Hash {
    using is_transparent = void;  // find() by string_view, no copy
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Span {
    uint32_t at, n;  // ids_[at, at + n)
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Span, Hash, std::equal_to<>> words_;
  std::vector<int32_t> ids_;  // every kept word's tokens, one after another
};

}  // namespace bs
