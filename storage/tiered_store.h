// Stores in lookup order (fastest first: RAM, then SSD, ...) behind the one
// KvStore interface, for callers that want whole entries synchronously: in the
// runtime, write-back's "stored already?" (chunks, learnt passages, prefix blocks),
// the intake's count of a pasted-passage prompt's stored prefix blocks,
// Runtime::store_document (POST /v1/documents, warm included) and erase_document;
// in tests and tools, a StoreBackedBlend over the runtime's tiers. A hit in a later tier is promoted into
// the first. put() writes through to every tier, so the persistent ones hold what
// survives a restart. No prefill reads it: the runtime's loaders stream from the
// tiers directly, and a stored entry that fails mid-load makes the prefill begin
// again from a new plan with that part computed.
#pragma once

#include <mutex>
#include <vector>

#include "storage/kv_store.h"

namespace bs {

class TieredKvStore final : public KvStore {
 public:
  // Null entries (a tier that is off) are skipped.
  explicit TieredKvStore(std::vector<KvStore*> tiers);

  std::shared_ptr<const ChunkKv> get(const ChunkKey& key) override;
  bool contains(const ChunkKey& key) const override;
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) override;
  bool erase(const ChunkKey& key) override;
  // Sums of every tier (bytes, entries, evictions, corrupt); hits and misses are
  // this view's own lookups.
  StoreStats stats() const override;
  int64_t budget() const override;
  std::string_view name() const override { return "tiered"; }

 private:
  std::vector<KvStore*> tiers_;
  mutable std::mutex mu_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace bs
