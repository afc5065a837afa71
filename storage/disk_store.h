// The SSD tier: one file per chunk in a directory, least-recently-used eviction
// under a byte budget, and an index rebuilt from the files at start-up, so the
// cache survives restarts.
//
// File `<key.hex()>.bskv`; integers in host byte order (little-endian targets):
//   header: "BSKV", u32 version, u64 key.hi, u64 key.lo, u32 dtype (ggml numbering:
//           0 = f32, 1 = f16, 30 = bf16; the element type of every K/V value below),
//           u32 n_layers, u32 kv_heads, u32 head_dim, u64 m (token count),
//           i32 tokens[m], u64 layer_sum[n_layers], u64 header_sum;
//           zero-padded to a multiple of 4096 (header_bytes)
//   layer l at header_bytes + l * layer_span: K [kv_heads, m, head_dim] then
//           V [kv_heads, m, head_dim], zero-padded to layer_span (a multiple of 4096).
// Why this shape:
// - Layer-major, each layer 4096-aligned: layer l is one contiguous (O_DIRECT-able)
//   read, so the layer-by-layer pipeline can load layer l+1 while layer l computes.
// - Checksums (XXH3-64): one per layer over its K then V bytes, one over the header.
//   A torn, truncated, renamed or bit-rotted file is a miss and is deleted; never
//   a wrong answer. The full 128-bit key is in the header (it already folds in the
//   model fingerprint), and must match the file name and the key asked for.
// - Atomic writes: a temp file `<name>.tmp.<pid>.<n>` in the same directory, fsync,
//   rename, fsync the directory. A crash leaves the old entry or the new one, plus
//   at most a temp file that the next start-up deletes.
// Every file system call goes through a FileIo (storage/file_io.h), the real one by
// default, so tests inject ENOSPC, EIO and short reads into this very code.
// One store owns its directory: start-up deletes `.bskv` files that fail the
// header checks and our leftover temp files; other files are left alone.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/chunk_kv.h"
#include "storage/file_io.h"
#include "storage/kv_store.h"

namespace bs {

class DiskKvStore final : public KvStore {
 public:
  static constexpr int64_t kAlign = 4096;  // header and layer alignment in the file
  static constexpr uint32_t kVersion = 1;
  // After ENOSPC with nothing of ours to evict: how long writes are refused.
  static constexpr std::chrono::seconds kFullCooldown{10};

  // Called at start for each valid entry found, oldest first, with its key and
  // tokens: what another index of the stored chunks (the pasted-chunk index) learns
  // from the headers the scan reads anyway.
  using EntryVisitor = std::function<void(const ChunkKey&, std::span<const int32_t> tokens)>;

  // Creates `dir` if needed (throws std::system_error if it cannot) and indexes the
  // valid entries in it. byte_budget counts file sizes. direct_io: read with O_DIRECT
  // (falls back to buffered reads, with a warning, where the filesystem refuses).
  // io: the file system calls it makes (storage/file_io.h; null: the real ones).
  DiskKvStore(std::string dir, int64_t byte_budget, bool direct_io = false, const EntryVisitor& on_entry = {},
              std::shared_ptr<FileIo> io = nullptr);

  std::shared_ptr<const ChunkKv> get(const ChunkKey& key) override;
  bool contains(const ChunkKey& key) const override;
  // Never throws for I/O errors: a failed write returns false, removes its temp file,
  // leaves existing entries intact and counts a write error. A full device (ENOSPC,
  // EDQUOT: it holds less than the budget) makes room by evicting the least recently
  // used entries (at least this file's size) and tries once more; when all the store
  // holds is less than this file, it evicts nothing and writes are refused for
  // kFullCooldown before the next try.
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) override;
  bool erase(const ChunkKey& key) override;
  StoreStats stats() const override;
  // Every key indexed now (a copy, any order): what a cluster worker reports.
  std::vector<ChunkKey> keys() const;
  int64_t budget() const override { return budget_; }
  std::string_view name() const override { return "ssd"; }

  const std::string& dir() const { return dir_; }
  std::string path_of(const ChunkKey& key) const;

  // For benchmarks: caps the read bandwidth of this store at bytes_per_s (0 = off),
  // shared by all reader threads. Every read of the files (headers in open() and
  // get(), layers in read_layer() and get()) is charged the bytes it actually read
  // and the reader then sleeps until the bandwidth so far allows them: a pacing
  // token bucket with no burst, where time a read itself took counts as paid.
  void set_read_throttle(double bytes_per_s);
  double read_throttle() const { return read_bps_.load(std::memory_order_relaxed); }

