#include "model/kv_cache.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/dequant.h"

namespace bs {

KvPagePool::KvPagePool(kernels::Backend& backend, int n_layers, int kv_heads, int head_dim, int64_t pages,
                       int page_shift, kernels::TensorType dtype)
    : backend_(backend),
      n_layers_(n_layers),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      total_pages_(pages),
      page_shift_(page_shift),
      dtype_(dtype),
      elem_bytes_(kernels::kv_dtype_bytes(dtype)) {
  if (n_layers <= 0 || kv_heads <= 0 || head_dim <= 0)
    throw std::invalid_argument("KV page pool: layers, heads and head_dim must be positive");
  if (pages <= 0 || pages > INT32_MAX) throw std::invalid_argument("KV page pool: needs 1 to 2^31-1 pages");
  if (page_shift < 0 || page_shift > 20) throw std::invalid_argument("KV page pool: page_shift must be 0..20");
  if (!kernels::is_kv_dtype(dtype)) throw std::invalid_argument("KV page pool: dtype must be F32, F16 or BF16");
  k_ = backend_.alloc(n_layers_ * layer_elements() * elem_bytes_);
  v_ = backend_.alloc(n_layers_ * layer_elements() * elem_bytes_);
  free_.resize(static_cast<size_t>(pages));
  // Low pages on top: a fresh pool hands out pages in order.
  for (int64_t i = 0; i < pages; ++i) free_[static_cast<size_t>(i)] = static_cast<int32_t>(pages - 1 - i);
}

int64_t KvPagePool::pages_in(int64_t bytes, int n_layers, int kv_heads, int head_dim, int page_shift,
                             kernels::TensorType dtype) {
  const int64_t page = 2 * static_cast<int64_t>(n_layers) * kv_heads * head_dim * (int64_t{1} << page_shift) *
                       kernels::kv_dtype_bytes(dtype);
  return std::max<int64_t>(1, bytes / page);
}

int64_t KvPagePool::free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

void KvPagePool::check_ledger_writer_locked(const char* what) {
  if (ledger_owner_ == std::thread::id() || ledger_owner_ == std::this_thread::get_id()) return;
  ++foreign_ledger_writes_;
  std::fprintf(stderr, "blendserve: KV page pool: %s from a thread that does not own the reservations\n", what);
}

void KvPagePool::claim_reservations() {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_owner_ = std::this_thread::get_id();
}

int64_t KvPagePool::foreign_reservation_writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return foreign_ledger_writes_;
}

void KvPagePool::set_reserved(int64_t pages) {
  std::lock_guard<std::mutex> lock(mu_);
  check_ledger_writer_locked("set_reserved");
  reserved_ = std::clamp<int64_t>(pages, 0, total_pages_);
}

bool KvPagePool::try_reserve(int64_t pages) {
  if (pages < 0) throw std::invalid_argument("KV page pool: negative reservation");
  std::lock_guard<std::mutex> lock(mu_);
  check_ledger_writer_locked("try_reserve");
  if (reserved_ + pages > total_pages_) return false;
  reserved_ += pages;
  return true;
}

void KvPagePool::unreserve(int64_t pages) {
  std::lock_guard<std::mutex> lock(mu_);
  check_ledger_writer_locked("unreserve");
  // A caller's bug, reported, not thrown: this runs where a request ends, which must
  // not fail; the tests check the accounting ends at zero.
  if (pages < 0 || pages > reserved_)
    std::fprintf(stderr, "blendserve: KV page pool: %lld pages unreserved, %lld were reserved\n",
                 static_cast<long long>(pages), static_cast<long long>(reserved_));
  reserved_ = std::max<int64_t>(0, reserved_ - std::max<int64_t>(0, pages));
}

int64_t KvPagePool::reserved_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

std::optional<KvCache> KvPagePool::try_make_cache(int64_t capacity) {
  if (capacity <= 0) throw std::invalid_argument("KV cache: capacity must be positive");
  const int64_t need = pages_for(capacity);
  std::vector<int32_t> pages;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (need > static_cast<int64_t>(free_.size())) return std::nullopt;
    pages.assign(free_.end() - need, free_.end());
    free_.resize(free_.size() - static_cast<size_t>(need));
  }
  std::reverse(pages.begin(), pages.end());  // popped in stack order
  return KvCache(shared_from_this(), std::move(pages), capacity);
}

KvCache KvPagePool::make_cache(int64_t capacity) {
  auto cache = try_make_cache(capacity);
  if (!cache)
    throw std::length_error("KV page pool: " + std::to_string(pages_for(capacity)) + " pages needed for " +
                            std::to_string(capacity) + " positions, " + std::to_string(free_pages()) + " of " +
                            std::to_string(total_pages_) + " free");
  return std::move(*cache);
}

void KvPagePool::release(std::vector<int32_t>& pages) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.insert(free_.end(), pages.rbegin(), pages.rend());
  pages.clear();
}

