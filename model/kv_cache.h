// The paged KV cache: a pool of fixed-size pages and, per sequence, a page table.
//
// Why pages (vLLM's block tables): a request's cache is sized prompt + max_tokens,
// and allocating that contiguously per request fragments memory and gives no way to
// count what the server can still admit. A pool allocated once and shared out page by
// page returns a finished request's memory at once, lets admission count pages, and
// is what a device backend allocates up front. The attention kernels read a cache
// through its page table (kernels::KvView), so pages may be anywhere in the pool.
//
// Layout: K and V each [n_layers, pool pages, kv_heads, page_positions, head_dim],
// K stored after RoPE. A page covers 2^page_shift positions of every layer and head.
// Elements are the pool's dtype (F32, F16 or BF16: device.kv_dtype): rows written as
// fp32 are rounded to it (K after RoPE), rows read as fp32 are widened exactly; the
// *_raw calls move stored elements unchanged (chunk KV of the same dtype, saves).
//
// The pool's memory is its backend's (kernels::Backend::alloc): the model computes
// into it through backend ops (store_kv, rope_kv_rows, attention); the row calls here
// move bytes between it and host arrays through the backend's copies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/kv_view.h"
#include "kernels/tensor_types.h"

namespace bs {


class KvCache;

// Fixed-size pages for the KV caches of many sequences. Thread-safe: caches are
// made and destroyed on any thread (a request's cache dies where its last owner
// lets go of it).
class KvPagePool : public std::enable_shared_from_this<KvPagePool> {
 public:
  static constexpr int kDefaultPageShift = 6;  // 64 positions: a whole tile of the CPU attention kernels

  // Use make(): caches keep their pool alive through a shared_ptr. The pool's memory
  // is allocated on `backend`, which must outlive the pool and its caches.
  // dtype: F32, F16 or BF16 (std::invalid_argument otherwise).
  KvPagePool(kernels::Backend& backend, int n_layers, int kv_heads, int head_dim, int64_t pages, int page_shift,
             kernels::TensorType dtype = kernels::TensorType::F32);
  static std::shared_ptr<KvPagePool> make(kernels::Backend& backend, int n_layers, int kv_heads, int head_dim,
                                          int64_t pages, int page_shift = kDefaultPageShift,
                                          kernels::TensorType dtype = kernels::TensorType::F32) {
    return std::make_shared<KvPagePool>(backend, n_layers, kv_heads, head_dim, pages, page_shift, dtype);
  }
  // A pool in host memory (kernels::host_backend()): tests and tools without a model.
  static std::shared_ptr<KvPagePool> make(int n_layers, int kv_heads, int head_dim, int64_t pages,
                                          int page_shift = kDefaultPageShift,
                                          kernels::TensorType dtype = kernels::TensorType::F32) {
    return make(kernels::host_backend(), n_layers, kv_heads, head_dim, pages, page_shift, dtype);
  }
  // The pages of a pool that fits `bytes` (at least one page).
  static int64_t pages_in(int64_t bytes, int n_layers, int kv_heads, int head_dim,
                          int page_shift = kDefaultPageShift,
                          kernels::TensorType dtype = kernels::TensorType::F32);

  // A cache of `capacity` positions on free pages, or nothing when too few are free.
  std::optional<KvCache> try_make_cache(int64_t capacity);
  // Same; throws std::length_error when too few pages are free.
  KvCache make_cache(int64_t capacity);

  // Admission (a server's intake): pages promised to admitted requests, whether or
  // not their caches exist yet. A request is admitted only while its pages fit beside
  // the promised ones, so the cache of an admitted request finds its pages once the
  // caches of finished requests are gone. try_reserve is all or nothing.
  bool try_reserve(int64_t pages);
  void unreserve(int64_t pages);
  int64_t reserved_pages() const;
  // The ledger of promises has one writer (a server's intake actor, which owns the
  // slots and pages): claim_reservations() makes the calling thread that writer, and
  // from then on a try_reserve, unreserve or set_reserved from any other thread is
  // counted (foreign_reservation_writes) and reported on stderr, still done. The
  // runtime's protocol tests assert none. Unclaimed (a CLI, the unit tests) nothing
  // is checked.
  void claim_reservations();
  int64_t foreign_reservation_writes() const;
  // The whole ledger at once: a restarted owner's, rebuilt from the requests that
  // still hold pages.
  void set_reserved(int64_t pages);

