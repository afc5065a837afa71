#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_gemm.cuh"
#include "kernels/cuda/attention_mass.cuh"
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
#include "kernels/cuda/scatter_kv.cuh"
#include "kernels/cuda/split_qkv.cuh"
#include "kernels/cuda/store_kv.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/top_k.cuh"
#include "kernels/dequant.h"
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

// Host bytes sent to the device through pinned buffers: each copy is appended to the
// current pinned buffer and sent from there by an asynchronous DMA on `stream`, so the
// caller's memory is free on return and the DMA runs while the caller goes on (a copy
// from pageable memory is staged by the driver, synchronously with the host). A full
// buffer is left with an event; it is written again only once that event
// completed (the ring bounds the bytes in flight at buffers * bytes), a wait bounded by
// device.wait_timeout like every host wait of the backend. Not thread-safe: its owner
// serialises the calls.
class StagingRing {
 public:
  StagingRing(std::shared_ptr<cuda::DeviceWaits> waits, size_t buffer_bytes, int buffers)
      : waits_(std::move(waits)), buffer_bytes_(buffer_bytes), buffers_(buffers) {}

  void copy_in(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
    if (staging_.empty())
      for (int i = 0; i < buffers_; ++i) {
        staging_.push_back(std::make_unique<PinnedBuffer>(buffer_bytes_));
        released_.push_back(std::make_unique<CudaEvent>());
        released_.back()->record(stream);  // nothing in flight yet
      }
    auto* d = static_cast<std::byte*>(dst);
    auto* s = static_cast<const std::byte*>(src);
    for (size_t done = 0; done < static_cast<size_t>(bytes);) {
      if (used_ == buffer_bytes_) {  // next buffer, once its last DMAs are over
        released_[current_]->record(stream);
        current_ = (current_ + 1) % buffers_;
        waits_->for_event(released_[current_]->get(), "a staging buffer (its earlier copies to the device)");
        used_ = 0;
      }
      const size_t part = std::min(static_cast<size_t>(bytes) - done, buffer_bytes_ - used_);
      std::byte* at = static_cast<std::byte*>(staging_[current_]->get()) + used_;
      std::memcpy(at, s + done, part);
      BS_CUDA_CHECK(cudaMemcpyAsync(d + done, at, part, cudaMemcpyHostToDevice, stream));
      // The next copy starts 16-byte aligned in the buffer (DMA from aligned sources).
      used_ = std::min(buffer_bytes_, (used_ + part + 15) & ~size_t{15});
      done += part;
    }
  }

 private:
  std::shared_ptr<cuda::DeviceWaits> waits_;
  const size_t buffer_bytes_;
  const int buffers_;
  std::vector<std::unique_ptr<PinnedBuffer>> staging_;  // made on first use
  std::vector<std::unique_ptr<CudaEvent>> released_;    // [i] completes when buffer i's DMAs have
  int current_ = 0;
  size_t used_ = 0;  // bytes of staging_[current_] taken
};

// A stream of make_stream() with its staging ring (a loader's: chunk layers of MBs).
struct CudaStreamHandle final : Stream {
  explicit CudaStreamHandle(std::shared_ptr<cuda::DeviceWaits> w) : ring(std::move(w), size_t{8} << 20, 3) {}

  CudaStream stream;
  StagingRing ring;
  DeviceAllocation block;  // write_kv_block's device staging: K, V, then the page table
  std::mutex mu;           // one copy at a time per stream (its ring, its block)

