// The CUDA backend's ops (cuda_backend_impl.h): each sets the device and runs its
// kernel on the compute stream.
#include "kernels/cuda/cuda_backend_impl.h"

namespace bs::kernels::cuda_backend_detail {

void CudaBackend::linear(const PreparedWeights& pw, const float* x, float* y, int64_t n, const float* bias) {
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

void CudaBackend::embed(const PreparedWeights& prepared, const int32_t* ids, float* out, int64_t n) {
  if (n <= 0) return;
  const auto& table = static_cast<const CudaEmbedding&>(prepared);
  DeviceScope scope(device_);
  cuda::flag_out_of_range(ids, n, table.view.out_features, kFlagEmbed, flag_device_, cs());
  cuda::embed(table.view.type, table.table.get(), ids, out, n, table.view.in_features, table.view.out_features,
              cs());
}

void CudaBackend::rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& prepared) {
  const auto& r = static_cast<const CudaRope&>(prepared);
  DeviceScope scope(device_);
  cuda::rope_at_positions(x, pos, r.inv_freq.as<float>(), n, heads, r.table.head_dim,
                          r.table.style == RopeStyle::Interleaved, cs());
}

void CudaBackend::store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) {
  if (n <= 0) return;
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(ops_mu_);
  cuda::flag_out_of_range(pos, n, kv.capacity, kFlagStoreKv, flag_device_, cs());
  cuda::store_kv(device_view(kv), pos, k, v, n, cs());
}

std::shared_ptr<void> CudaBackend::pin_host(const void* p, int64_t bytes) {
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

void CudaBackend::write_kv_block(const KvView& kv, int64_t first, int64_t m, const void* k, const void* v,
                    Stream* stream) {
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

void CudaBackend::kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                  KvDeviation which, double* out) {
  if (n <= 0) return;
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(ops_mu_);
  cuda::flag_out_of_range(pos, n, kv.capacity, kFlagKvDeviation, flag_device_, cs());
  cuda::kv_deviation(device_view(kv), pos, k, v, n, which != KvDeviation::V, which != KvDeviation::K, out,
                     cs());
}

void CudaBackend::attention_mass(const float* q, const int32_t* qpos, const KvView& kv, int64_t n, int64_t q_heads,
                    int64_t n_kv, float scale, double* out) {
  if (n_kv < 0 || n_kv > kv.capacity) throw std::out_of_range("attention_mass: n_kv beyond the cache");
  if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
    throw std::invalid_argument("attention_mass: query heads not a multiple of KV heads");
  refuse_window(kv, "attention_mass");
  if (n_kv == 0) return;
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(ops_mu_);
  cuda::attention_mass(q, qpos, device_view(kv), n, q_heads, n_kv, scale, out, cs());
}

void CudaBackend::top_k(const double* score, int64_t n, int64_t k, int32_t* out) {
  if (k < 0 || k > n) throw std::invalid_argument("top_k: k must be in [0, n]");
  if (k == 0) return;
  DeviceScope scope(device_);
  cuda::top_k(score, n, k, out, cs());
}

void CudaBackend::rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta, const PreparedRope& prepared) {
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

void CudaBackend::attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
               int64_t n_kv, float scale, Precision) {
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

void CudaBackend::sample_rows(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens) {
  if (n <= 0) return;
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(ops_mu_);
  const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
  auto* picked = static_cast<int32_t*>(pinned_at_least(picked_, bytes));
  cuda::sample_rows(logits, n, vocab, rows, picked, sample_scratch_, cs());
  throw_if_flagged_after_sync();
  std::memcpy(tokens, picked, bytes);
}

void CudaBackend::store_kv_rows(const KvView* kv, const int32_t* pos, const float* k, const float* v, int64_t n) {
  if (n <= 0) return;
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> lock(ops_mu_);
  const cuda::DevicePagedKv* dev_views = upload_rows(kv, n);
  cuda::store_kv_rows(dev_views, pos, k, v, n, kv[0].kv_heads, kv[0].head_dim, flag_device_, kFlagStoreKv,
                      cs());
}

void CudaBackend::attention_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n, int64_t q_heads,
                    float scale, Precision) {
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

}  // namespace bs::kernels::cuda_backend_detail
