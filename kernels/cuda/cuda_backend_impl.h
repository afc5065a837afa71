// The CUDA backend's class (kernels/cuda/cuda_backend.h makes one), shared by the
// files that implement it: cuda_backend.cpp (construction, memory, copies and
// ordering, prepared constants, the index flag), cuda_backend_ops.cpp (the ops) and
// cuda_decode_graphs.cpp (decode steps captured and replayed as CUDA graphs), with
// the host-side pieces they use (pinned buffers, the staging ring, stream and event
// handles). Private to kernels/cuda.
#pragma once

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

namespace bs::kernels::cuda_backend_detail {

using cuda::CudaEvent;
using cuda::CudaStream;
using cuda::DeviceAllocation;

// Codes of the ops whose device-side index check can fail (the flag holds the first).
enum FlagCode : int32_t { kFlagClear = 0, kFlagEmbed = 1, kFlagStoreKv = 2, kFlagKvDeviation = 3 };

inline const char* flag_message(int32_t code) {
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
inline void* pinned_at_least(std::unique_ptr<PinnedBuffer>& buffer, size_t bytes) {
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
inline bool decode_gemm_from_env() {
  const char* v = std::getenv("BLENDSERVE_CUDA_DECODE_GEMM");
  if (!v || std::string(v).empty() || std::string(v) == "cublas") return true;
  if (std::string(v) == "gemv") return false;
  throw std::invalid_argument(std::string("BLENDSERVE_CUDA_DECODE_GEMM: '") + v + "' (cublas or gemv)");
}

// Whether decode steps run as CUDA graphs: yes unless BLENDSERVE_CUDA_GRAPHS=0.
inline bool graphs_from_env() {
  const char* v = std::getenv("BLENDSERVE_CUDA_GRAPHS");
  return !(v && std::string(v) == "0");
}

// copy_to_backend without a stream sends up to this many bytes through the compute
// stream's pinned ring (StagingRing), more straight from the pageable source.
inline constexpr int64_t kRingCopyMaxBytes = int64_t{256} << 10;

// From this many query rows on, attention runs on the tensor cores with bf16 products:
// the fused flash kernel (attention_flash.cuh) for the head dims it has, else cuBLAS
// (attention_gemm.cuh). Below it the warp kernel, whose fp32 dot products are the more
// precise and whose cost is small for a few rows (a short blend check of few rows).
inline constexpr int64_t kGemmAttentionRows = 64;

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::chrono::nanoseconds wait_limit);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string kernel_id() const override { return kernel_id_; }
  bool supports(Precision precision) const override { return precision == Precision::BF16; }
  int64_t linear_exact_rows() const override { return cuda::kGemvMaxRows; }
  bool host_accessible() const override { return false; }
  int64_t free_memory_bytes() const override;
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

  void copy_to_backend(void* dst, const void* host_src, int64_t bytes, Stream* stream) override;
  void copy_to_host(void* host_dst, const void* src, int64_t bytes, Stream* stream) override;

  void copy_within(void* dst, const void* src, int64_t bytes, Stream* stream) override;

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
  void synchronize() override;

  // ---- prepared constants ----

  std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision precision) override;
  std::unique_ptr<PreparedWeights> prepare_embedding(const WeightView& table) override;

  std::unique_ptr<PreparedRope> prepare_rope(const RopeTable& table) override;

  // ---- ops ----

