#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_gemm.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/device_waits.h"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/gather_rows.cuh"
#include "kernels/cuda/gemv_bf16.cuh"
#include "kernels/cuda/index_check.cuh"
#include "kernels/cuda/kv_deviation.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/residual_add.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rope_kv_rows.cuh"
#include "kernels/cuda/sample.cuh"
#include "kernels/cuda/split_qkv.cuh"
#include "kernels/cuda/store_kv.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/top_k.cuh"
#include "kernels/tensor_types.h"

namespace bs::kernels {
namespace {

using cuda::CudaEvent;
using cuda::CudaStream;
using cuda::DeviceAllocation;

// Codes of the ops whose device-side index check can fail (the flag holds the first).
enum FlagCode : int32_t { kFlagClear = 0, kFlagEmbed = 1, kFlagStoreKv = 2, kFlagKvDeviation = 3 };

const char* flag_message(int32_t code) {
  switch (code) {
    case kFlagEmbed: return "embed: token id out of range";
    case kFlagStoreKv: return "store_kv: position outside the KV cache";
    case kFlagKvDeviation: return "kv_deviation: position outside the KV cache";
    default: return "cuda backend: index out of range";
  }
}

struct CudaWeights final : PreparedWeights {
  cuda::Bf16Weights w;
};

struct CudaEmbedding final : PreparedWeights {
  DeviceAllocation table;  // the stored rows, as in the file: [vocab] rows of view.type
};

struct CudaRope final : PreparedRope {
  DeviceAllocation inv_freq;  // [head_dim / 2] fp32
};

// Pinned host memory (cudaHostAlloc), freed in the destructor.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) { BS_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault)); }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// `buffer` holding at least `bytes` (made or grown: the old contents are dropped).
void* pinned_at_least(std::unique_ptr<PinnedBuffer>& buffer, size_t bytes) {
  if (!buffer || buffer->bytes() < bytes) {
    const size_t grown = std::max(bytes, buffer ? 2 * buffer->bytes() : size_t{4096});
    buffer.reset();  // freed before the larger one is pinned
    buffer = std::make_unique<PinnedBuffer>(grown);
  }
  return buffer->get();
}

// A stream of make_stream() with its staging ring: host bytes are appended to the
// current pinned buffer and sent from there by an asynchronous DMA, so the caller's
// memory is free on return and the DMA runs while the caller goes on. A full buffer is
// left with an event; it is written again only once that event completed (the ring
// bounds the bytes in flight at kStagingBuffers * kStagingBytes), a wait bounded by
// device.wait_timeout like every host wait of the backend.
struct CudaStreamHandle final : Stream {
  static constexpr size_t kStagingBytes = size_t{8} << 20;
  static constexpr int kStagingBuffers = 3;

  explicit CudaStreamHandle(std::shared_ptr<cuda::DeviceWaits> w) : waits(std::move(w)) {}

  std::shared_ptr<cuda::DeviceWaits> waits;
  CudaStream stream;
  std::vector<std::unique_ptr<PinnedBuffer>> staging;  // made on first use
  std::vector<std::unique_ptr<CudaEvent>> released;    // [i] completes when buffer i's DMAs have
  int current = 0;
  size_t used = 0;  // bytes of staging[current] written
  std::mutex mu;    // one copy at a time per stream (its ring)

