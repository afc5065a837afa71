#include "storage/disk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "kernels/kv_view.h"
#include "storage/layer_checksum.h"

namespace bs {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[4] = {'B', 'S', 'K', 'V'};
constexpr char kSuffix[] = ".bskv";
constexpr char kTmpMarker[] = ".bskv.tmp.";
constexpr size_t kFixedBytes = 48;  // magic .. m, see disk_store.h
// Sanity bounds for a parsed header, far above any real model.
constexpr uint32_t kMaxDim = 1u << 20;
constexpr uint64_t kMaxTokens = uint64_t{1} << 30;

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// The parsed, self-consistent header of one file.
struct Header {
  ChunkKey key;
  int n_layers = 0, kv_heads = 0, head_dim = 0;
  kernels::TensorType dtype = kernels::TensorType::F32;
  std::vector<int32_t> tokens;
  std::vector<uint64_t> layer_sums;
  int64_t header_bytes = 0, layer_span = 0, file_bytes = 0;
};

// The stored element type of a header's dtype field (ggml numbering, as TensorType:
// 0 = F32, 1 = F16, 30 = BF16); nullopt for anything else.
std::optional<kernels::TensorType> kv_dtype_of(uint32_t field) {
  const auto type = static_cast<kernels::TensorType>(field);
  if (field > 1000 || !kernels::is_kv_dtype(type)) return std::nullopt;
  return type;
}

// Sizes implied by a shape; false on overflow. layer_span includes the padding.
bool layout(uint64_t n_layers, uint64_t kv_heads, uint64_t head_dim, uint64_t m, uint64_t elem_bytes,
            int64_t& header_bytes, int64_t& layer_span, int64_t& file_bytes) {
  const uint64_t header_raw = kFixedBytes + 4 * m + 8 * n_layers + 8;
  uint64_t layer_raw = 0;
  if (__builtin_mul_overflow(kv_heads, head_dim, &layer_raw) || __builtin_mul_overflow(layer_raw, m, &layer_raw) ||
      __builtin_mul_overflow(layer_raw, 2 * elem_bytes, &layer_raw) || layer_raw > (uint64_t{1} << 50))
    return false;
  header_bytes = round_up(static_cast<int64_t>(header_raw), DiskKvStore::kAlign);
  layer_span = round_up(static_cast<int64_t>(layer_raw), DiskKvStore::kAlign);
  uint64_t data = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(layer_span), n_layers, &data) || data > (uint64_t{1} << 56))
    return false;
  file_bytes = header_bytes + static_cast<int64_t>(data);
  return true;
}

// 4096-aligned buffer, as O_DIRECT needs; harmless for buffered reads.
struct AlignedBuf {
  explicit AlignedBuf(int64_t n)
      : size(round_up(std::max<int64_t>(n, 1), DiskKvStore::kAlign)),
        p(static_cast<uint8_t*>(std::aligned_alloc(DiskKvStore::kAlign, static_cast<size_t>(size)))) {
    if (!p) throw std::bad_alloc();
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  int64_t size;
  uint8_t* p;
};

// One growing aligned buffer per reading thread, so a layer read allocates (and
// page-faults) nothing: the loader reads hundreds of layer slices per request,
// on cores the compute thread needs.
uint8_t* direct_read_scratch(int64_t n) {
  thread_local std::unique_ptr<AlignedBuf> buf;
  if (!buf || buf->size < n) buf = std::make_unique<AlignedBuf>(n);
  return buf->p;
}

// pread until n bytes or EOF. 0: all read; 1: short (EOF); -1: error, errno set.
// Adds the bytes it read to *got (for the read throttle).
int read_exact(FileIo& io, int fd, void* dst, int64_t n, int64_t off, int64_t* got = nullptr) {
  auto* d = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = io.pread(fd, d, static_cast<size_t>(n), off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) return 1;
    if (got) *got += r;
    d += r, n -= r, off += r;
  }
  return 0;
}

