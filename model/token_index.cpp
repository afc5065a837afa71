#include "model/token_index.h"

#include <stdexcept>

namespace bs {

TokenTexts::TokenTexts(const std::vector<std::string>& texts) {
  size_t total = 0;
  for (const auto& t : texts) total += t.size();
  if (total > UINT32_MAX) throw std::length_error("token texts: more than 4 GB");
  blob_.reserve(total);
  offsets_.reserve(texts.size() + 1);
  offsets_.push_back(0);
  for (const auto& t : texts) {
    blob_ += t;
    offsets_.push_back(static_cast<uint32_t>(blob_.size()));
  }
}

void TokenIndex::build(const TokenTexts& texts) {
  uint64_t size = 16;
  while (size < texts.size() * 2) size *= 2;
  slots_.assign(size, 0);
  mask_ = size - 1;
  for (size_t i = 0; i < texts.size(); ++i) {
    const uint64_t h = hash(texts[i]);
    const uint64_t entry = ((h >> 32) << 32) | (static_cast<uint64_t>(i) + 1);
    for (uint64_t at = h & mask_;; at = (at + 1) & mask_) {
      uint64_t& slot = slots_[at];
      if (slot == 0 || ((slot >> 32) == (h >> 32) && texts[(slot & 0xffffffffu) - 1] == texts[i])) {
        slot = entry;  // new, or a duplicate text: the later id wins
        break;
      }
    }
  }
}

}  // namespace bs
