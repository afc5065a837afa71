// The interface every chunk-KV tier implements (RAM now, SSD, later a remote
// storage node). The engine and the loaders talk to KvStore only, so a tier can be
// added, removed or stacked from the config without touching them.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "storage/chunk_kv.h"

namespace bs {

struct StoreStats {
  int64_t hits = 0, misses = 0, puts = 0, evictions = 0;
  int64_t bytes = 0, entries = 0;  // bytes: what counts against the budget
  int64_t corrupt = 0;             // entries dropped because they failed a check (SSD)
};

class KvStore {
 public:
  virtual ~KvStore() = default;

  // The entry, or nullptr on a miss. Entries are immutable and shared.
  virtual std::shared_ptr<const ChunkKv> get(const ChunkKey& key) = 0;
  virtual bool contains(const ChunkKey& key) const = 0;
  // Inserts (or replaces), evicting least recently used entries to fit the budget.
  // False if not stored (larger than the whole budget, or an I/O failure).
  virtual bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) = 0;
  virtual bool erase(const ChunkKey& key) = 0;
  virtual StoreStats stats() const = 0;
  virtual int64_t budget() const = 0;
  virtual std::string_view name() const = 0;  // "ram", "ssd", ...
};

}  // namespace bs