bool write_all(FileIo& io, int fd, const void* src, size_t n) {
  auto* s = static_cast<const uint8_t*>(src);
  while (n > 0) {
    const ssize_t r = io.write(fd, s, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {  // no progress and no error: a device that takes nothing more
      errno = ENOSPC;
      return false;
    }
    s += r, n -= static_cast<size_t>(r);
  }
  return true;
}

template <class T>
T load(const uint8_t*& p) {
  T x;
  std::memcpy(&x, p, sizeof x);
  p += sizeof x;
  return x;
}
template <class T>
void store(std::vector<uint8_t>& out, const T& x) {
  const auto* b = reinterpret_cast<const uint8_t*>(&x);
  out.insert(out.end(), b, b + sizeof x);
}

// Reads and checks the header of an open file of `file_size` bytes (aligned reads,
// so it works on O_DIRECT descriptors). nullopt if anything is off; errno is EINVAL
// after a read the filesystem refused. Adds the bytes it read to *got.
std::optional<Header> read_header(FileIo& io, int fd, int64_t file_size, int64_t* got = nullptr) {
  if (file_size < DiskKvStore::kAlign) return std::nullopt;
  AlignedBuf first(DiskKvStore::kAlign);
  errno = 0;
  if (read_exact(io, fd, first.p, DiskKvStore::kAlign, 0, got) != 0) return std::nullopt;
  const uint8_t* p = first.p;
  if (std::memcmp(p, kMagic, 4) != 0) return std::nullopt;
  p += 4;
  if (load<uint32_t>(p) != DiskKvStore::kVersion) return std::nullopt;
  Header h;
  h.key.hi = load<uint64_t>(p);
  h.key.lo = load<uint64_t>(p);
  const auto dtype = kv_dtype_of(load<uint32_t>(p));
  if (!dtype) return std::nullopt;
  h.dtype = *dtype;
  const uint32_t n_layers = load<uint32_t>(p), kv_heads = load<uint32_t>(p), head_dim = load<uint32_t>(p);
  const uint64_t m = load<uint64_t>(p);
  if (n_layers < 1 || n_layers > kMaxDim || kv_heads < 1 || kv_heads > kMaxDim || head_dim < 1 ||
      head_dim > kMaxDim || m > kMaxTokens)
    return std::nullopt;
  if (!layout(n_layers, kv_heads, head_dim, m, static_cast<uint64_t>(kernels::kv_dtype_bytes(h.dtype)), h.header_bytes,
              h.layer_span, h.file_bytes))
    return std::nullopt;
  if (h.file_bytes != file_size) return std::nullopt;

  // A long token list makes the header span several blocks: read it whole.
  std::optional<AlignedBuf> whole;
  const uint8_t* base = first.p;
  if (h.header_bytes > DiskKvStore::kAlign) {
    whole.emplace(h.header_bytes);
    if (read_exact(io, fd, whole->p, h.header_bytes, 0, got) != 0) return std::nullopt;
    base = whole->p;
  }
  const size_t raw = kFixedBytes + 4 * m + 8 * n_layers;  // without the header sum
  uint64_t stored_sum;
  std::memcpy(&stored_sum, base + raw, sizeof stored_sum);
  if (XXH3_64bits(base, raw) != stored_sum) return std::nullopt;

  h.n_layers = static_cast<int>(n_layers);
  h.kv_heads = static_cast<int>(kv_heads);
  h.head_dim = static_cast<int>(head_dim);
  h.tokens.resize(m);
  std::memcpy(h.tokens.data(), base + kFixedBytes, 4 * m);
  h.layer_sums.resize(n_layers);
  std::memcpy(h.layer_sums.data(), base + kFixedBytes + 4 * m, 8 * n_layers);
  return h;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void fsync_dir(FileIo& io, const std::string& dir) {
  const int fd = io.open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  io.fsync(fd);
  io.close(fd);
}

}  // namespace

// ---- Entry ----

DiskKvStore::Entry::Entry(Entry&& o) noexcept
    : key(o.key),
      tokens(std::move(o.tokens)),
      n_layers(o.n_layers),
      kv_heads(o.kv_heads),
      head_dim(o.head_dim),
      dtype(o.dtype),
      fd_(std::exchange(o.fd_, -1)),
      direct_(o.direct_),
      dev_(o.dev_),
      ino_(o.ino_),
      header_bytes_(o.header_bytes_),
      layer_span_(o.layer_span_),
      layer_sums_(std::move(o.layer_sums_)) {}

DiskKvStore::Entry& DiskKvStore::Entry::operator=(Entry&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    key = o.key;
    tokens = std::move(o.tokens);
    n_layers = o.n_layers, kv_heads = o.kv_heads, head_dim = o.head_dim;
    dtype = o.dtype;
    fd_ = std::exchange(o.fd_, -1);
    direct_ = o.direct_;
    dev_ = o.dev_, ino_ = o.ino_;
    header_bytes_ = o.header_bytes_, layer_span_ = o.layer_span_;
    layer_sums_ = std::move(o.layer_sums_);
  }
  return *this;
}