kernels::KvView KvPagePool::view(int layer, const std::vector<int32_t>& pages, int64_t capacity) const {
  kernels::KvView v;
  v.k = k_.as<std::byte>() + layer * layer_elements() * elem_bytes_;
  v.v = v_.as<std::byte>() + layer * layer_elements() * elem_bytes_;
  v.dtype = dtype_;
  v.pages = pages.data();
  v.page_count = static_cast<int64_t>(pages.size());
  v.capacity = capacity;
  v.page_shift = page_shift_;
  v.page_stride = page_elements();
  v.head_stride = page_positions() * head_dim_;
  v.kv_heads = kv_heads_;
  v.head_dim = head_dim_;
  return v;
}

int64_t KvPagePool::row_offset(int layer, const std::vector<int32_t>& pages, int h, int64_t pos) const {
  return layer * layer_elements() + pages[static_cast<size_t>(pos >> page_shift_)] * page_elements() +
         (static_cast<int64_t>(h) * page_positions() + (pos & (page_positions() - 1))) * head_dim_;
}
std::byte* KvPagePool::k_row(int layer, const std::vector<int32_t>& pages, int h, int64_t pos) const {
  return k_.as<std::byte>() + row_offset(layer, pages, h, pos) * elem_bytes_;
}
std::byte* KvPagePool::v_row(int layer, const std::vector<int32_t>& pages, int h, int64_t pos) const {
  return v_.as<std::byte>() + row_offset(layer, pages, h, pos) * elem_bytes_;
}

KvCache::KvCache(kernels::Backend& backend, int layers, int kv_heads_, int head_dim_, int64_t capacity_,
                 kernels::TensorType dtype) {
  auto pool = KvPagePool::make(backend, layers, kv_heads_, head_dim_,
                               (capacity_ + (int64_t{1} << KvPagePool::kDefaultPageShift) - 1) >>
                                   KvPagePool::kDefaultPageShift,
                               KvPagePool::kDefaultPageShift, dtype);
  *this = pool->make_cache(capacity_);
}

KvCache::KvCache(std::shared_ptr<KvPagePool> pool, std::vector<int32_t> pages, int64_t capacity_)
    : n_layers(pool->n_layers()),
      kv_heads(pool->kv_heads()),
      head_dim(pool->head_dim()),
      capacity(capacity_),
      pool_(std::move(pool)),
      pages_(std::move(pages)) {}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this == &other) return *this;
  reset();
  n_layers = other.n_layers;
  kv_heads = other.kv_heads;
  head_dim = other.head_dim;
  capacity = other.capacity;
  length = other.length;
  pool_ = std::move(other.pool_);
  pages_ = std::move(other.pages_);
  other.capacity = other.length = 0;
  other.pages_.clear();
  return *this;
}

void KvCache::reset() {
  if (pool_) pool_->release(pages_);
  pool_.reset();
  pages_.clear();
  capacity = length = 0;
}

template <class Move>
void KvCache::each_head_run(int l, int h, int64_t pos, int64_t m, const Move& move) const {
  if (pos < 0 || m < 0 || pos + m > capacity) throw std::out_of_range("KV cache: rows outside the cache");
  if (h < 0 || h >= kv_heads || l < 0 || l >= n_layers) throw std::out_of_range("KV cache: no such layer or head");
  for_each_run(pos, m, [&](int64_t at, int64_t count) {
    move(pool_->k_row(l, pages_, h, at), pool_->v_row(l, pages_, h, at), at - pos, count);
  });
}

// fp32 rows go through a host staging array of the stored dtype: the rounding is the
// host's (kernels::kv_from_fp32), the bytes move by the backend's copies.
void KvCache::write_rows(int l, int h, int64_t pos, int64_t m, const float* k, const float* v) {
  auto& be = pool_->backend();
  thread_local std::vector<std::byte> staged;
  each_head_run(l, h, pos, m, [&](std::byte* kd, std::byte* vd, int64_t row, int64_t count) {
    const int64_t elems = count * head_dim, bytes = elems * elem_bytes();
    staged.resize(static_cast<size_t>(bytes));
    kernels::kv_from_fp32(dtype(), k + row * head_dim, staged.data(), elems);
    be.copy_to_backend(kd, staged.data(), bytes);
    if (!v) return;
    kernels::kv_from_fp32(dtype(), v + row * head_dim, staged.data(), elems);
    be.copy_to_backend(vd, staged.data(), bytes);
  });
}

