#include "model/word_cache.h"

namespace bs {

bool WordCache::find(std::string_view word, std::vector<int32_t>& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = words_.find(word);
  if (it == words_.end()) return false;
  const int32_t* ids = ids_.data() + it->second.at;
  out.insert(out.end(), ids, ids + it->second.n);
  return true;
}

void WordCache::add(std::string_view word, const int32_t* ids, size_t n) {
  if (word.size() > kMaxWordBytes || word.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (words_.size() >= kMaxWords) {
    words_.clear();
    ids_.clear();
  }
  const auto [it, added] = words_.try_emplace(std::string(word), Span{static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(n)});
  if (added) ids_.insert(ids_.end(), ids, ids + n);
}

size_t WordCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return words_.size();
}

}  // namespace bs
