// The interface every chunk-KV tier implements: RAM (memory_store.h), the SSD
// (disk_store.h), a storage node over TCP (remote_store.h) and several nodes with
// replication (replicated_store.h); TieredKvStore (tiered_store.h) stacks tiers behind
// it. StoreBackedBlend and the runtime's controller and loaders talk to KvStore only
// (the engine holds no store), so a tier is turned on or off from the config without
// touching them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "storage/chunk_kv.h"

namespace bs {

struct StoreStats {
  int64_t hits = 0, misses = 0, puts = 0, evictions = 0;
  int64_t bytes = 0, entries = 0;  // bytes: what counts against the budget
  int64_t corrupt = 0;             // entries dropped because they failed a check or a read (SSD)
  int64_t write_errors = 0;        // puts the device refused (SSD: ENOSPC, EIO, ...; the entry is not stored)
};

// One stored entry opened for reading layer by layer: what the runtime's loaders
// stream into a request's cache, one layer at a time. A tier that holds entries in
// memory gives views (no copy); a tier on a disk or across the network reads on
// demand. The reader keeps the entry readable even if the tier evicts it meanwhile.
class LayerReader {
 public:
  virtual ~LayerReader() = default;
  virtual const std::vector<int32_t>& tokens() const = 0;
  virtual int n_layers() const = 0;
  virtual int kv_heads() const = 0;
  virtual int head_dim() const = 0;
  // The stored elements' type (F32, F16, BF16): the entry's, as computed.
  virtual kernels::TensorType dtype() const = 0;
  int64_t length() const { return static_cast<int64_t>(tokens().size()); }
  // Bytes in K (and in V) of one layer: kv_heads * m * head_dim elements.
  int64_t layer_bytes() const {
    return static_cast<int64_t>(kv_heads()) * length() * head_dim() * (dtype() == kernels::TensorType::F32 ? 4 : 2);
  }
  // In-memory tiers: layer `layer`'s K and V ([kv_heads, m, head_dim] elements of
  // dtype()) without a copy, valid while the reader lives; nullptr where the tier
  // must read.
  virtual const std::byte* k_view(int /*layer*/) const { return nullptr; }
  virtual const std::byte* v_view(int /*layer*/) const { return nullptr; }
  // Reads layer `layer` into k and v (layer_bytes() each). False: the entry failed
  // (short read, checksum): the tier has dropped it, the caller treats it as a miss.
  virtual bool read_layer(int layer, std::byte* k, std::byte* v) = 0;
};

// A reader over an entry held in memory.
class MemoryLayerReader final : public LayerReader {
 public:
  explicit MemoryLayerReader(std::shared_ptr<const ChunkKv> kv) : kv_(std::move(kv)) {}
  const std::vector<int32_t>& tokens() const override { return kv_->tokens; }
  int n_layers() const override { return kv_->n_layers; }
  int kv_heads() const override { return kv_->kv_heads; }
  int head_dim() const override { return kv_->head_dim; }
  kernels::TensorType dtype() const override { return kv_->dtype; }
  const std::byte* k_view(int layer) const override { return kv_->k_layer(layer); }
  const std::byte* v_view(int layer) const override { return kv_->v_layer(layer); }
  bool read_layer(int layer, std::byte* k, std::byte* v) override {
    std::copy_n(kv_->k_layer(layer), layer_bytes(), k);
    std::copy_n(kv_->v_layer(layer), layer_bytes(), v);
    return true;
  }

 private:
  std::shared_ptr<const ChunkKv> kv_;
};

class KvStore {
 public:
  virtual ~KvStore() = default;

  // The entry opened for per-layer reads, or nullptr on a miss (counted like get).
  // The default reads the whole entry through get(); tiers that can read one layer
  // at a time (SSD, remote) override it.
  virtual std::unique_ptr<LayerReader> open_layers(const ChunkKey& key) {
    auto kv = get(key);
    return kv ? std::make_unique<MemoryLayerReader>(std::move(kv)) : nullptr;
  }

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