  int64_t pages_for(int64_t positions) const { return (positions + page_positions() - 1) >> page_shift_; }
  int64_t page_positions() const { return int64_t{1} << page_shift_; }
  int page_shift() const { return page_shift_; }
  int64_t total_pages() const { return total_pages_; }
  int64_t free_pages() const;
  // Bytes of K and V one page holds (every layer).
  int64_t page_bytes() const { return 2 * n_layers_ * page_elements() * elem_bytes_; }
  kernels::TensorType dtype() const { return dtype_; }
  int64_t elem_bytes() const { return elem_bytes_; }
  int n_layers() const { return n_layers_; }
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  kernels::Backend& backend() const { return backend_; }

  // The view of one layer through a page table (kernels/kv_view.h).
  kernels::KvView view(int layer, const std::vector<int32_t>& pages, int64_t capacity) const;
  // Row of KV head h at position pos of a sequence with this page table: its first
  // stored element (elem_bytes() each), in the backend's memory.
  std::byte* k_row(int layer, const std::vector<int32_t>& pages, int h, int64_t pos) const;
  std::byte* v_row(int layer, const std::vector<int32_t>& pages, int h, int64_t pos) const;

 private:
  friend class KvCache;
  int64_t page_elements() const { return static_cast<int64_t>(kv_heads_) * page_positions() * head_dim_; }
  int64_t layer_elements() const { return total_pages_ * page_elements(); }
  int64_t row_offset(int layer, const std::vector<int32_t>& pages, int h, int64_t pos) const;
  void release(std::vector<int32_t>& pages);

  kernels::Backend& backend_;
  const int n_layers_, kv_heads_, head_dim_;
  const int64_t total_pages_;
  const int page_shift_;
  const kernels::TensorType dtype_;
  const int64_t elem_bytes_;
  // Left uninitialized (Backend::alloc): a pool is hundreds of MB to GBs and every row
  // is written before it is read (attention reads positions < n_kv only, all computed or
  // loaded), so zero-filling it is pure cost — and, untouched, the kernel backs the
  // host memory of a large allocation only where it is first written.
  kernels::DeviceBuffer k_, v_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first
  int64_t reserved_ = 0;
  std::thread::id ledger_owner_;       // default: unclaimed
  int64_t foreign_ledger_writes_ = 0;
  void check_ledger_writer_locked(const char* what);
};

// One sequence's cache, indexed by prompt position: a page table into a pool. Its
// pages go back to the pool when it is destroyed (or moved from and reassigned).
// n_layers, kv_heads, head_dim and capacity describe it and are not to be written;
// length is the caller's: positions [0, length) hold valid K/V.
class KvCache {
 public:
  int n_layers = 0, kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;
  int64_t length = 0;

  KvCache() = default;
  // A cache with a pool of its own on `backend`, exactly its pages (benchmarks, tools,
  // tests).
  KvCache(kernels::Backend& backend, int layers, int kv_heads, int head_dim, int64_t capacity,
          kernels::TensorType dtype = kernels::TensorType::F32);
  // The same in host memory (kernels::host_backend()).
  KvCache(int layers, int kv_heads, int head_dim, int64_t capacity,
          kernels::TensorType dtype = kernels::TensorType::F32)
      : KvCache(kernels::host_backend(), layers, kv_heads, head_dim, capacity, dtype) {}
  KvCache(KvCache&& other) noexcept { *this = std::move(other); }
  KvCache& operator=(KvCache&& other) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache() { reset(); }

  // Returns the pages to the pool; the cache is empty afterwards.
  void reset();

