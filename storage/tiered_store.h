// RAM over SSD behind the one KvStore interface, for callers that want whole
// entries synchronously (the engine's fallback path, tools, warm-up). A hit on the
// SSD is promoted into RAM. put() writes through to both tiers, so the SSD holds
// what survives a restart; the runtime's streaming loaders use the tiers directly.
// Either tier may be absent.
#pragma once

#include <mutex>

#include "storage/kv_store.h"

namespace bs {

class TieredKvStore final : public KvStore {
 public:
  TieredKvStore(KvStore* ram, KvStore* ssd) : ram_(ram), ssd_(ssd) {}

  std::shared_ptr<const ChunkKv> get(const ChunkKey& key) override;
  bool contains(const ChunkKey& key) const override;
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) override;
  bool erase(const ChunkKey& key) override;
  // Sums of both tiers (bytes, entries, evictions, corrupt); hits and misses are
  // this view's own lookups.
  StoreStats stats() const override;
  int64_t budget() const override;
  std::string_view name() const override { return "tiered"; }

 private:
  KvStore* ram_;
  KvStore* ssd_;
  mutable std::mutex mu_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace bs
