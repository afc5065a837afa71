#include "storage/memory_store.h"

#include <utility>
#include <vector>

namespace bs {

std::shared_ptr<const ChunkKv> MemoryKvStore::get(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
  ++stats_.hits;
  return it->second.kv;
}

bool MemoryKvStore::contains(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.count(key) != 0;
}

bool MemoryKvStore::put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
  if (!kv) return false;
  const auto size = static_cast<int64_t>(kv->bytes());
  if (pinner_ && size <= budget_) {
    // Once per entry (an entry put twice, or by two threads, is pinned once); K and V
    // both or neither: a loader reads them in place only when both are.
    std::lock_guard<std::mutex> lock(pin_mu_);
    if (!kv->host_pin && !kv->k.empty() && !kv->v.empty()) {
      auto k = pinner_(kv->k.data(), static_cast<int64_t>(kv->k.size()));
      auto v = k ? pinner_(kv->v.data(), static_cast<int64_t>(kv->v.size())) : nullptr;
      if (k && v) kv->host_pin = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(k, v);
    }
  }
  std::vector<std::pair<ChunkKey, std::shared_ptr<const ChunkKv>>> evicted;
  std::shared_ptr<const EvictionListener> listener;
  std::shared_ptr<const ChunkKv> replaced;  // released after the lock, like the victims
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size > budget_) return false;
    if (auto it = map_.find(key); it != map_.end()) {
      stats_.bytes -= static_cast<int64_t>(it->second.kv->bytes());
      replaced = std::move(it->second.kv);
      lru_.erase(it->second.lru_pos);
      map_.erase(it);
    }
    while (stats_.bytes + size > budget_ && !lru_.empty()) {
      auto victim = map_.find(lru_.back());
      stats_.bytes -= static_cast<int64_t>(victim->second.kv->bytes());
      evicted.emplace_back(victim->first, std::move(victim->second.kv));
      map_.erase(victim);
      lru_.pop_back();
      ++stats_.evictions;
    }
    lru_.push_front(key);
    map_.emplace(key, Entry{std::move(kv), lru_.begin()});
    stats_.bytes += size;
    ++stats_.puts;
    if (!evicted.empty()) listener = listener_;
  }
  if (listener && *listener)
    for (auto& [k, v] : evicted) (*listener)(k, std::move(v));
  return true;
}

bool MemoryKvStore::erase(const ChunkKey& key) {
  std::shared_ptr<const ChunkKv> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  stats_.bytes -= static_cast<int64_t>(it->second.kv->bytes());
  dropped = std::move(it->second.kv);
  lru_.erase(it->second.lru_pos);
  map_.erase(it);
  return true;
}

std::vector<ChunkKey> MemoryKvStore::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ChunkKey> out;
  out.reserve(map_.size());
  for (const auto& [key, entry] : map_) out.push_back(key);
  return out;
}

StoreStats MemoryKvStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StoreStats s = stats_;
  s.entries = static_cast<int64_t>(map_.size());
  return s;
}

void MemoryKvStore::set_eviction_listener(EvictionListener listener) {
  auto next = listener ? std::make_shared<const EvictionListener>(std::move(listener)) : nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  listener_.swap(next);
}

}  // namespace bs