  void copy_in(void* dst, const void* src, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (staging.empty())
      for (int i = 0; i < kStagingBuffers; ++i) {
        staging.push_back(std::make_unique<PinnedBuffer>(kStagingBytes));
        released.push_back(std::make_unique<CudaEvent>());
        released.back()->record(stream.get());  // nothing in flight yet
      }
    auto* d = static_cast<std::byte*>(dst);
    auto* s = static_cast<const std::byte*>(src);
    for (size_t done = 0; done < static_cast<size_t>(bytes);) {
      if (used == kStagingBytes) {  // next buffer, once its last DMAs are over
        released[current]->record(stream.get());
        current = (current + 1) % kStagingBuffers;
        waits->for_event(released[current]->get(), "a loader's staging buffer (its earlier copies to the device)");
        used = 0;
      }
      const size_t part = std::min(static_cast<size_t>(bytes) - done, kStagingBytes - used);
      std::byte* at = static_cast<std::byte*>(staging[current]->get()) + used;
      std::memcpy(at, s + done, part);
      BS_CUDA_CHECK(cudaMemcpyAsync(d + done, at, part, cudaMemcpyHostToDevice, stream.get()));
      used += part;
      done += part;
    }
  }
};

struct CudaEventHandle final : Event {
  CudaEvent event;
};

// Sets the backend's device as the calling thread's current one (loaders and compute
// threads call in; CUDA's current device is per thread).
class DeviceScope {
 public:
  explicit DeviceScope(int device) { BS_CUDA_CHECK(cudaSetDevice(device)); }
};

// From this many query rows on, attention goes through cuBLAS (attention_gemm.cuh):
// below it the warp kernel, whose fp32 dot products are the more precise and whose
// cost is small for a few rows (decode, a blend check layer's narrowed rows).
constexpr int64_t kGemmAttentionRows = 64;

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::chrono::nanoseconds wait_limit)
      : device_(device), scope_(device), cublas_(stream_.get()) {
    description_ = cuda::device_description(device);
    waits_ = std::make_shared<cuda::DeviceWaits>(device, description_, wait_limit);
    cudaDeviceProp p{};
    BS_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    kernel_id_ = std::string("cuda/sm_") + std::to_string(p.major) + std::to_string(p.minor) + "/" + p.name + "/bf16";
    // The index flag in device memory, read into pinned host memory with the copies that
    // end in a wait (one 4-byte copy more, no extra wait).
    BS_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flag_host_), sizeof(int32_t), cudaHostAllocDefault));
    *flag_host_ = kFlagClear;
    BS_CUDA_CHECK(cudaMemsetAsync(flag_.get(), 0, sizeof(int32_t), stream_.get()));
    flag_device_ = flag_.as<int32_t>();
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    // A lost device is not waited for (its work may never end); the driver reclaims it.
    if (!waits_->lost()) cudaStreamSynchronize(stream_.get());
    release_workspaces();  // before the members that free_bytes needs go
    if (flag_host_) cudaFreeHost(flag_host_);
  }

  std::string name() const override { return "cuda"; }
  std::string kernel_id() const override { return kernel_id_; }
  bool supports(Precision precision) const override { return precision == Precision::BF16; }
  int64_t linear_exact_rows() const override { return cuda::kGemvMaxRows; }
  bool host_accessible() const override { return false; }
  int64_t free_memory_bytes() const override {
    DeviceScope scope(device_);
    size_t free = 0, total = 0;
    BS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }
  std::string device_name() const override { return description_; }

  // ---- memory and ordering ----

  std::unique_ptr<Stream> make_stream() override {
    DeviceScope scope(device_);
    return std::make_unique<CudaStreamHandle>(waits_);
  }
  std::unique_ptr<Event> make_event() override {
    DeviceScope scope(device_);
    return std::make_unique<CudaEventHandle>();
  }

  void copy_to_backend(void* dst, const void* host_src, int64_t bytes, Stream* stream) override {
    if (bytes <= 0) return;
    DeviceScope scope(device_);
    if (stream) {
      static_cast<CudaStreamHandle*>(stream)->copy_in(dst, host_src, bytes);
      return;
    }
    // Pageable source: CUDA stages it before returning, so the caller's memory is free
    // on return (the DMA may still run, ordered before later ops on the stream).
    BS_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_.get()));
  }

  void copy_to_host(void* host_dst, const void* src, int64_t bytes, Stream* stream) override {
    if (bytes <= 0) return;
    DeviceScope scope(device_);
    if (stream) {
      BS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                    static_cast<CudaStreamHandle*>(stream)->stream.get()));
      return;
    }
    // Through pinned memory: a copy into pageable memory would block in the driver with
    // no limit; this one is a DMA the bounded wait covers, then a host memcpy.
    std::lock_guard<std::mutex> lock(readback_mu_);
    void* staged = pinned_at_least(readback_, static_cast<size_t>(bytes));
    BS_CUDA_CHECK(cudaMemcpyAsync(staged, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_.get()));
    fetch_flag();
    waits_->for_stream(stream_.get(), "a copy to the host");
    std::memcpy(host_dst, staged, static_cast<size_t>(bytes));
    throw_if_flagged();
  }

  void copy_within(void* dst, const void* src, int64_t bytes, Stream* stream) override {
    if (bytes <= 0) return;
    DeviceScope scope(device_);
    BS_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, on(stream)));
  }

  void record(Event& event, Stream* stream) override {
    DeviceScope scope(device_);
    static_cast<CudaEventHandle&>(event).event.record(on(stream));
  }
  void wait(const Event& event, Stream* stream) override {
    DeviceScope scope(device_);
    static_cast<const CudaEventHandle&>(event).event.wait_on(on(stream));
  }
  // Not a place that reports the index flag: loaders wait on their copy events, and the
  // flag belongs to the thread that issued the ops.
  void synchronize(const Event& event) override {
    DeviceScope scope(device_);
    waits_->for_event(static_cast<const CudaEventHandle&>(event).event.get(), "the work before an event");
  }
  // The compute stream under the bounded wait; the device-wide sync after it then waits
  // only for other streams' work (loaders' copies, each bounded by its own drain).
  void synchronize() override {
    DeviceScope scope(device_);
    fetch_flag();
    waits_->for_stream(stream_.get(), "the compute stream's work");
    BS_CUDA_CHECK(cudaDeviceSynchronize());
    throw_if_flagged();
  }

  // ---- prepared constants ----

  std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision precision) override {
    if (!supports(precision))
      throw std::invalid_argument(std::string("cuda backend: products run in bf16 only (asked: ") +
                                  precision_name(precision) + ")");
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    DeviceAllocation stored = upload_stored(w);
    auto out = std::make_unique<CudaWeights>();
    out->view = w;
    out->w = cuda::weights_to_bf16(w.type, stored.get(), w.out_features, w.in_features, stream_.get());
    waits_->for_stream(stream_.get(), "a weight upload");  // the stored copy is freed next
    return out;
  }

  std::unique_ptr<PreparedWeights> prepare_embedding(const WeightView& table) override {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    auto out = std::make_unique<CudaEmbedding>();
    out->view = table;
    out->table = upload_stored(table);
    waits_->for_stream(stream_.get(), "an embedding table upload");
    return out;
  }

  std::unique_ptr<PreparedRope> prepare_rope(const RopeTable& table) override {
    auto base = Backend::prepare_rope(table);  // validates the table
    DeviceScope scope(device_);
    auto out = std::make_unique<CudaRope>();
    out->table = base->table;
    out->inv_freq = DeviceAllocation(table.inv_freq.size() * sizeof(float));
    BS_CUDA_CHECK(cudaMemcpy(out->inv_freq.get(), table.inv_freq.data(), out->inv_freq.bytes(), cudaMemcpyHostToDevice));
    return out;
  }

  // ---- ops ----

  void linear(const PreparedWeights& pw, const float* x, float* y, int64_t n, const float* bias) override {
    if (n <= 0) return;
    const auto& w = static_cast<const CudaWeights&>(pw).w;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (n <= cuda::kGemvMaxRows)
      cuda::gemv_bf16(w, x, y, n, bias, linear_scratch_, stream_.get());
    else
      cuda::linear(cublas_, w, x, y, n, bias, linear_scratch_, stream_.get());
  }

  void embed(const PreparedWeights& prepared, const int32_t* ids, float* out, int64_t n) override {
    if (n <= 0) return;
    const auto& table = static_cast<const CudaEmbedding&>(prepared);
    DeviceScope scope(device_);
    cuda::flag_out_of_range(ids, n, table.view.out_features, kFlagEmbed, flag_device_, stream_.get());
    cuda::embed(table.view.type, table.table.get(), ids, out, n, table.view.in_features, table.view.out_features,
                stream_.get());
  }

  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override {
    DeviceScope scope(device_);
    cuda::rmsnorm(x, weight, out, n, dim, eps, stream_.get());
  }

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& prepared) override {
    const auto& r = static_cast<const CudaRope&>(prepared);
    DeviceScope scope(device_);
    cuda::rope_at_positions(x, pos, r.inv_freq.as<float>(), n, heads, r.table.head_dim,
                            r.table.style == RopeStyle::Interleaved, stream_.get());
  }

  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    DeviceScope scope(device_);
    cuda::swiglu(gate_up, out, n, ff, stream_.get());
  }

  void add(float* y, const float* x, int64_t count) override {
    DeviceScope scope(device_);
    cuda::residual_add(y, x, count, stream_.get());
  }

  void split_qkv(const float* qkv, float* q, float* k, float* v, int64_t n, int64_t q_dim, int64_t kv_dim) override {
    DeviceScope scope(device_);
    cuda::split_qkv(qkv, q, k, v, n, q_dim, kv_dim, stream_.get());
  }

  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t width) override {
    DeviceScope scope(device_);
    cuda::gather_rows(src, rows, dst, n, width, stream_.get());
  }

  void store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    cuda::flag_out_of_range(pos, n, kv.capacity, kFlagStoreKv, flag_device_, stream_.get());
    cuda::store_kv(device_view(kv), pos, k, v, n, stream_.get());
  }

  void kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                    KvDeviation which, double* out) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    cuda::flag_out_of_range(pos, n, kv.capacity, kFlagKvDeviation, flag_device_, stream_.get());
    cuda::kv_deviation(device_view(kv), pos, k, v, n, which != KvDeviation::V, which != KvDeviation::K, out,
                       stream_.get());
  }

  void top_k(const double* score, int64_t n, int64_t k, int32_t* out) override {
    if (k < 0 || k > n) throw std::invalid_argument("top_k: k must be in [0, n]");
    if (k == 0) return;
    DeviceScope scope(device_);
    cuda::top_k(score, n, k, out, stream_.get());
  }

  void rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta, const PreparedRope& prepared) override {
    if (first < 0 || m < 0 || first + m > kv.capacity) throw std::out_of_range("rope_kv_rows: rows outside the cache");
    const RopeTable& table = prepared.table;
    if (kv.head_dim != table.head_dim) throw std::invalid_argument("rope_kv_rows: head_dim differs from the table");
    if (m == 0) return;
    // (cos, sin) of the delta angle per pair, in double then fp32: the CPU's RoPE cache's
    // arithmetic (kernels/cpu/cpu_backend.cpp), so both rotate by the same fp32 values.
    const int64_t half = table.head_dim / 2;
    std::vector<float> cos_sin(static_cast<size_t>(half * 2));
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(delta) * table.inv_freq[static_cast<size_t>(i)];
      cos_sin[static_cast<size_t>(2 * i)] = static_cast<float>(std::cos(a));
      cos_sin[static_cast<size_t>(2 * i + 1)] = static_cast<float>(std::sin(a));
    }
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    float* dev = static_cast<float*>(grow(rope_scratch_, cos_sin.size() * sizeof(float)));
    BS_CUDA_CHECK(cudaMemcpyAsync(dev, cos_sin.data(), cos_sin.size() * sizeof(float), cudaMemcpyHostToDevice,
                                  stream_.get()));
    cuda::rope_kv_rows(device_view(kv), first, m, dev, table.style == RopeStyle::Interleaved, stream_.get());
  }

  void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                 int64_t n_kv, float scale, Precision) override {
    if (n_kv > kv.capacity) throw std::out_of_range("cuda attention: n_kv beyond the cache");
    if (!is_kv_dtype(kv.dtype)) throw std::invalid_argument("cuda attention: K/V must be F32, F16 or BF16");
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (n >= kGemmAttentionRows)
      cuda::attention_gemm(cublas_, q, qpos, device_view(kv), out, n, q_heads, n_kv, scale, attention_scratch_,
                           stream_.get());
    else
      cuda::attention(q, qpos, device_view(kv), out, n, q_heads, n_kv, scale, stream_.get());
  }

  void sample_rows(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
    auto* picked = static_cast<int32_t*>(pinned_at_least(picked_, bytes));
    cuda::sample_rows(logits, n, vocab, rows, picked, sample_scratch_, stream_.get());
    throw_if_flagged_after_sync();
    std::memcpy(tokens, picked, bytes);
  }

  void attention_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n, int64_t q_heads,
                      float scale, Precision) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    // Every row's page table in one upload, then the rows' views pointing into it.
    int64_t pages = 0;
    for (int64_t i = 0; i < n; ++i) pages += kv[i].page_count;
    host_pages_.resize(static_cast<size_t>(pages));
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(kv[i].pages, kv[i].page_count, host_pages_.begin() + at);
      at += kv[i].page_count;
    }
    const size_t views_bytes = static_cast<size_t>(n) * sizeof(cuda::DevicePagedKv);
    const size_t pages_bytes = static_cast<size_t>(pages) * sizeof(int32_t);
    // Views first (their alignment), then the page tables.
    auto* base = static_cast<std::byte*>(grow(rows_scratch_, views_bytes + pages_bytes));
    auto* dev_views = reinterpret_cast<cuda::DevicePagedKv*>(base);
    auto* dev_pages = reinterpret_cast<int32_t*>(base + views_bytes);
    host_views_.resize(static_cast<size_t>(n));
    at = 0;
    for (int64_t i = 0; i < n; ++i) {
      host_views_[static_cast<size_t>(i)] = cuda::device_view(kv[i], dev_pages + at);
      at += kv[i].page_count;
    }
    host_rows_.resize(views_bytes + pages_bytes);
    std::memcpy(host_rows_.data(), host_views_.data(), views_bytes);
    std::memcpy(host_rows_.data() + views_bytes, host_pages_.data(), pages_bytes);
    BS_CUDA_CHECK(cudaMemcpyAsync(base, host_rows_.data(), host_rows_.size(), cudaMemcpyHostToDevice, stream_.get()));
    int64_t max_keys = 0;
    for (int64_t i = 0; i < n; ++i) max_keys = std::max(max_keys, kv[i].capacity);
    cuda::attention_rows(q, qpos, dev_views, out, n, q_heads, kv[0].kv_heads, kv[0].head_dim, scale, max_keys,
                         decode_scratch_, stream_.get());
  }

 protected:
  void* allocate_bytes(int64_t bytes) override {
    DeviceScope scope(device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
    BS_CUDA_CHECK(e);
    return p;
  }
  void free_bytes(void* data, int64_t) override {
    cudaSetDevice(device_);
    cudaFree(data);  // waits for the device's work: nothing in flight reads freed memory
  }

 private:
  cudaStream_t on(Stream* stream) const {
    return stream ? static_cast<CudaStreamHandle*>(stream)->stream.get() : stream_.get();
  }

  // The stored bytes of a matrix as they are in the file, on the device.
  DeviceAllocation upload_stored(const WeightView& w) {
    const size_t bytes = static_cast<size_t>(w.out_features * type_row_bytes(w.type, w.in_features));
    DeviceAllocation stored(bytes);
    BS_CUDA_CHECK(cudaMemcpyAsync(stored.get(), w.data, bytes, cudaMemcpyHostToDevice, stream_.get()));
    return stored;
  }

  // A KvView's device form, its page table uploaded on the compute stream into the
  // page scratch (stream order keeps the previous op's table until that op ran).
  cuda::DevicePagedKv device_view(const KvView& kv) {
    const size_t bytes = static_cast<size_t>(kv.page_count) * sizeof(int32_t);
    auto* pages = static_cast<int32_t*>(grow(pages_scratch_, bytes));
    BS_CUDA_CHECK(cudaMemcpyAsync(pages, kv.pages, bytes, cudaMemcpyHostToDevice, stream_.get()));
    return cuda::device_view(kv, pages);
  }

  static void* grow(DeviceAllocation& scratch, size_t bytes) {
    if (scratch.bytes() < bytes) scratch = DeviceAllocation(std::max(bytes, 2 * scratch.bytes()));
    return scratch.get();
  }

  // After sample_rows: its ids and the flag of the ops before it, waited for and read.
  void throw_if_flagged_after_sync() {
    fetch_flag();
    waits_->for_stream(stream_.get(), "a step's sampled tokens");
    throw_if_flagged();
  }
  // The flag's value into flag_host_, on the compute stream (read after the wait).
  void fetch_flag() {
    BS_CUDA_CHECK(cudaMemcpyAsync(flag_host_, flag_device_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_.get()));
  }
  // After a wait that covered fetch_flag(): the first op that saw an index out of range,
  // reported once (the flag is cleared for the ops after it).
  void throw_if_flagged() {
    const int32_t code = *flag_host_;
    if (code == kFlagClear) return;
    *flag_host_ = kFlagClear;
    BS_CUDA_CHECK(cudaMemsetAsync(flag_device_, 0, sizeof(int32_t), stream_.get()));
    throw std::out_of_range(flag_message(code));
  }

  const int device_;
  DeviceScope scope_;  // the device is current while the members below are made
  CudaStream stream_;  // every op and every copy without a stream
  cuda::CublasHandle cublas_;
  std::string description_, kernel_id_;
  std::shared_ptr<cuda::DeviceWaits> waits_;  // every host wait, bounded (shared with the streams made)
  std::mutex readback_mu_;                     // copy_to_host's pinned buffer
  std::unique_ptr<PinnedBuffer> readback_;
  std::unique_ptr<PinnedBuffer> picked_;  // sample_rows' ids (under ops_mu_)
  std::mutex ops_mu_;  // the scratch below is shared by the threads that call ops
  DeviceAllocation linear_scratch_, pages_scratch_, rope_scratch_, rows_scratch_, decode_scratch_;
  cuda::AttentionGemmScratch attention_scratch_;
  cuda::SampleScratch sample_scratch_;
  std::vector<int32_t> host_pages_;
  std::vector<cuda::DevicePagedKv> host_views_;
  std::vector<std::byte> host_rows_;
  DeviceAllocation flag_{sizeof(int32_t)};  // the index flag (FlagCode), device memory
  int32_t* flag_host_ = nullptr;            // pinned: where fetch_flag() puts it
  int32_t* flag_device_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, std::chrono::nanoseconds wait_limit) {
  const int count = cuda::device_count();
  if (device < 0 || device >= count)
    throw std::runtime_error("cuda: no CUDA device " + std::to_string(device) + " (" +
                             std::to_string(count) + " visible" + (count == 0 ? ": no GPU or no driver" : "") + ")");
  if (wait_limit <= std::chrono::nanoseconds::zero())
    throw std::invalid_argument("cuda: the wait limit must be > 0 (device.wait_timeout)");
  return std::make_unique<CudaBackend>(device, wait_limit);
}

}  // namespace bs::kernels