DiskKvStore::Entry::~Entry() {
  if (fd_ >= 0) ::close(fd_);
}

// ---- start-up ----

DiskKvStore::DiskKvStore(std::string dir, int64_t byte_budget, bool direct_io, const EntryVisitor& on_entry,
                         std::shared_ptr<FileIo> io)
    : dir_(std::move(dir)), budget_(byte_budget), direct_(direct_io), io_(io ? std::move(io) : FileIo::system()) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw std::system_error(ec, "DiskKvStore: cannot create " + dir_);
  scan(on_entry);
}

std::string DiskKvStore::path_of(const ChunkKey& key) const { return dir_ + "/" + key.hex() + kSuffix; }

void DiskKvStore::scan(const EntryVisitor& on_entry) {
  struct Found {
    ChunkKey key;
    int64_t bytes;
    struct timespec mtime;
    std::vector<int32_t> tokens;  // kept only for on_entry
  };
  std::vector<Found> found;
  int64_t dropped = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code tec;
    if (!it->is_regular_file(tec)) continue;
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    if (name.find(kTmpMarker) != std::string::npos) {  // a write that never finished
      io_->unlink(path.c_str());
      continue;
    }
    if (!ends_with(name, kSuffix)) continue;  // not ours
    bool ok = false;
    struct stat st{};
    const int fd = io_->open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      if (io_->fstat(fd, &st) == 0) {
        auto h = read_header(*io_, fd, st.st_size);
        if (h && name == h->key.hex() + kSuffix) {
          found.push_back({h->key, st.st_size, st.st_mtim, on_entry ? std::move(h->tokens) : std::vector<int32_t>{}});
          ok = true;
        }
      }
      io_->close(fd);
    }
    if (!ok) {
      // Torn, damaged, renamed or unreadable: a miss from now on, and counted.
      io_->unlink(path.c_str());
      ++dropped;
    }
  }
  // Oldest first, so pushing each to the front leaves the newest most recent.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec : a.mtime.tv_nsec < b.mtime.tv_nsec;
  });
  if (on_entry)
    for (const Found& f : found) on_entry(f.key, f.tokens);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.corrupt += dropped;
  for (const Found& f : found) {
    lru_.push_front(f.key);
    map_[f.key] = Slot{f.bytes, lru_.begin()};
    stats_.bytes += f.bytes;
  }
  evict_to_fit_locked(0);  // the budget may have shrunk since the last run
}

// ---- index helpers (mu_ held) ----

void DiskKvStore::unindex_locked(std::unordered_map<ChunkKey, Slot, ChunkKeyHash>::iterator it) {
  stats_.bytes -= it->second.bytes;
  lru_.erase(it->second.lru_pos);
  map_.erase(it);
}

void DiskKvStore::evict_to_fit_locked(int64_t incoming) {
  while (stats_.bytes + incoming > budget_ && !lru_.empty()) {
    const ChunkKey victim = lru_.back();
    io_->unlink(path_of(victim).c_str());
    unindex_locked(map_.find(victim));
    ++stats_.evictions;
  }
}

