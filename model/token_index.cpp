#include "model/token_index.h"

namespace bs {

void TokenIndex::build(const std::vector<std::string>& texts) {
  uint64_t size = 16;
  while (size < texts.size() * 2) size *= 2;
  slots_.assign(size, -1);
  mask_ = size - 1;
  for (size_t i = 0; i < texts.size(); ++i) {
    for (uint64_t at = hash(texts[i]) & mask_;; at = (at + 1) & mask_) {
      int32_t& slot = slots_[at];
      if (slot < 0 || texts[static_cast<size_t>(slot)] == texts[i]) {
        slot = static_cast<int32_t>(i);  // new, or a duplicate text: the later id wins
        break;
      }
    }
  }
}

}  // namespace bs
