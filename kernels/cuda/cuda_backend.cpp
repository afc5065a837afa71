// The CUDA backend (cuda_backend_impl.h): construction, memory, copies and ordering,
// prepared constants, the index flag.
#include "kernels/cuda/cuda_backend_impl.h"

namespace bs::kernels::cuda_backend_detail {

CudaBackend::CudaBackend(int device, std::chrono::nanoseconds wait_limit)
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

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  // A lost device is not waited for (its work may never end); the driver reclaims it.
  if (!waits_->lost()) cudaStreamSynchronize(stream_.get());
  for (auto& [key, g] : step_graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  release_workspaces();  // before the members that free_bytes needs go
  if (flag_host_) cudaFreeHost(flag_host_);
}

int64_t CudaBackend::free_memory_bytes() const {
  DeviceScope scope(device_);
  size_t free = 0, total = 0;
  BS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

void CudaBackend::copy_to_backend(void* dst, const void* host_src, int64_t bytes, Stream* stream) {
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

void CudaBackend::copy_to_host(void* host_dst, const void* src, int64_t bytes, Stream* stream) {
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

void CudaBackend::copy_within(void* dst, const void* src, int64_t bytes, Stream* stream) {
  if (bytes <= 0) return;
  DeviceScope scope(device_);
  BS_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, on(stream)));
}

void CudaBackend::synchronize() {
  DeviceScope scope(device_);
  fetch_flag();
  waits_->for_stream(stream_.get(), "the compute stream's work");
  BS_CUDA_CHECK(cudaDeviceSynchronize());
  throw_if_flagged();
}

std::unique_ptr<PreparedWeights> CudaBackend::prepare(const WeightView& w, Precision precision) {
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

std::unique_ptr<PreparedWeights> CudaBackend::prepare_embedding(const WeightView& table) {
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(ops_mu_);
  auto out = std::make_unique<CudaEmbedding>();
  std::vector<uint8_t> host;
  out->view = decodable_view(table, host, HostDecode::F32);  // its type is what embed() decodes
  out->table = upload_stored(out->view);
  waits_->for_stream(stream_.get(), "an embedding table upload");
  return out;
}

std::unique_ptr<PreparedRope> CudaBackend::prepare_rope(const RopeTable& table) {
  auto base = Backend::prepare_rope(table);  // validates the table
  DeviceScope scope(device_);
  auto out = std::make_unique<CudaRope>();
  out->table = base->table;
  out->inv_freq = DeviceAllocation(table.inv_freq.size() * sizeof(float));
  BS_CUDA_CHECK(cudaMemcpy(out->inv_freq.get(), table.inv_freq.data(), out->inv_freq.bytes(), cudaMemcpyHostToDevice));
  return out;
}

void* CudaBackend::allocate_bytes(int64_t bytes) {
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

void CudaBackend::free_bytes(void* data, int64_t) {
  cudaSetDevice(device_);
  ++generation_;   // a captured step may point here
  cudaFree(data);  // waits for the device's work: nothing in flight reads freed memory
}

WeightView CudaBackend::decodable_view(const WeightView& w, std::vector<uint8_t>& host, HostDecode to) {
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

DeviceAllocation CudaBackend::upload_stored(const WeightView& w) {
  const size_t bytes = static_cast<size_t>(w.out_features * type_row_bytes(w.type, w.in_features));
  DeviceAllocation stored(bytes);
  BS_CUDA_CHECK(cudaMemcpyAsync(stored.get(), w.data, bytes, cudaMemcpyHostToDevice, stream_.get()));
  return stored;
}

cuda::DevicePagedKv CudaBackend::device_view(const KvView& kv) {
  const size_t bytes = static_cast<size_t>(kv.page_count) * sizeof(int32_t);
  not_while_capturing("an upload of a page table");
  auto* pages = static_cast<int32_t*>(grow(pages_scratch_, bytes));
  {
    std::lock_guard<std::mutex> lock(upload_mu_);
    upload_ring_->copy_in(pages, kv.pages, static_cast<int64_t>(bytes), stream_.get());
  }
  return cuda::device_view(kv, pages);
}

const cuda::DevicePagedKv* CudaBackend::upload_rows(const KvView* kv, int64_t n) {
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

void* CudaBackend::grow(DeviceAllocation& scratch, size_t bytes) {
  if (scratch.bytes() < bytes) {
    scratch = DeviceAllocation(std::max(bytes, 2 * scratch.bytes()));
    ++generation_;
  }
  return scratch.get();
}

void CudaBackend::throw_if_flagged_after_sync() {
  fetch_flag();
  waits_->for_stream(stream_.get(), "a step's sampled tokens");
  throw_if_flagged();
}

void CudaBackend::throw_if_flagged() {
  const int32_t code = *flag_host_;
  if (code == kFlagClear) return;
  *flag_host_ = kFlagClear;
  BS_CUDA_CHECK(cudaMemsetAsync(flag_device_, 0, sizeof(int32_t), stream_.get()));
  throw std::out_of_range(flag_message(code));
}

}  // namespace bs::kernels::cuda_backend_detail

namespace bs::kernels {

std::unique_ptr<Backend> make_cuda_backend(int device, std::chrono::nanoseconds wait_limit) {
  const int count = cuda::device_count();
  if (device < 0 || device >= count)
    throw std::runtime_error("cuda: no CUDA device " + std::to_string(device) + " (" +
                             std::to_string(count) + " visible" + (count == 0 ? ": no GPU or no driver" : "") + ")");
  if (wait_limit <= std::chrono::nanoseconds::zero())
    throw std::invalid_argument("cuda: the wait limit must be > 0 (device.wait_timeout)");
  return std::make_unique<cuda_backend_detail::CudaBackend>(device, wait_limit);
}

}  // namespace bs::kernels
