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

namespace bs {

struct StoreStats {
  int64_t hits = 0, misses = 0, puts = 0, evictions = 0;
  int64_t bytes = 0, entries = 0;
};

class MemoryKvStore {
 public:
  explicit MemoryKvStore(int64_t byte_budget) : budget_(byte_budget) {}

  std::shared_ptr<const ChunkKv> get(const ChunkKey& key);
  bool contains(const ChunkKey& key) const;
  // Inserts (or replaces) an entry, evicting the least recently used ones to fit.
  // An entry larger than the whole budget is not stored; returns false then.
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv);
  bool erase(const ChunkKey& key);
  StoreStats stats() const;
  int64_t budget() const { return budget_; }

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