  void copy_in(void* dst, const void* src, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    ring.copy_in(dst, src, bytes, stream.get());
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

// Which kernel computes decode-size products (up to kGemvMaxRows rows): cuBLAS padded
// to 64 rows on the tensor cores (linear.cuh's linear_padded; the default) or, with
// BLENDSERVE_CUDA_DECODE_GEMM=gemv, our GEMV on the CUDA cores (gemv_bf16.cuh). Both keep
// every row's result independent of the batch; they round differently from each other.
// Measured on an H200 (2026-11-27, 1B, the Transformer's decode step alone): one row
// 2.32 ms padded vs 1.98 ms GEMV, 32 rows 3.37 vs 14.9 ms, 64 rows 4.41 vs 35.8 ms — the
// GEMV's n fp32 FMAs per weight make it compute-bound from ~8 rows. So the padded
// product serves batches; the GEMV is the choice for one stream where its 15% matters.
bool decode_gemm_from_env() {
  const char* v = std::getenv("BLENDSERVE_CUDA_DECODE_GEMM");
  if (!v || std::string(v).empty() || std::string(v) == "cublas") return true;
  if (std::string(v) == "gemv") return false;
  throw std::invalid_argument(std::string("BLENDSERVE_CUDA_DECODE_GEMM: '") + v + "' (cublas or gemv)");
}

// Whether decode steps run as CUDA graphs: yes unless BLENDSERVE_CUDA_GRAPHS=0.
bool graphs_from_env() {
  const char* v = std::getenv("BLENDSERVE_CUDA_GRAPHS");
  return !(v && std::string(v) == "0");
}

// copy_to_backend without a stream sends up to this many bytes through the compute
// stream's pinned ring (StagingRing), more straight from the pageable source.
constexpr int64_t kRingCopyMaxBytes = int64_t{256} << 10;

// From this many query rows on, attention runs on the tensor cores with bf16 products:
// the fused flash kernel (attention_flash.cuh) for the head dims it has, else cuBLAS
// (attention_gemm.cuh). Below it the warp kernel, whose fp32 dot products are the more
// precise and whose cost is small for a few rows (a short blend check of few rows).
constexpr int64_t kGemmAttentionRows = 64;

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::chrono::nanoseconds wait_limit)
      : device_(device), scope_(device), cublas_(stream_.get()) {
    description_ = cuda::device_description(device);
    waits_ = std::make_shared<cuda::DeviceWaits>(device, description_, wait_limit);
    upload_ring_ = std::make_unique<StagingRing>(waits_, size_t{1} << 20, 4);
    cudaDeviceProp p{};
    BS_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    kernel_id_ = std::string("cuda/sm_") + std::to_string(p.major) + std::to_string(p.minor) + "/" + p.name + "/bf16";
    if (!decode_gemm_) kernel_id_ += "+gemv";  // short products on the CUDA cores: other rounding
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
    for (auto& [key, g] : step_graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
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
  int64_t graph_launches() const override { return static_cast<int64_t>(graph_launches_.load()); }

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
    // Small copies (token ids, positions, row indices: a few per step) through the
    // compute stream's pinned ring; large ones (weights, whole tensors) from the
    // pageable source, which CUDA stages before returning. Either way the caller's
    // memory is free on return and the DMA is ordered before later ops on the stream.
    not_while_capturing("a copy to the device");
    if (bytes <= kRingCopyMaxBytes) {
      std::lock_guard<std::mutex> lock(upload_mu_);
      upload_ring_->copy_in(dst, host_src, bytes, stream_.get());
      return;
    }
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
    std::vector<uint8_t> host;
    const WeightView dw = decodable_view(w, host, HostDecode::Bf16);
    DeviceAllocation stored = upload_stored(dw);
    auto out = std::make_unique<CudaWeights>();
    out->view = w;
    out->w = cuda::weights_to_bf16(dw.type, stored.get(), dw.out_features, dw.in_features, stream_.get());
    waits_->for_stream(stream_.get(), "a weight upload");  // the stored copy is freed next
    return out;
  }

  std::unique_ptr<PreparedWeights> prepare_embedding(const WeightView& table) override {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    auto out = std::make_unique<CudaEmbedding>();
    std::vector<uint8_t> host;
    out->view = decodable_view(table, host, HostDecode::F32);  // its type is what embed() decodes
    out->table = upload_stored(out->view);
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
    const void* scratch = linear_scratch_.get();
    const void* padded_x = padded_scratch_.x.get();
    const void* padded_y = padded_scratch_.y.get();
    if (n <= cuda::kGemvMaxRows && decode_gemm_) {
      cuda::linear_padded(cublas_, w, x, y, n, bias, padded_scratch_, cs());
    } else if (n <= cuda::kGemvMaxRows) {
      cuda::gemv_bf16(w, x, y, n, bias, linear_scratch_, cs());
    } else {
      not_while_capturing("linear through cuBLAS");
      cuda::linear(cublas_, w, x, y, n, bias, linear_scratch_, cs());
    }
    if (linear_scratch_.get() != scratch || padded_scratch_.x.get() != padded_x || padded_scratch_.y.get() != padded_y)
      ++generation_;  // grown: a captured step's pointer is gone
  }

  void embed(const PreparedWeights& prepared, const int32_t* ids, float* out, int64_t n) override {
    if (n <= 0) return;
    const auto& table = static_cast<const CudaEmbedding&>(prepared);
    DeviceScope scope(device_);
    cuda::flag_out_of_range(ids, n, table.view.out_features, kFlagEmbed, flag_device_, cs());
    cuda::embed(table.view.type, table.table.get(), ids, out, n, table.view.in_features, table.view.out_features,
                cs());
  }

  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override {
    DeviceScope scope(device_);
    cuda::rmsnorm(x, weight, out, n, dim, eps, cs());
  }

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& prepared) override {
    const auto& r = static_cast<const CudaRope&>(prepared);
    DeviceScope scope(device_);
    cuda::rope_at_positions(x, pos, r.inv_freq.as<float>(), n, heads, r.table.head_dim,
                            r.table.style == RopeStyle::Interleaved, cs());
  }

  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    DeviceScope scope(device_);
    cuda::swiglu(gate_up, out, n, ff, cs());
  }

  void add(float* y, const float* x, int64_t count) override {
    DeviceScope scope(device_);
    cuda::residual_add(y, x, count, cs());
  }

  void split_qkv(const float* qkv, float* q, float* k, float* v, int64_t n, int64_t q_dim, int64_t kv_dim) override {
    DeviceScope scope(device_);
    cuda::split_qkv(qkv, q, k, v, n, q_dim, kv_dim, cs());
  }

  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t width) override {
    DeviceScope scope(device_);
    cuda::gather_rows(src, rows, dst, n, width, cs());
  }

  void store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    cuda::flag_out_of_range(pos, n, kv.capacity, kFlagStoreKv, flag_device_, cs());
    cuda::store_kv(device_view(kv), pos, k, v, n, cs());
  }

  // cudaHostRegister; a failure (memory already registered, or the driver refusing) is
  // not an error: nullptr, and the caller copies through staging as before.
  std::shared_ptr<void> pin_host(const void* p, int64_t bytes) override {
    if (!p || bytes <= 0) return nullptr;
    DeviceScope scope(device_);
    void* at = const_cast<void*>(p);
    if (cudaHostRegister(at, static_cast<size_t>(bytes), cudaHostRegisterDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    const int device = device_;
    return std::shared_ptr<void>(at, [device](void* q) {
      cudaSetDevice(device);
      (void)cudaHostUnregister(q);  // at exit the context may be gone: nothing to do then
    });
  }

  // A stored chunk's layer: K and V (and the view's page table) in one DMA each into
  // the stream's device block, then one scatter kernel into the pages, all on that
  // stream (the next call's DMA into the block is ordered after this scatter). K and V
  // in page-locked memory (a pinned RAM-tier entry: pin_host) are read in place — the
  // caller keeps them alive until an event recorded after this completes (a loader
  // drains its stream before it lets its readers go); others go through the stream's
  // pinned ring (a host memcpy first). Without a stream, the base class's copies on the
  // compute stream.
  void write_kv_block(const KvView& kv, int64_t first, int64_t m, const void* k, const void* v,
                      Stream* stream) override {
    if (first < 0 || m < 0 || first + m > kv.capacity) throw std::out_of_range("write_kv_block: rows outside the cache");
    if (m == 0) return;
    if (!stream) {
      Backend::write_kv_block(kv, first, m, k, v, nullptr);
      return;
    }
    DeviceScope scope(device_);
    auto* s = static_cast<CudaStreamHandle*>(stream);
    std::lock_guard<std::mutex> lock(s->mu);
    const size_t bytes = static_cast<size_t>(kv.kv_heads * m * kv.head_dim * kv_dtype_bytes(kv.dtype));
    const size_t table = static_cast<size_t>(kv.page_count) * sizeof(int32_t);
    const size_t k_at = 0, v_at = (bytes + 255) & ~size_t{255}, table_at = v_at + ((bytes + 255) & ~size_t{255});
    if (s->block.bytes() < table_at + table) {
      // A larger block: the old one may still be read by this stream's last scatter.
      waits_->for_stream(s->stream.get(), "a loader's stream before its staging block grows");
      s->block = DeviceAllocation(std::max(table_at + table, 2 * s->block.bytes()));
    }
    auto* base = s->block.as<std::byte>();
    if (cuda::is_page_locked(k) && cuda::is_page_locked(v)) {
      BS_CUDA_CHECK(cudaMemcpyAsync(base + k_at, k, bytes, cudaMemcpyHostToDevice, s->stream.get()));
      BS_CUDA_CHECK(cudaMemcpyAsync(base + v_at, v, bytes, cudaMemcpyHostToDevice, s->stream.get()));
    } else {
      s->ring.copy_in(base + k_at, k, static_cast<int64_t>(bytes), s->stream.get());
      s->ring.copy_in(base + v_at, v, static_cast<int64_t>(bytes), s->stream.get());
    }
    s->ring.copy_in(base + table_at, kv.pages, static_cast<int64_t>(table), s->stream.get());
    cuda::scatter_kv_block(cuda::device_view(kv, reinterpret_cast<const int32_t*>(base + table_at)), first, m,
                           base + k_at, base + v_at, s->stream.get());
  }

  void kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                    KvDeviation which, double* out) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    cuda::flag_out_of_range(pos, n, kv.capacity, kFlagKvDeviation, flag_device_, cs());
    cuda::kv_deviation(device_view(kv), pos, k, v, n, which != KvDeviation::V, which != KvDeviation::K, out,
                       cs());
  }

  // The CUDA attention kernels have no sliding window yet: a model whose layers need
  // one is refused at load (sliding_window_attention()), and a view with one here too.
  bool sliding_window_attention() const override { return false; }
  static void refuse_window(const KvView& kv, const char* op) {
    if (kv.window != 0) throw std::invalid_argument(std::string("cuda ") + op + ": sliding-window attention is not implemented");
  }

  void attention_mass(const float* q, const int32_t* qpos, const KvView& kv, int64_t n, int64_t q_heads,
                      int64_t n_kv, float scale, double* out) override {
    if (n_kv < 0 || n_kv > kv.capacity) throw std::out_of_range("attention_mass: n_kv beyond the cache");
    if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
      throw std::invalid_argument("attention_mass: query heads not a multiple of KV heads");
    refuse_window(kv, "attention_mass");
    if (n_kv == 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    cuda::attention_mass(q, qpos, device_view(kv), n, q_heads, n_kv, scale, out, cs());
  }

  void top_k(const double* score, int64_t n, int64_t k, int32_t* out) override {
    if (k < 0 || k > n) throw std::invalid_argument("top_k: k must be in [0, n]");
    if (k == 0) return;
    DeviceScope scope(device_);
    cuda::top_k(score, n, k, out, cs());
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
    cuda::rope_kv_rows(device_view(kv), first, m, dev, table.style == RopeStyle::Interleaved, cs());
  }

  void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                 int64_t n_kv, float scale, Precision) override {
    if (n_kv > kv.capacity) throw std::out_of_range("cuda attention: n_kv beyond the cache");
    if (!is_kv_dtype(kv.dtype)) throw std::invalid_argument("cuda attention: K/V must be F32, F16 or BF16");
    refuse_window(kv, "attention");
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (n >= kGemmAttentionRows && cuda::attention_flash_supports(kv.head_dim)) {
      cuda::attention_flash(q, qpos, device_view(kv), out, n, q_heads, n_kv, scale, cs());
    } else if (n >= kGemmAttentionRows) {
      not_while_capturing("attention through cuBLAS");
      cuda::attention_gemm(cublas_, q, qpos, device_view(kv), out, n, q_heads, n_kv, scale, attention_scratch_,
                           cs());
    } else {
      cuda::attention(q, qpos, device_view(kv), out, n, q_heads, n_kv, scale, cs());
    }
  }

  // Device memory stays: the decode graphs hold the workspace's addresses, a free waits
  // for the device and the next prefill would pay cudaMalloc again (GPU memory is the
  // KV pool's budget, sized at start, not the host's resident set).
  void release_scratch() override {}

  void sample_rows(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
    auto* picked = static_cast<int32_t*>(pinned_at_least(picked_, bytes));
    cuda::sample_rows(logits, n, vocab, rows, picked, sample_scratch_, cs());
    throw_if_flagged_after_sync();
    std::memcpy(tokens, picked, bytes);
  }

  void store_kv_rows(const KvView* kv, const int32_t* pos, const float* k, const float* v, int64_t n) override {
    if (n <= 0) return;
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    const cuda::DevicePagedKv* dev_views = upload_rows(kv, n);
    cuda::store_kv_rows(dev_views, pos, k, v, n, kv[0].kv_heads, kv[0].head_dim, flag_device_, kFlagStoreKv,
                        cs());
  }

  void attention_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n, int64_t q_heads,
                      float scale, Precision) override {
    if (n <= 0) return;
    for (int64_t i = 0; i < n; ++i) refuse_window(kv[i], "attention_rows");
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(ops_mu_);
    const cuda::DevicePagedKv* dev_views = upload_rows(kv, n);
    int64_t max_keys = 0;
    for (int64_t i = 0; i < n; ++i) max_keys = std::max(max_keys, kv[i].capacity);
    const void* scratch = decode_scratch_.get();
    // The grid from the capacity's power-of-two bucket (the kernel splits each row by its
    // own length), so a captured step serves every batch whose caches fall in it.
    cuda::attention_rows(q, qpos, dev_views, out, n, q_heads, kv[0].kv_heads, kv[0].head_dim, scale,
                         keys_bucket(max_keys), decode_scratch_, cs());
    if (decode_scratch_.get() != scratch) ++generation_;
  }

  // A decode step as a CUDA graph (kernels/backend.h decode_step): every layer's views
  // and page tables go up once, then the step's ops are replayed from a graph captured
  // for its (rows, capacity bucket) — one launch instead of ~20 per layer. The first
  // step of a key runs eagerly (it grows the workspace and scratch the graph will
  // point into); the next one of the same key with nothing grown since is captured and
  // launched; later ones replay. Any allocation, free or scratch growth on this backend
  // (generation_) makes the graphs stale: they are dropped and the key starts again.
  // A body that issues something a graph cannot hold (a host copy, cuBLAS) throws while
  // capturing; the capture is dropped, the body runs eagerly and the key is marked
  // never to capture. BLENDSERVE_CUDA_GRAPHS=0 turns graphs off (eager, same results).
  void decode_step(const KvView* views, int layers, int64_t n, const std::function<void()>& body) override {
    if (n <= 0 || layers <= 0) {
      body();
      return;
    }
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> step_lock(step_mu_);
    int64_t max_keys = 0;
    for (int64_t i = 0; i < n * layers; ++i) max_keys = std::max(max_keys, views[i].capacity);
    {
      std::lock_guard<std::mutex> lock(ops_mu_);
      upload_step(views, layers, n);
    }
    struct Unregister {
      CudaBackend& be;
      ~Unregister() { be.step_views_ = nullptr; }
    } unregister{*this};
    if (!graphs_enabled_) {
      body();
      return;
    }
    const StepKey key{n, keys_bucket(max_keys)};
    StepGraph& g = step_graphs_[key];
    if (g.never) {
      body();
      return;
    }
    if (g.exec) {
      // Checked under ops_mu_, which every scratch growth holds: nothing the graph points
      // into can be freed between the check and the launch (a free later waits for it).
      std::lock_guard<std::mutex> lock(ops_mu_);
      if (g.generation == generation_) {
        BS_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_.get()));
        ++graph_launches_;
        return;
      }
    }
    if (g.exec) drop_graphs();  // stale: something they point into was reallocated
    StepGraph& h = step_graphs_[key];
    if (h.eager_generation != generation_) {  // first sight of this key since a growth: eager
      body();
      h.eager_generation = generation_;
      return;
    }
    const uint64_t before = generation_;
    cudaGraph_t graph = nullptr;
    BS_CUDA_CHECK(cudaStreamBeginCapture(capture_stream_.get(), cudaStreamCaptureModeThreadLocal));
    capturing_ = std::this_thread::get_id();
    try {
      body();
    } catch (...) {
      capturing_ = std::thread::id();
      (void)cudaStreamEndCapture(capture_stream_.get(), &graph);
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      h.never = true;  // not capturable: this key runs eagerly from now on
      body();
      return;
    }
    capturing_ = std::thread::id();
    BS_CUDA_CHECK(cudaStreamEndCapture(capture_stream_.get(), &graph));
    if (generation_ != before) {  // something grew while capturing: the graph may point at freed memory
      cudaGraphDestroy(graph);
      h.eager_generation = generation_;
      body();
      return;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    BS_CUDA_CHECK(e);
    h.exec = exec;
    h.generation = before;
    {
      std::lock_guard<std::mutex> lock(ops_mu_);
      if (generation_ == before) {
        BS_CUDA_CHECK(cudaGraphLaunch(h.exec, stream_.get()));
        ++graph_launches_;
        return;
      }
    }
    body();  // something was reallocated since the capture: this step eagerly, the graph stale
  }

 protected:
  void* allocate_bytes(int64_t bytes) override {
    DeviceScope scope(device_);
    void* p = nullptr;
    ++generation_;
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
    ++generation_;   // a captured step may point here
    cudaFree(data);  // waits for the device's work: nothing in flight reads freed memory
  }

 private:
  cudaStream_t on(Stream* stream) const {
    return stream ? static_cast<CudaStreamHandle*>(stream)->stream.get() : stream_.get();
  }

  // A matrix in a type the device kernels decode (F32, F16, BF16, Q8_0, Q4_0, Q4_1):
  // `w` itself, or else (Q5_0, Q5_1 and the K-quants) its rows dequantized on the host
  // into `host`, which must outlive the upload: to bf16 for a weight (the device keeps
  // bf16 weights either way, weights_to_bf16, and dequantize_row_to_bf16 rounds the
  // exact values as a device decoder would), to f32 for an embedding table (rows as
  // exact as every other type's, and as the CPU's).
  enum class HostDecode { Bf16, F32 };
  static WeightView decodable_view(const WeightView& w, std::vector<uint8_t>& host, HostDecode to) {
    switch (w.type) {
      case TensorType::F32: case TensorType::F16: case TensorType::BF16:
      case TensorType::Q8_0: case TensorType::Q4_0: case TensorType::Q4_1:
        return w;
      default: break;
    }
    const TensorType out = to == HostDecode::Bf16 ? TensorType::BF16 : TensorType::F32;
    const int64_t in_row = type_row_bytes(w.type, w.in_features), out_row = type_row_bytes(out, w.in_features);
    host.resize(static_cast<size_t>(w.out_features * out_row));
    for (int64_t r = 0; r < w.out_features; ++r) {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * in_row;
      uint8_t* dst = host.data() + r * out_row;
      if (to == HostDecode::Bf16)
        dequantize_row_to_bf16(w.type, src, reinterpret_cast<uint16_t*>(dst), w.in_features);
      else
        dequantize_row(w.type, src, reinterpret_cast<float*>(dst), w.in_features);
    }
    return WeightView{out, host.data(), w.out_features, w.in_features};
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
    not_while_capturing("an upload of a page table");
    auto* pages = static_cast<int32_t*>(grow(pages_scratch_, bytes));
    {
      std::lock_guard<std::mutex> lock(upload_mu_);
      upload_ring_->copy_in(pages, kv.pages, static_cast<int64_t>(bytes), stream_.get());
    }
    return cuda::device_view(kv, pages);
  }

  // The rows' views on the device (a batched decode step's caches of one layer): every
  // row's page table and its view in one upload through the pinned ring. A decode layer
  // stores its rows' K/V and then attends over the same views: the second call finds
  // the bytes it would send equal to the last ones and reuses them (the scratch holds
  // them until the next upload, which stream order puts after the ops that read them).
  // Caller holds ops_mu_.
  const cuda::DevicePagedKv* upload_rows(const KvView* kv, int64_t n) {
    if (const cuda::DevicePagedKv* step = step_rows(kv, n)) return step;
    not_while_capturing("an upload of views");
    int64_t pages = 0;
    for (int64_t i = 0; i < n; ++i) pages += kv[i].page_count;
    const size_t views_bytes = static_cast<size_t>(n) * sizeof(cuda::DevicePagedKv);
    const size_t pages_bytes = static_cast<size_t>(pages) * sizeof(int32_t);
    // Views first (their alignment), then the page tables.
    const size_t before = rows_scratch_.bytes();
    auto* base = static_cast<std::byte*>(grow(rows_scratch_, views_bytes + pages_bytes));
    if (rows_scratch_.bytes() != before) rows_sent_.clear();  // a new allocation holds nothing yet
    auto* dev_pages = reinterpret_cast<int32_t*>(base + views_bytes);
    host_rows_.resize(views_bytes + pages_bytes);
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      const cuda::DevicePagedKv view = cuda::device_view(kv[i], dev_pages + at);
      std::memcpy(host_rows_.data() + static_cast<size_t>(i) * sizeof(cuda::DevicePagedKv), &view, sizeof(view));
      std::memcpy(host_rows_.data() + views_bytes + static_cast<size_t>(at) * sizeof(int32_t), kv[i].pages,
                  static_cast<size_t>(kv[i].page_count) * sizeof(int32_t));
      at += kv[i].page_count;
    }
    if (host_rows_ != rows_sent_) {
      std::lock_guard<std::mutex> lock(upload_mu_);
      upload_ring_->copy_in(base, host_rows_.data(), static_cast<int64_t>(host_rows_.size()), stream_.get());
      rows_sent_ = host_rows_;
    }
    return reinterpret_cast<const cuda::DevicePagedKv*>(base);
  }

  void* grow(DeviceAllocation& scratch, size_t bytes) {
    if (scratch.bytes() < bytes) {
      scratch = DeviceAllocation(std::max(bytes, 2 * scratch.bytes()));
      ++generation_;
    }
    return scratch.get();
  }

  // The stream this thread's ops go to: the capture stream while it captures a step.
  cudaStream_t cs() const {
    return capturing_ == std::this_thread::get_id() ? capture_stream_.get() : stream_.get();
  }
  // Throws std::logic_error when this thread is capturing a step: `what` cannot be part
  // of a graph (decode_step drops the capture and runs the step eagerly).
  void not_while_capturing(const char* what) const {
    if (capturing_ == std::this_thread::get_id())
      throw std::logic_error(std::string("cuda decode_step: ") + what + " cannot be captured in a graph");
  }
  // Powers of two from 64: the key of a step's attention grid.
  static int64_t keys_bucket(int64_t keys) {
    int64_t b = 64;
    while (b < keys) b *= 2;
    return b;
  }

  // Every layer's views of a decode step (views[l * n + i]: layer l, row i) and their
  // page tables in one upload into step_rows_ (a page table shared by a row's layers
  // goes up once); the ops of the step find them with step_rows(). Caller holds ops_mu_.
  void upload_step(const KvView* views, int layers, int64_t n) {
    const int64_t count = n * layers;
    std::vector<const int32_t*> tables;  // distinct host page tables, in first-use order
    std::vector<int64_t> table_at;       // their offsets (int32 elements) after the views
    std::vector<int64_t> view_table(static_cast<size_t>(count));
    int64_t pages = 0;
    for (int64_t i = 0; i < count; ++i) {
      const auto it = std::find(tables.begin(), tables.end(), views[i].pages);
      if (it != tables.end()) {  // a row's table again (its other layers)
        view_table[static_cast<size_t>(i)] = table_at[static_cast<size_t>(it - tables.begin())];
        continue;
      }
      tables.push_back(views[i].pages);
      table_at.push_back(pages);
      view_table[static_cast<size_t>(i)] = pages;
      pages += views[i].page_count;
    }
    const size_t views_bytes = static_cast<size_t>(count) * sizeof(cuda::DevicePagedKv);
    auto* base = static_cast<std::byte*>(grow(step_rows_, views_bytes + static_cast<size_t>(pages) * sizeof(int32_t)));
    auto* dev_pages = reinterpret_cast<int32_t*>(base + views_bytes);
    std::vector<std::byte>& host = step_host_;
    host.resize(views_bytes + static_cast<size_t>(pages) * sizeof(int32_t));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = view_table[static_cast<size_t>(i)];
      const cuda::DevicePagedKv view = cuda::device_view(views[i], dev_pages + at);
      std::memcpy(host.data() + static_cast<size_t>(i) * sizeof(cuda::DevicePagedKv), &view, sizeof(view));
      std::memcpy(host.data() + views_bytes + static_cast<size_t>(at) * sizeof(int32_t), views[i].pages,
                  static_cast<size_t>(views[i].page_count) * sizeof(int32_t));
    }
    {
      std::lock_guard<std::mutex> lock(upload_mu_);
      upload_ring_->copy_in(base, host.data(), static_cast<int64_t>(host.size()), stream_.get());
    }
    step_views_ = views;
    step_layers_ = layers;
    step_n_ = n;
  }

  // The device views of `kv` (n rows) when it is one layer of the step decode_step
  // uploaded (the same array the caller gave it, at a layer's offset); else nullptr.
  const cuda::DevicePagedKv* step_rows(const KvView* kv, int64_t n) const {
    if (!step_views_ || n != step_n_ || kv < step_views_ || kv >= step_views_ + step_n_ * step_layers_) return nullptr;
    const int64_t offset = kv - step_views_;
    if (offset % step_n_ != 0) return nullptr;
    return step_rows_.as<cuda::DevicePagedKv>() + offset;
  }

  void drop_graphs() {
    waits_->for_stream(stream_.get(), "the launches of decode-step graphs before they are dropped");
    for (auto& [key, g] : step_graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    step_graphs_.clear();
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
  cuda::PaddedScratch padded_scratch_;
  // Decode-size products (up to kGemvMaxRows rows) through cuBLAS padded to 64 rows
  // (cuda::linear_padded; default), else gemv_bf16 (BLENDSERVE_CUDA_DECODE_GEMM=gemv).
  const bool decode_gemm_ = decode_gemm_from_env();
  cuda::SampleScratch sample_scratch_;
  std::vector<std::byte> host_rows_;  // upload_rows' bytes being built
  std::vector<std::byte> rows_sent_;  // what rows_scratch_ holds (or is being sent), empty: unknown
  // Small host-to-device copies on the compute stream (ids, positions, page tables,
  // views): pinned, asynchronous; made on first use. Its own lock: copy_to_backend runs
  // without ops_mu_, device_view and upload_rows with it (always ops_mu_ first).
  std::mutex upload_mu_;
  std::unique_ptr<StagingRing> upload_ring_;  // made in the constructor, after waits_

  // decode_step's state (under step_mu_): the step's views on the device and the host
  // array they came from, the graphs by key, and what makes them stale.
  struct StepKey {
    int64_t rows, keys;
    bool operator<(const StepKey& o) const { return rows != o.rows ? rows < o.rows : keys < o.keys; }
  };
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0;            // generation_ when captured
    uint64_t eager_generation = ~uint64_t{0};  // generation_ after the last eager run of the key
    bool never = false;                 // its body cannot be captured: always eager
  };
  std::mutex step_mu_;
  const bool graphs_enabled_ = graphs_from_env();
  CudaStream capture_stream_;  // where a captured step's ops go (never run on it)
  std::atomic<std::thread::id> capturing_{};
  std::atomic<uint64_t> generation_{0};  // bumped by every allocation, free and scratch growth
  DeviceAllocation step_rows_;           // [layers * n] DevicePagedKv, then the page tables
  std::vector<std::byte> step_host_;
  const KvView* step_views_ = nullptr;   // the caller's array while its step runs
  int step_layers_ = 0;
  int64_t step_n_ = 0;
  std::map<StepKey, StepGraph> step_graphs_;
  std::atomic<uint64_t> graph_launches_{0};
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