  void linear(const PreparedWeights& pw, const float* x, float* y, int64_t n, const float* bias) override;
  void embed(const PreparedWeights& prepared, const int32_t* ids, float* out, int64_t n) override;

  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override {
    DeviceScope scope(device_);
    cuda::rmsnorm(x, weight, out, n, dim, eps, cs());
  }

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& prepared) override;

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

  void store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) override;

  // cudaHostRegister; a failure (memory already registered, or the driver refusing) is
  // not an error: nullptr, and the caller copies through staging as before.
  std::shared_ptr<void> pin_host(const void* p, int64_t bytes) override;

  // A stored chunk's layer: K and V (and the view's page table) in one DMA each into
  // the stream's device block, then one scatter kernel into the pages, all on that
  // stream (the next call's DMA into the block is ordered after this scatter). K and V
  // in page-locked memory (a pinned RAM-tier entry: pin_host) are read in place — the
  // caller keeps them alive until an event recorded after this completes (a loader
  // drains its stream before it lets its readers go); others go through the stream's
  // pinned ring (a host memcpy first). Without a stream, the base class's copies on the
  // compute stream.
  void write_kv_block(const KvView& kv, int64_t first, int64_t m, const void* k, const void* v,
                      Stream* stream) override;

  void kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                    KvDeviation which, double* out) override;

  // The CUDA attention kernels have no sliding window yet: a model whose layers need
  // one is refused at load (sliding_window_attention()), and a view with one here too.
  bool sliding_window_attention() const override { return false; }
  static void refuse_window(const KvView& kv, const char* op) {
    if (kv.window != 0) throw std::invalid_argument(std::string("cuda ") + op + ": sliding-window attention is not implemented");
  }

  void attention_mass(const float* q, const int32_t* qpos, const KvView& kv, int64_t n, int64_t q_heads,
                      int64_t n_kv, float scale, double* out) override;
  void top_k(const double* score, int64_t n, int64_t k, int32_t* out) override;

  void rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta, const PreparedRope& prepared) override;

  void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                 int64_t n_kv, float scale, Precision) override;

  // Device memory stays: the decode graphs hold the workspace's addresses, a free waits
  // for the device and the next prefill would pay cudaMalloc again (GPU memory is the
  // KV pool's budget, sized at start, not the host's resident set).
  void release_scratch() override {}

  void sample_rows(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens) override;
  void store_kv_rows(const KvView* kv, const int32_t* pos, const float* k, const float* v, int64_t n) override;

  void attention_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n, int64_t q_heads,
                      float scale, Precision) override;

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
  void decode_step(const KvView* views, int layers, int64_t n, const std::function<void()>& body) override;

 protected:
  void* allocate_bytes(int64_t bytes) override;
  void free_bytes(void* data, int64_t) override;

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
  static WeightView decodable_view(const WeightView& w, std::vector<uint8_t>& host, HostDecode to);

  // The stored bytes of a matrix as they are in the file, on the device.
  DeviceAllocation upload_stored(const WeightView& w);

  // A KvView's device form, its page table uploaded on the compute stream into the
  // page scratch (stream order keeps the previous op's table until that op ran).
  cuda::DevicePagedKv device_view(const KvView& kv);

  // The rows' views on the device (a batched decode step's caches of one layer): every
  // row's page table and its view in one upload through the pinned ring. A decode layer
  // stores its rows' K/V and then attends over the same views: the second call finds
  // the bytes it would send equal to the last ones and reuses them (the scratch holds
  // them until the next upload, which stream order puts after the ops that read them).
  // Caller holds ops_mu_.
  const cuda::DevicePagedKv* upload_rows(const KvView* kv, int64_t n);
  void* grow(DeviceAllocation& scratch, size_t bytes);

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
  static int64_t keys_bucket(int64_t keys);

  // Every layer's views of a decode step (views[l * n + i]: layer l, row i) and their
  // page tables in one upload into step_rows_ (a page table shared by a row's layers
  // goes up once); the ops of the step find them with step_rows(). Caller holds ops_mu_.
  void upload_step(const KvView* views, int layers, int64_t n);

  // The device views of `kv` (n rows) when it is one layer of the step decode_step
  // uploaded (the same array the caller gave it, at a layer's offset); else nullptr.
  const cuda::DevicePagedKv* step_rows(const KvView* kv, int64_t n) const;
  void drop_graphs();

  // After sample_rows: its ids and the flag of the ops before it, waited for and read.
  void throw_if_flagged_after_sync();
  // The flag's value into flag_host_, on the compute stream (read after the wait).
  void fetch_flag() {
    BS_CUDA_CHECK(cudaMemcpyAsync(flag_host_, flag_device_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_.get()));
  }
  // After a wait that covered fetch_flag(): the first op that saw an index out of range,
  // reported once (the flag is cleared for the ops after it).
  void throw_if_flagged();
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

}  // namespace bs::kernels::cuda_backend_detail
