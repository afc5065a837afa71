// The RAM tier: chunk KV by key, least-recently-used eviction under a byte budget.
// Entries are immutable and shared: a reader keeps its entry alive even if it is
// evicted meanwhile.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "storage/chunk_kv.h"
#include "storage/kv_store.h"

namespace bs {

class MemoryKvStore : public KvStore {
 public:
  explicit MemoryKvStore(int64_t byte_budget) : budget_(byte_budget) {}

  std::shared_ptr<const ChunkKv> get(const ChunkKey& key) override;
  bool contains(const ChunkKey& key) const override;
  // Inserts (or replaces) an entry, evicting the least recently used ones to fit.
  // An entry larger than the whole budget is not stored; returns false then.
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) override;
  bool erase(const ChunkKey& key) override;
  StoreStats stats() const override;
  int64_t budget() const override { return budget_; }
  std::string_view name() const override { return "ram"; }

 private:
  struct Entry {
    std::shared_ptr<const ChunkKv> kv;
    std::list<ChunkKey>::iterator lru_pos;
  };
  mutable std::mutex mu_;
  int64_t budget_;
  std::list<ChunkKey> lru_;  // front = most recent
  std::unordered_map<ChunkKey, Entry, ChunkKeyHash> map_;
  StoreStats stats_;
};

}  // namespace bs
