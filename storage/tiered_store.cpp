#include "storage/tiered_store.h"

#include <algorithm>
#include <mutex>

namespace bs {

TieredKvStore::TieredKvStore(std::vector<KvStore*> tiers) : tiers_(std::move(tiers)) {
  std::erase(tiers_, nullptr);
}

std::shared_ptr<const ChunkKv> TieredKvStore::get(const ChunkKey& key) {
  std::shared_ptr<const ChunkKv> kv;
  for (size_t i = 0; i < tiers_.size() && !kv; ++i) {
    kv = tiers_[i]->get(key);
    if (kv && i > 0) tiers_.front()->put(key, kv);  // promotion
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++(kv ? hits_ : misses_);
  return kv;
}

bool TieredKvStore::contains(const ChunkKey& key) const {
  return std::any_of(tiers_.begin(), tiers_.end(), [&](KvStore* t) { return t->contains(key); });
}

bool TieredKvStore::put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
  bool stored = false;
  // The slowest (persistent) tier first: the entry is durable before it is visible fast.
  for (auto it = tiers_.rbegin(); it != tiers_.rend(); ++it) stored = (*it)->put(key, kv) || stored;
  return stored;
}

bool TieredKvStore::erase(const ChunkKey& key) {
  bool erased = false;
  for (KvStore* t : tiers_) erased = t->erase(key) || erased;
  return erased;
}

StoreStats TieredKvStore::stats() const {
  StoreStats s;
  for (KvStore* t : tiers_) {
    const auto x = t->stats();
    s.puts += x.puts;
    s.evictions += x.evictions;
    s.bytes += x.bytes;
    s.entries += x.entries;
    s.corrupt += x.corrupt;
  }
  std::lock_guard<std::mutex> lock(mu_);
  s.hits = hits_;
  s.misses = misses_;
  return s;
}

int64_t TieredKvStore::budget() const {
  int64_t b = 0;
  for (KvStore* t : tiers_) b += t->budget();
  return b;
}

}  // namespace bs
