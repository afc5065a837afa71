// The backend's memory and ordering defaults (host memory, work done when issued), the
// default block write into a paged cache, the host defaults of geglu and scale,
// DeviceBuffer and Workspace, and the release of a thread's scratch.
#include "kernels/backend.h"

#include <malloc.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/op_math.h"
#include "kernels/sampling.h"

namespace bs::kernels {
namespace {

// The default stream and event: the CPU backends run everything when it is issued.
struct HostStream final : Stream {};
struct HostEvent final : Event {};

constexpr std::align_val_t kAlignment{64};

// sample_rows' host copy of the logits ([n, vocab]), this thread's; freed by release_scratch.
thread_local std::vector<float> sampled_logits;

}  // namespace

void DeviceBuffer::reset() {
  if (data_ && owner_) owner_->free_bytes(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

void* Workspace::bytes(int slot, int64_t bytes) {
  if (slot < 0) throw std::invalid_argument("workspace: negative slot");
  if (static_cast<size_t>(slot) >= slots_.size()) slots_.resize(static_cast<size_t>(slot) + 1);
  DeviceBuffer& b = slots_[static_cast<size_t>(slot)];
  if (b.bytes() < bytes) {
    b.reset();  // the old memory goes first: the slots of a long prefill are large
    b = backend_.alloc(bytes);
  }
  return b.data();
}

DeviceBuffer Backend::alloc(int64_t bytes) {
  if (bytes < 0) throw std::invalid_argument("backend alloc: negative size");
  const int64_t n = bytes == 0 ? 1 : bytes;  // a valid, distinct pointer for empty buffers
  return DeviceBuffer(this, allocate_bytes(n), n);
}

DeviceBuffer Backend::upload(const void* host, int64_t bytes) {
  DeviceBuffer b = alloc(bytes);
  if (bytes > 0) copy_to_backend(b.data(), host, bytes);
  return b;
}

Workspace& Backend::workspace() {
  std::lock_guard<std::mutex> lock(workspaces_mu_);
  auto& ws = workspaces_[std::this_thread::get_id()];
  if (!ws) ws = std::make_unique<Workspace>(*this);
  return *ws;
}

void Backend::write_kv_block(const KvView& kv, int64_t first, int64_t m, const void* k, const void* v,
                             Stream* stream) {
  if (first < 0 || m < 0 || first + m > kv.capacity) throw std::out_of_range("write_kv_block: rows outside the cache");
  const int64_t eb = kv_dtype_bytes(kv.dtype), row_bytes = kv.head_dim * eb;
  const int64_t page = kv.page_positions();
  for (int64_t h = 0; h < kv.kv_heads; ++h)
    for (int64_t j = first; j < first + m;) {
      const int64_t run = std::min(first + m, (j / page + 1) * page) - j;  // to the page's end
      const int64_t src = ((h * m) + (j - first)) * row_bytes, dst = kv.row_offset(h, j) * eb;
      copy_to_backend(static_cast<std::byte*>(kv.k) + dst, static_cast<const std::byte*>(k) + src, run * row_bytes,
                      stream);
      copy_to_backend(static_cast<std::byte*>(kv.v) + dst, static_cast<const std::byte*>(v) + src, run * row_bytes,
                      stream);
      j += run;
    }
}

void Backend::geglu(const float* gate_up, float* out, int64_t n, int64_t ff) {
  if (!host_accessible()) throw std::logic_error(name() + ": geglu is not implemented on this backend");
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < ff; ++i)
      out[t * ff + i] = op_math::gelu_tanh_mul(gate_up[t * 2 * ff + i], gate_up[t * 2 * ff + ff + i]);
}

void Backend::scale(float* x, int64_t count, float s) {
  if (!host_accessible()) throw std::logic_error(name() + ": scale is not implemented on this backend");
  for (int64_t i = 0; i < count; ++i) x[i] *= s;
}

void Backend::release_scratch() {
  {
    std::lock_guard<std::mutex> lock(workspaces_mu_);
    workspaces_.erase(std::this_thread::get_id());
  }
  std::vector<float>().swap(sampled_logits);
  release_sampling_scratch();
  malloc_trim(0);
}

void Backend::release_workspaces() {
  std::lock_guard<std::mutex> lock(workspaces_mu_);
  workspaces_.clear();
}

void* Backend::allocate_bytes(int64_t bytes) { return ::operator new(static_cast<size_t>(bytes), kAlignment); }
void Backend::free_bytes(void* data, int64_t) { ::operator delete(data, kAlignment); }

std::unique_ptr<Stream> Backend::make_stream() { return std::make_unique<HostStream>(); }
std::unique_ptr<Event> Backend::make_event() { return std::make_unique<HostEvent>(); }
void Backend::copy_to_backend(void* dst, const void* host_src, int64_t bytes, Stream*) {
  if (bytes > 0) std::memcpy(dst, host_src, static_cast<size_t>(bytes));
}
void Backend::copy_to_host(void* host_dst, const void* src, int64_t bytes, Stream*) {
  if (bytes > 0) std::memcpy(host_dst, src, static_cast<size_t>(bytes));
}
void Backend::copy_within(void* dst, const void* src, int64_t bytes, Stream*) {
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
}
void Backend::record(Event&, Stream*) {}
void Backend::wait(const Event&, Stream*) {}
void Backend::synchronize(const Event&) {}
void Backend::synchronize() {}

void Backend::sample_rows(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens) {
  if (n <= 0) return;
  auto& host = sampled_logits;
  host.resize(static_cast<size_t>(n * vocab));
  copy_to_host(host.data(), logits, n * vocab * static_cast<int64_t>(sizeof(float)));
  for (int64_t r = 0; r < n; ++r) tokens[r] = pick_token(host.data() + r * vocab, vocab, rows[r]);
}

std::unique_ptr<PreparedWeights> Backend::prepare_fused(const std::vector<WeightView>& parts, Precision precision) {
  if (parts.empty()) throw std::invalid_argument("prepare_fused: no parts");
  if (parts.size() == 1) return prepare(parts[0], precision);
  const auto type = parts[0].type;
  const int64_t in = parts[0].in_features;
  bool same = true;
  int64_t rows = 0;
  for (const auto& p : parts) {
    if (p.in_features != in) throw std::invalid_argument("prepare_fused: parts of different in_features");
    same = same && p.type == type;
    rows += p.out_features;
  }
  const auto out_type = same ? type : TensorType::F32;
  const int64_t out_row_bytes = type_row_bytes(out_type, in);
  std::vector<uint8_t> buf(static_cast<size_t>(rows * out_row_bytes));
  uint8_t* dst = buf.data();
  for (const auto& p : parts) {
    const int64_t row_bytes = type_row_bytes(p.type, in);
    const auto* src = static_cast<const uint8_t*>(p.data);
    if (same) {
      std::memcpy(dst, src, static_cast<size_t>(p.out_features * row_bytes));
      dst += p.out_features * row_bytes;
    } else {
      for (int64_t r = 0; r < p.out_features; ++r, dst += out_row_bytes)
        dequantize_row(p.type, src + r * row_bytes, reinterpret_cast<float*>(dst), in);
    }
  }
  auto out = prepare(WeightView{out_type, buf.data(), rows, in}, precision);
  out->view.data = nullptr;  // the copy is gone: the backend kept what it needs
  return out;
}

std::unique_ptr<PreparedWeights> Backend::prepare_embedding(const WeightView& table) {
  auto out = std::make_unique<PreparedWeights>();
  out->view = table;
  return out;
}

std::unique_ptr<PreparedRope> Backend::prepare_rope(const RopeTable& table) {
  if (table.head_dim <= 0 || table.head_dim % 2 != 0 ||
      static_cast<int64_t>(table.inv_freq.size()) != table.head_dim / 2)
    throw std::invalid_argument("rope table: head_dim must be even and inv_freq hold head_dim / 2 values");
  auto out = std::make_unique<PreparedRope>();
  out->table = table;
  return out;
}

Backend& host_backend() {
  static Backend* const backend = make_reference_backend().release();  // never destroyed: pools may outlive main's locals
  return *backend;
}

}  // namespace bs::kernels
