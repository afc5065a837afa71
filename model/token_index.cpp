#include "model/token_index.h"

namespace bs {

void TokenIndex::build(const std::vector<std::string>& texts) {
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
