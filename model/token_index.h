// Vocabulary text -> token id: an open-addressing table of ids over the texts the
// tokenizer keeps anyway (TokenizerSpec::tokens). 8 bytes a token (two 4-byte slots);
// the std::unordered_map<std::string, int32_t> it replaces kept a third copy of every
// token's text in a heap node of its own, ~20 MB of Gemma 3's 262k-token vocabulary
// (README "Memory").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bs {

class TokenIndex {
 public:
  // Indexes texts[0..n); a text that occurs twice maps to its last id (llama.cpp's rule).
  void build(const std::vector<std::string>& texts);
  // The id of `text`, -1 when no token has it. `texts` must be the vector given to build.
  int32_t find(const std::vector<std::string>& texts, std::string_view text) const {
    if (slots_.empty()) return -1;
    for (uint64_t at = hash(text) & mask_;; at = (at + 1) & mask_) {
      const int32_t id = slots_[at];
      if (id < 0) return -1;
      if (texts[static_cast<size_t>(id)] == text) return id;
    }
  }

 private:
  static uint64_t hash(std::string_view s) {  // FNV-1a, then a final mix for the low bits
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h ^ (h >> 29);
  }
  std::vector<int32_t> slots_;  // -1: empty; a power of two, at most half full
  uint64_t mask_ = 0;
};

}  // namespace bs