  // An opened entry for the per-layer reader: the header's info plus the open file,
  // so it stays readable even if it is evicted meanwhile. Move-only.
  class Entry {
   public:
    Entry(Entry&& o) noexcept;
    Entry& operator=(Entry&& o) noexcept;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry();

    ChunkKey key;
    std::vector<int32_t> tokens;
    int n_layers = 0, kv_heads = 0, head_dim = 0;
    kernels::TensorType dtype = kernels::TensorType::F32;

    int64_t length() const { return static_cast<int64_t>(tokens.size()); }
    // Bytes in K (and in V) of one layer: kv_heads * m * head_dim elements of dtype.
    int64_t layer_bytes() const {
      return static_cast<int64_t>(kv_heads) * length() * head_dim * (dtype == kernels::TensorType::F32 ? 4 : 2);
    }
    int64_t layer_offset(int layer) const { return header_bytes_ + layer * layer_span_; }
    // The per-layer checksums of this file's header (n_layers values: XXH3-64 over a
    // layer's K then V bytes, storage/layer_checksum.h), as read and checked at open().
    // The storage node sends them with the entry, so a worker checks each slice end to
    // end against the file it came from.
    const std::vector<uint64_t>& layer_sums() const { return layer_sums_; }

   private:
    friend class DiskKvStore;
    Entry() = default;
    int fd_ = -1;
    bool direct_ = false;
    uint64_t dev_ = 0, ino_ = 0;
    int64_t header_bytes_ = 0, layer_span_ = 0;
    std::vector<uint64_t> layer_sums_;
  };

  // Opens and checks the header of `key`'s file; nullopt on a miss. Counts a hit or
  // a miss and makes the entry most recent.
  std::optional<Entry> open(const ChunkKey& key);
  // Reads exactly layer `layer` (one pread at its offset) into k and v, each
  // e.layer_bytes() bytes laid out [kv_heads, m, head_dim], and verifies the
  // layer's checksum. False on a short read or a mismatch: the file is then
  // removed and `corrupt` counted.
  bool read_layer(const Entry& e, int layer, std::byte* k, std::byte* v);
  // open() + read_layer() behind the tier-neutral interface the loaders use.
  std::unique_ptr<LayerReader> open_layers(const ChunkKey& key) override;

 private:
  struct Slot {
    int64_t bytes = 0;
    std::list<ChunkKey>::iterator lru_pos;
  };

  void scan(const EntryVisitor& on_entry);
  std::optional<Entry> open_entry(const ChunkKey& key);
  bool read_layer_raw(const Entry& e, int layer, std::byte* k, std::byte* v);
  // Writes `kv` (header `hdr`, layers padded to layer_span) to a new temp file beside
  // final_path and fsyncs it: 0 with its path in `tmp`, or the errno of the call that
  // failed (the temp file removed).
  int write_temp(const ChunkKv& kv, const std::vector<uint8_t>& hdr, int64_t layer_span,
                 const std::string& final_path, std::string& tmp);
  // Charges `bytes` read since `started` to the throttle, sleeping as it says.
  void throttle(int64_t bytes, std::chrono::steady_clock::time_point started);
  int open_read(const std::string& path, bool& direct);
  void drop_corrupt(const Entry& e);
  void evict_to_fit_locked(int64_t incoming);
  void unindex_locked(std::unordered_map<ChunkKey, Slot, ChunkKeyHash>::iterator it);
  void touch_locked(const ChunkKey& key);

  std::string dir_;
  int64_t budget_;
  std::atomic<bool> direct_;
  std::shared_ptr<FileIo> io_;
  std::chrono::steady_clock::time_point full_until_{};  // mu_: writes refused before then (a full device)
  std::atomic<bool> full_logged_{false};
  std::atomic<uint64_t> tmp_counter_{0};

  std::atomic<double> read_bps_{0.0};
  std::mutex throttle_mu_;
  std::chrono::steady_clock::time_point throttle_free_{};  // when the bytes charged so far are paid

  mutable std::mutex mu_;
  std::list<ChunkKey> lru_;  // front = most recent
  std::unordered_map<ChunkKey, Slot, ChunkKeyHash> map_;
  StoreStats stats_;
};

}  // namespace bs