void DiskKvStore::touch_locked(const ChunkKey& key) {
  if (auto it = map_.find(key); it != map_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
}

// ---- writes ----

bool DiskKvStore::put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
  if (!kv || kv->n_layers < 1 || kv->kv_heads < 1 || kv->head_dim < 1 || kv->n_layers > int64_t{kMaxDim} ||
      kv->kv_heads > int64_t{kMaxDim} || kv->head_dim > int64_t{kMaxDim} || kv->tokens.size() > kMaxTokens)
    return false;
  if (!kv->consistent()) return false;
  int64_t header_bytes, layer_span, file_bytes;
  if (!layout(kv->n_layers, kv->kv_heads, kv->head_dim, kv->tokens.size(), static_cast<uint64_t>(kv->elem_bytes()),
              header_bytes, layer_span, file_bytes))
    return false;
  if (file_bytes > budget_) return false;

  // Header, padded.
  std::vector<uint8_t> hdr;
  hdr.reserve(static_cast<size_t>(header_bytes));
  hdr.insert(hdr.end(), kMagic, kMagic + 4);
  store(hdr, kVersion);
  store(hdr, key.hi);
  store(hdr, key.lo);
  store(hdr, static_cast<uint32_t>(kv->dtype));
  store(hdr, static_cast<uint32_t>(kv->n_layers));
  store(hdr, static_cast<uint32_t>(kv->kv_heads));
  store(hdr, static_cast<uint32_t>(kv->head_dim));
  store(hdr, static_cast<uint64_t>(kv->tokens.size()));
  for (int32_t t : kv->tokens) store(hdr, t);
  const size_t layer_bytes = static_cast<size_t>(kv->layer_bytes());
  for (int l = 0; l < kv->n_layers; ++l) store(hdr, layer_checksum(kv->k_layer(l), kv->v_layer(l), layer_bytes));
  store(hdr, XXH3_64bits(hdr.data(), hdr.size()));
  hdr.resize(static_cast<size_t>(header_bytes), 0);

  // A full device (ENOSPC) was seen and nothing of ours could be evicted to make room:
  // writes wait out a cool-down instead of each writing a whole file to fail again.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::chrono::steady_clock::now() < full_until_) {
      ++stats_.write_errors;
      return false;
    }
  }
  const std::string final_path = path_of(key);
  std::string tmp;
  for (int attempt = 0;; ++attempt) {
    const int err = write_temp(*kv, hdr, layer_span, final_path, tmp);
    if (err == 0) break;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.write_errors;
    if ((err != ENOSPC && err != EDQUOT) || attempt > 0) return false;
    // The device holds less than the budget says. Make room among our own entries (the
    // least recently used, at least this file's size), then try once more; when all we
    // hold is less than this file (evicting it could not make room), stop writing for a
    // while instead (a cache: a miss recomputes).
    int64_t freed = 0;
    while (stats_.bytes >= file_bytes && freed < file_bytes && !lru_.empty()) {
      const ChunkKey victim = lru_.back();
      io_->unlink(path_of(victim).c_str());
      auto it = map_.find(victim);
      freed += it->second.bytes;
      unindex_locked(it);
      ++stats_.evictions;
    }
    if (freed == 0) {
      full_until_ = std::chrono::steady_clock::now() + kFullCooldown;
      if (!full_logged_.exchange(true))
        std::fprintf(stderr, "blendserve: %s: the disk is full (%s) and evicting our entries could not make room; "
                     "writes to this tier pause for %lld s at a time until it has room\n",
                     dir_.c_str(), std::strerror(err), static_cast<long long>(kFullCooldown.count()));
      return false;
    }
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) unindex_locked(it);  // replaced by the rename
    evict_to_fit_locked(file_bytes);
    if (io_->rename(tmp.c_str(), final_path.c_str()) != 0) {
      io_->unlink(tmp.c_str());
      // The old file (if any) is still in place but no longer indexed: drop it so
      // the index and the directory agree.
      io_->unlink(final_path.c_str());
      ++stats_.write_errors;
      return false;
    }
    lru_.push_front(key);
    map_[key] = Slot{file_bytes, lru_.begin()};
    stats_.bytes += file_bytes;
    ++stats_.puts;
  }
  fsync_dir(*io_, dir_);  // makes the rename itself durable
  return true;
}

int DiskKvStore::write_temp(const ChunkKv& kv, const std::vector<uint8_t>& hdr, int64_t layer_span,
                            const std::string& final_path, std::string& tmp) {
  tmp = final_path + ".tmp." + std::to_string(::getpid()) + "." +
        std::to_string(tmp_counter_.fetch_add(1, std::memory_order_relaxed));
  errno = 0;
  const int fd = io_->open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno ? errno : EIO;
  int err = 0;
  auto check = [&err](bool ok) {
    if (!ok && err == 0) err = errno ? errno : EIO;
    return ok;
  };
  const size_t layer_bytes = static_cast<size_t>(kv.layer_bytes());
  const std::vector<uint8_t> pad(static_cast<size_t>(layer_span) - 2 * layer_bytes, 0);
  bool ok = check(write_all(*io_, fd, hdr.data(), hdr.size()));
  for (int l = 0; ok && l < kv.n_layers; ++l)
    ok = check(write_all(*io_, fd, kv.k_layer(l), layer_bytes)) && check(write_all(*io_, fd, kv.v_layer(l), layer_bytes)) &&
         check(write_all(*io_, fd, pad.data(), pad.size()));
  ok = ok && check(io_->fsync(fd) == 0);
  const bool closed = io_->close(fd) == 0;
  ok = check(closed) && ok;
  if (!ok) {
    io_->unlink(tmp.c_str());
    return err ? err : EIO;
  }
  return 0;
}

