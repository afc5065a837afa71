// Vocabulary text -> token id: an open-addressing table of ids over the texts the
// tokenizer keeps anyway (TokenTexts below). 16 bytes a token (two 8-byte slots,
// each an id and 32 bits of its text's hash, so a probe compares a text only where the
// hashes agree: most lookups are of pieces that are no token, SentencePiece's merge
// asks one per adjacent pair, and they end at an empty slot without touching a text);
// the std::unordered_map<std::string, int32_t> it replaces kept a third copy of every
// token's text in a heap node of its own, ~20 MB of Gemma 3's 262k-token vocabulary
// (tools/bench/RESULTS.md, "Memory").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bs {

// Every token's text in one buffer, by id: a vocabulary as std::vector<std::string> costs
// 32 bytes a token before its text (Gemma 3's 262k tokens: 8 MB a copy, and the tokenizer
// keeps two, the vocabulary's texts and the bytes they stand for); here 4 bytes and the
// text (tools/bench/RESULTS.md, "Memory").
class TokenTexts {
 public:
  TokenTexts() = default;
  explicit TokenTexts(const std::vector<std::string>& texts);
  std::string_view operator[](size_t id) const {
    return std::string_view(blob_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  size_t size() const { return offsets_.empty() ? 0 : offsets_.size() - 1; }

 private:
  std::string blob_;
  std::vector<uint32_t> offsets_;  // [size() + 1]: text i is blob_[offsets_[i], offsets_[i + 1])
};

class TokenIndex {
 public:
  // Indexes texts[0..n); a text that occurs twice maps to its last id (llama.cpp's rule).
  void build(const TokenTexts& texts);
  // The id of `text`, -1 when no token has it. `texts` must be the ones given to build.
  int32_t find(const TokenTexts& texts, std::string_view text) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash(text);
    const uint64_t tag = h >> 32;
    for (uint64_t at = h & mask_;; at = (at + 1) & mask_) {
      const uint64_t slot = slots_[at];
      if (slot == 0) return -1;
      const auto id = static_cast<int32_t>((slot & 0xffffffffu) - 1);
      if ((slot >> 32) == tag && texts[static_cast<size_t>(id)] == text) return id;
    }
  }

 private:
  static uint64_t hash(std::string_view s) {  // FNV-1a, then a final mix for the low bits
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h ^ (h >> 29);
  }
  // (hash >> 32) << 32 | (id + 1); 0: empty. A power of two, at most half full.
  std::vector<uint64_t> slots_;
  uint64_t mask_ = 0;
};

}  // namespace bs
