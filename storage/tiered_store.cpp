#include "storage/tiered_store.h"

#include <mutex>

namespace bs {

std::shared_ptr<const ChunkKv> TieredKvStore::get(const ChunkKey& key) {
  std::shared_ptr<const ChunkKv> kv;
  if (ram_) kv = ram_->get(key);
  if (!kv && ssd_) {
    kv = ssd_->get(key);
    if (kv && ram_) ram_->put(key, kv);  // promotion
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++(kv ? hits_ : misses_);
  return kv;
}

bool TieredKvStore::contains(const ChunkKey& key) const {
  return (ram_ && ram_->contains(key)) || (ssd_ && ssd_->contains(key));
}

bool TieredKvStore::put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
  bool stored = false;
  if (ssd_) stored = ssd_->put(key, kv) || stored;
  if (ram_) stored = ram_->put(key, std::move(kv)) || stored;
  return stored;
}

bool TieredKvStore::erase(const ChunkKey& key) {
  bool erased = false;
  if (ram_) erased = ram_->erase(key) || erased;
  if (ssd_) erased = ssd_->erase(key) || erased;
  return erased;
}

StoreStats TieredKvStore::stats() const {
  StoreStats s;
  for (KvStore* t : {ram_, ssd_}) {
    if (!t) continue;
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

int64_t TieredKvStore::budget() const { return (ram_ ? ram_->budget() : 0) + (ssd_ ? ssd_->budget() : 0); }

}  // namespace bs