bool DiskKvStore::erase(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  io_->unlink(path_of(key).c_str());
  unindex_locked(it);
  return true;
}

// ---- reads ----

bool DiskKvStore::contains(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.count(key) != 0;
}

std::vector<ChunkKey> DiskKvStore::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ChunkKey> out;
  out.reserve(map_.size());
  for (const auto& [key, slot] : map_) out.push_back(key);
  return out;
}

StoreStats DiskKvStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StoreStats s = stats_;
  s.entries = static_cast<int64_t>(map_.size());
  return s;
}

int DiskKvStore::open_read(const std::string& path, bool& direct) {
  direct = direct_.load(std::memory_order_relaxed);
  if (direct) {
    const int fd = io_->open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd >= 0 || errno != EINVAL) return fd;
    if (direct_.exchange(false))
      std::fprintf(stderr, "blendserve: %s refuses O_DIRECT, using buffered reads\n", dir_.c_str());
    direct = false;
  }
  return io_->open(path.c_str(), O_RDONLY | O_CLOEXEC);
}

std::optional<DiskKvStore::Entry> DiskKvStore::open_entry(const ChunkKey& key) {
  if (!contains(key)) return std::nullopt;
  const std::string path = path_of(key);
  Entry e;
  e.fd_ = open_read(path, e.direct_);
  if (e.fd_ < 0) {  // gone from under us (evicted meanwhile, or removed by hand)
    const int err = errno;
    std::lock_guard<std::mutex> lock(mu_);
    if (err == ENOENT)
      if (auto it = map_.find(key); it != map_.end() && ::access(path.c_str(), F_OK) != 0) unindex_locked(it);
    return std::nullopt;
  }
  struct stat st{};
  if (io_->fstat(e.fd_, &st) != 0) return std::nullopt;
  e.dev_ = st.st_dev, e.ino_ = st.st_ino;
  const auto started = std::chrono::steady_clock::now();
  int64_t got = 0;
  auto h = read_header(*io_, e.fd_, st.st_size, &got);
  if (!h && e.direct_ && errno == EINVAL) {  // opened with O_DIRECT, but reads refused
    if (direct_.exchange(false))
      std::fprintf(stderr, "blendserve: %s refuses O_DIRECT reads, using buffered reads\n", dir_.c_str());
    ::close(e.fd_);
    e.fd_ = io_->open(path.c_str(), O_RDONLY | O_CLOEXEC);
    e.direct_ = false;
    if (e.fd_ < 0 || io_->fstat(e.fd_, &st) != 0) return std::nullopt;
    e.dev_ = st.st_dev, e.ino_ = st.st_ino;
    h = read_header(*io_, e.fd_, st.st_size, &got);
  }
  throttle(got, started);
  e.key = key;
  if (!h || !(h->key == key)) {
    drop_corrupt(e);
    return std::nullopt;
  }
  e.tokens = std::move(h->tokens);
  e.n_layers = h->n_layers, e.kv_heads = h->kv_heads, e.head_dim = h->head_dim;
  e.dtype = h->dtype;
  e.header_bytes_ = h->header_bytes, e.layer_span_ = h->layer_span;
  e.layer_sums_ = std::move(h->layer_sums);
  return e;
}

bool DiskKvStore::read_layer_raw(const Entry& e, int layer, std::byte* k, std::byte* v) {
  if (e.fd_ < 0 || layer < 0 || layer >= e.n_layers) return false;
  const int64_t bytes_each = e.layer_bytes();
  const int64_t off = e.layer_offset(layer);
  const auto started = std::chrono::steady_clock::now();
  int64_t got = 0;
  if (e.direct_) {  // aligned offset, length and buffer, then copy out
    uint8_t* buf = direct_read_scratch(e.layer_span_);
    const bool read_ok = e.layer_span_ <= 0 || read_exact(*io_, e.fd_, buf, e.layer_span_, off, &got) == 0;
    throttle(got, started);
    if (!read_ok) return false;
    if (layer_checksum(buf, buf + bytes_each, static_cast<size_t>(bytes_each)) != e.layer_sums_[layer]) return false;
    std::memcpy(k, buf, static_cast<size_t>(bytes_each));
    std::memcpy(v, buf + bytes_each, static_cast<size_t>(bytes_each));
    return true;
  }
  const bool read_ok =
      read_exact(*io_, e.fd_, k, bytes_each, off, &got) == 0 &&
      read_exact(*io_, e.fd_, v, bytes_each, off + bytes_each, &got) == 0;
  throttle(got, started);
  if (!read_ok) return false;
  return layer_checksum(k, v, static_cast<size_t>(bytes_each)) == e.layer_sums_[layer];
}

