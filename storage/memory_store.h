// The RAM tier: chunk KV by key, least-recently-used eviction under a byte budget.
// Entries are immutable and shared: a reader keeps its entry alive even if it is
// evicted meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "storage/chunk_kv.h"
#include "storage/kv_store.h"

namespace bs {

class MemoryKvStore : public KvStore {
 public:
  // Called with each entry evicted to fit the budget (the runtime demotes it to the
  // next tier). Not called for erase() or for the old value of a key put again.
  using EvictionListener = std::function<void(const ChunkKey&, std::shared_ptr<const ChunkKv>)>;

  // Page-locks `bytes` at `p` for the device's DMA and returns what undoes it when it is
  // released (nullptr: not pinned; the loaders then copy through staging).
  using Pinner = std::function<std::shared_ptr<void>(const void* p, int64_t bytes)>;

  explicit MemoryKvStore(int64_t byte_budget, Pinner pinner = {})
      : budget_(byte_budget), pinner_(std::move(pinner)) {}

  std::shared_ptr<const ChunkKv> get(const ChunkKey& key) override;
  bool contains(const ChunkKey& key) const override;
  // Inserts (or replaces) an entry, evicting the least recently used ones to fit. With a
  // pinner, the entry's K and V are page-locked first (once per entry; outside the lock).
  // An entry larger than the whole budget (or a null one) is not stored; returns
  // false then. The eviction listener runs after the store's lock is released, on
  // the thread of this put, once per victim, least recently used first; by then the
  // victims are gone from this store (a get() in between is a miss).
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) override;
  bool erase(const ChunkKey& key) override;
  StoreStats stats() const override;
  // Every key held now (a copy, any order): what a cluster worker reports.
  std::vector<ChunkKey> keys() const;
  int64_t budget() const override { return budget_; }
  std::string_view name() const override { return "ram"; }

  // Replaces the listener (an empty one removes it). Puts already past their
  // eviction step may still call the previous one.
  void set_eviction_listener(EvictionListener listener);

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
  std::shared_ptr<const EvictionListener> listener_;  // swapped whole under mu_
  const Pinner pinner_;
  std::mutex pin_mu_;  // one entry pinned at a time (whether it is pinned is decided under it)
};

}  // namespace bs