  kernels::KvView view(int layer) const { return pool_->view(layer, pages_, capacity); }
  kernels::TensorType dtype() const { return pool_->dtype(); }
  int64_t elem_bytes() const { return pool_->elem_bytes(); }
  // Row [head_dim] of KV head h at position pos of layer l, in place: fp32 caches in
  // host-accessible memory only (std::logic_error otherwise), for tests and tools that
  // inspect or poke rows. The engine goes through backend ops and read_rows /
  // write_rows, which every dtype and backend has.
  float* k_at(int l, int h, int64_t pos) { return f32_row(pool_->k_row(l, pages_, h, pos)); }
  float* v_at(int l, int h, int64_t pos) { return f32_row(pool_->v_row(l, pages_, h, pos)); }
  const float* k_at(int l, int h, int64_t pos) const { return f32_row(pool_->k_row(l, pages_, h, pos)); }
  const float* v_at(int l, int h, int64_t pos) const { return f32_row(pool_->v_row(l, pages_, h, pos)); }

  // Calls run(start, count) for the runs of consecutive rows (one page each) that
  // make up positions [pos, pos + m): rows of a run are consecutive in memory.
  template <class Run>
  void for_each_run(int64_t pos, int64_t m, const Run& run) const {
    const int64_t page = int64_t{1} << pool_->page_shift();
    for (int64_t at = pos; at < pos + m;) {
      const int64_t count = std::min(pos + m, (at / page + 1) * page) - at;
      run(at, count);
      at += count;
    }
  }
  // Rows [pos, pos + m) of KV head h of layer l from / to host [m, head_dim] fp32
  // arrays (rounded to / widened from the cache's dtype). v may be nullptr: K only.
  void write_rows(int l, int h, int64_t pos, int64_t m, const float* k, const float* v);
  void read_rows(int l, int h, int64_t pos, int64_t m, float* k, float* v) const;
  // The same rows as stored elements of the cache's dtype, copied unchanged from / to
  // host arrays. On `stream` (a loader's copy stream) the write is ordered on it, not
  // before the compute that follows: the caller records an event there and the compute
  // waits for it (actors/runtime/load_target.h's LayerEvents).
  void write_rows_raw(int l, int h, int64_t pos, int64_t m, const void* k, const void* v,
                      kernels::Stream* stream = nullptr);
  void read_rows_raw(int l, int h, int64_t pos, int64_t m, void* k, void* v) const;
  // Rows [pos, pos + m) of every KV head of layer l from host [kv_heads, m, head_dim]
  // arrays of stored elements, unchanged (a stored chunk's layer), through the backend's
  // write_kv_block: one DMA and a scatter into the pages on a device. On `stream` as
  // write_rows_raw.
  void write_block_raw(int l, int64_t pos, int64_t m, const void* k, const void* v,
                       kernels::Stream* stream = nullptr);
  // Rows [0, rows) of every KV head of layer l from / to host [kv_heads, rows, head_dim]
  // arrays of stored elements (elem_bytes() each), unchanged.
  void write_layer_raw(int l, int64_t rows, const void* k, const void* v);
  void read_layer_raw(int l, int64_t rows, void* k, void* v) const;
  // The same as fp32 [kv_heads, rows, head_dim] host arrays (rounded / widened).
  void write_layer(int l, int64_t rows, const float* k, const float* v);
  void read_layer(int l, int64_t rows, float* k, float* v) const;
  // Rows [0, rows) of every KV head of layer l from / to [kv_heads, rows, head_dim]
  // arrays of stored elements in the backend's memory (a saved copy of a layer).
  void save_layer(int l, int64_t rows, void* k, void* v) const;
  void restore_layer(int l, int64_t rows, const void* k, const void* v);

  const std::vector<int32_t>& pages() const { return pages_; }
  const std::shared_ptr<KvPagePool>& pool() const { return pool_; }

 private:
  friend class KvPagePool;
  KvCache(std::shared_ptr<KvPagePool> pool, std::vector<int32_t> pages, int64_t capacity);
  float* f32_row(std::byte* row) const;
  // Calls move(row_in_pool_k, row_in_pool_v, offset_in_array) per run of rows of head h.
  template <class Move>
  void each_head_run(int l, int h, int64_t pos, int64_t m, const Move& move) const;

  std::shared_ptr<KvPagePool> pool_;
  std::vector<int32_t> pages_;
};

}  // namespace bs