void DiskKvStore::set_read_throttle(double bytes_per_s) {
  read_bps_.store(std::isfinite(bytes_per_s) && bytes_per_s > 0 ? bytes_per_s : 0.0, std::memory_order_relaxed);
}

void DiskKvStore::throttle(int64_t bytes, std::chrono::steady_clock::time_point started) {
  const double bps = read_bps_.load(std::memory_order_relaxed);
  if (bps <= 0 || bytes <= 0) return;
  using clock = std::chrono::steady_clock;
  const auto cost = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(bytes / bps));
  clock::time_point until;
  {
    // Idle time before this read started is not credit: no bursts above the rate.
    std::lock_guard<std::mutex> lock(throttle_mu_);
    throttle_free_ = std::max(throttle_free_, started) + cost;
    until = throttle_free_;
  }
  std::this_thread::sleep_until(until);
}

// Removes the file `e` was read from, unless a newer put has replaced it already.
void DiskKvStore::drop_corrupt(const Entry& e) {
  const std::string path = path_of(e.key);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.corrupt;
  struct stat st{};
  if (io_->stat(path.c_str(), &st) == 0 && st.st_dev == e.dev_ && st.st_ino == e.ino_) {
    io_->unlink(path.c_str());
    if (auto it = map_.find(e.key); it != map_.end()) unindex_locked(it);
  }
}

namespace {

class DiskLayerReader final : public LayerReader {
 public:
  DiskLayerReader(DiskKvStore& store, DiskKvStore::Entry e) : store_(store), e_(std::move(e)) {}
  const std::vector<int32_t>& tokens() const override { return e_.tokens; }
  int n_layers() const override { return e_.n_layers; }
  int kv_heads() const override { return e_.kv_heads; }
  int head_dim() const override { return e_.head_dim; }
  kernels::TensorType dtype() const override { return e_.dtype; }
  bool read_layer(int layer, std::byte* k, std::byte* v) override { return store_.read_layer(e_, layer, k, v); }

 private:
  DiskKvStore& store_;
  DiskKvStore::Entry e_;
};

}  // namespace

std::unique_ptr<LayerReader> DiskKvStore::open_layers(const ChunkKey& key) {
  auto e = open(key);
  if (!e) return nullptr;
  return std::make_unique<DiskLayerReader>(*this, std::move(*e));
}

std::optional<DiskKvStore::Entry> DiskKvStore::open(const ChunkKey& key) {
  auto e = open_entry(key);
  if (e) ::futimens(e->fd_, nullptr);  // mtime = last use: the LRU order a restart rebuilds
  std::lock_guard<std::mutex> lock(mu_);
  if (!e) {
    ++stats_.misses;
    return std::nullopt;
  }
  ++stats_.hits;
  touch_locked(key);
  return e;
}

bool DiskKvStore::read_layer(const Entry& e, int layer, std::byte* k, std::byte* v) {
  if (read_layer_raw(e, layer, k, v)) return true;
  if (e.fd_ >= 0 && layer >= 0 && layer < e.n_layers) drop_corrupt(e);
  return false;
}

std::shared_ptr<const ChunkKv> DiskKvStore::get(const ChunkKey& key) {
  auto e = open_entry(key);
  std::shared_ptr<ChunkKv> kv;
  if (e) {
    kv = std::make_shared<ChunkKv>();
    kv->tokens = e->tokens;
    kv->n_layers = e->n_layers, kv->kv_heads = e->kv_heads, kv->head_dim = e->head_dim;
    kv->dtype = e->dtype;
    kv->allocate();
    for (int l = 0; l < e->n_layers && kv; ++l)
      if (!read_layer_raw(*e, l, kv->k_layer(l), kv->v_layer(l))) {
        drop_corrupt(*e);
        kv.reset();
      }
  }
  if (kv) ::futimens(e->fd_, nullptr);  // mtime = last use: the LRU order a restart rebuilds
  std::lock_guard<std::mutex> lock(mu_);
  if (!kv) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  touch_locked(key);
  return kv;
}

}  // namespace bs