void KvCache::read_rows(int l, int h, int64_t pos, int64_t m, float* k, float* v) const {
  auto& be = pool_->backend();
  thread_local std::vector<std::byte> staged;
  each_head_run(l, h, pos, m, [&](std::byte* ks, std::byte* vs, int64_t row, int64_t count) {
    const int64_t elems = count * head_dim, bytes = elems * elem_bytes();
    staged.resize(static_cast<size_t>(bytes));
    be.copy_to_host(staged.data(), ks, bytes);
    kernels::kv_to_fp32(dtype(), staged.data(), k + row * head_dim, elems);
    if (!v) return;
    be.copy_to_host(staged.data(), vs, bytes);
    kernels::kv_to_fp32(dtype(), staged.data(), v + row * head_dim, elems);
  });
}

void KvCache::write_rows_raw(int l, int h, int64_t pos, int64_t m, const void* k, const void* v,
                             kernels::Stream* stream) {
  auto& be = pool_->backend();
  const int64_t row_bytes = head_dim * elem_bytes();
  each_head_run(l, h, pos, m, [&](std::byte* kd, std::byte* vd, int64_t row, int64_t count) {
    be.copy_to_backend(kd, static_cast<const std::byte*>(k) + row * row_bytes, count * row_bytes, stream);
    be.copy_to_backend(vd, static_cast<const std::byte*>(v) + row * row_bytes, count * row_bytes, stream);
  });
}

void KvCache::read_rows_raw(int l, int h, int64_t pos, int64_t m, void* k, void* v) const {
  auto& be = pool_->backend();
  const int64_t row_bytes = head_dim * elem_bytes();
  each_head_run(l, h, pos, m, [&](std::byte* ks, std::byte* vs, int64_t row, int64_t count) {
    be.copy_to_host(static_cast<std::byte*>(k) + row * row_bytes, ks, count * row_bytes);
    be.copy_to_host(static_cast<std::byte*>(v) + row * row_bytes, vs, count * row_bytes);
  });
}

void KvCache::save_layer(int l, int64_t rows, void* k, void* v) const {
  auto& be = pool_->backend();
  const int64_t row_bytes = head_dim * elem_bytes();
  for (int h = 0; h < kv_heads; ++h)
    each_head_run(l, h, 0, rows, [&](std::byte* ks, std::byte* vs, int64_t row, int64_t count) {
      const int64_t at = (h * rows + row) * row_bytes;
      be.copy_within(static_cast<std::byte*>(k) + at, ks, count * row_bytes);
      be.copy_within(static_cast<std::byte*>(v) + at, vs, count * row_bytes);
    });
}

void KvCache::restore_layer(int l, int64_t rows, const void* k, const void* v) {
  auto& be = pool_->backend();
  const int64_t row_bytes = head_dim * elem_bytes();
  for (int h = 0; h < kv_heads; ++h)
    each_head_run(l, h, 0, rows, [&](std::byte* kd, std::byte* vd, int64_t row, int64_t count) {
      const int64_t at = (h * rows + row) * row_bytes;
      be.copy_within(kd, static_cast<const std::byte*>(k) + at, count * row_bytes);
      be.copy_within(vd, static_cast<const std::byte*>(v) + at, count * row_bytes);
    });
}

void KvCache::write_layer(int l, int64_t rows, const float* k, const float* v) {
  for (int h = 0; h < kv_heads; ++h) write_rows(l, h, 0, rows, k + h * rows * head_dim, v + h * rows * head_dim);
}

void KvCache::read_layer(int l, int64_t rows, float* k, float* v) const {
  for (int h = 0; h < kv_heads; ++h) read_rows(l, h, 0, rows, k + h * rows * head_dim, v + h * rows * head_dim);
}

float* KvCache::f32_row(std::byte* row) const {
  if (!pool_->backend().host_accessible())
    throw std::logic_error("KV cache: rows in place need host-accessible memory; use read_rows / write_rows");
  if (dtype() != kernels::TensorType::F32)
    throw std::logic_error("KV cache: rows in place are fp32 only (this cache is " +
                           std::string(kernels::kv_dtype_name(dtype())) + "); use read_rows / write_rows");
  return reinterpret_cast<float*>(row);
}

void KvCache::write_block_raw(int l, int64_t pos, int64_t m, const void* k, const void* v, kernels::Stream* stream) {
  if (pos < 0 || m < 0 || pos + m > capacity) throw std::out_of_range("KV cache: rows outside the cache");
  if (l < 0 || l >= n_layers) throw std::out_of_range("KV cache: no such layer or head");
  if (m == 0) return;
  pool_->backend().write_kv_block(view(l), pos, m, k, v, stream);
}

void KvCache::write_layer_raw(int l, int64_t rows, const void* k, const void* v) {
  write_block_raw(l, 0, rows, k, v);
}

void KvCache::read_layer_raw(int l, int64_t rows, void* k, void* v) const {
  const int64_t head_bytes = rows * head_dim * elem_bytes();
  for (int h = 0; h < kv_heads; ++h)
    read_rows_raw(l, h, 0, rows, static_cast<std::byte*>(k) + h * head_bytes, static_cast<std::byte*>(v) + h * head_bytes);
}

}  // namespace bs
