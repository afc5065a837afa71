// The CPU backend: AVX-512 kernels for the element-wise ops and attention,
// oneDNN for prefill GEMMs, direct quantized products for decode.
#include "kernels/cpu/simd_math.h"  // first: see the note there
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/dequant.h"

namespace bs::kernels {
namespace {

// Up to this many rows a product reads the stored weights directly; above it,
// the packed oneDNN GEMM wins.
constexpr int64_t kGemvMaxRows = 4;
// Up to this many query tokens attention reads the cache directly (decode).
constexpr int64_t kDecodeMaxQueries = 4;

struct CpuWeights final : PreparedWeights {
  cpu::DnnlWeightsPtr packed;
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision precision) override {
    auto out = std::make_unique<CpuWeights>();
    out->view = w;
    out->packed = cpu::pack_for_gemm(w, precision);
    return out;
  }

  void linear(const PreparedWeights& pw, const float* x, float* y, int64_t n, const float* bias) override {
    const auto& w = static_cast<const CpuWeights&>(pw);
    if (n <= kGemvMaxRows)
      cpu::gemv_quantized(w.view, x, y, n);
    else
      cpu::gemm(*w.packed, x, y, n);
    if (bias) {
      const int64_t out = w.view.out_features;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < out; ++o) y[t * out + o] += bias[o];
    }
  }

  void embed(const WeightView& table, const int32_t* ids, float* out, int64_t n) override {
    const auto type = static_cast<uint32_t>(table.type);
    const int64_t row_bytes = table.in_features / type_block_elements(type) * type_block_bytes(type);
    for (int64_t t = 0; t < n; ++t)
      if (ids[t] < 0 || ids[t] >= table.out_features) throw std::out_of_range("embed: token id out of range");
#pragma omp parallel for schedule(static) if (n >= 64)
    for (int64_t t = 0; t < n; ++t)
      dequantize_row(type, static_cast<const uint8_t*>(table.data) + ids[t] * row_bytes,
                     out + t * table.in_features, table.in_features);
  }

  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override {
    cpu::rmsnorm(x, weight, out, n, dim, eps);
  }

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const RopeTable& table) override {
    const int64_t half = table.head_dim / 2;
    std::vector<float> cos_sin(static_cast<size_t>(n * half * 2));
    fill_cos_sin(table, pos, n, cos_sin.data());
    cpu::rope(x, cos_sin.data(), n, heads, table.head_dim, table.style);
  }

  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    cpu::swiglu(gate_up, out, n, ff);
  }

  void attention(const float* q, const int32_t* qpos, const float* k, const float* v, float* out, int64_t n,
                 int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv, int64_t kv_stride,
                 float scale, Precision precision) override {
    if (n <= kDecodeMaxQueries && head_dim <= 256)
      cpu::attention_decode(q, qpos, k, v, out, n, q_heads, kv_heads, head_dim, n_kv, kv_stride, scale);
    else if (precision == Precision::BF16 && head_dim % 32 == 0)
      cpu::attention_bf16(q, qpos, k, v, out, n, q_heads, kv_heads, head_dim, n_kv, kv_stride, scale);
    else
      cpu::attention(q, qpos, k, v, out, n, q_heads, kv_heads, head_dim, n_kv, kv_stride, scale);
  }

 private:
  // (cos, sin) per position and frequency, cached for non-negative positions:
  // computing them is as costly as the rotation itself.
  void fill_cos_sin(const RopeTable& table, const int32_t* pos, int64_t n, float* dst) {
    const int64_t half = table.head_dim / 2;
    std::lock_guard<std::mutex> lock(rope_mu_);
    if (rope_freqs_ != table.inv_freq) {
      rope_freqs_ = table.inv_freq;
      rope_cache_.clear();
    }
    int32_t max_pos = -1;
    for (int64_t t = 0; t < n; ++t) max_pos = std::max(max_pos, pos[t]);
    const int64_t have = static_cast<int64_t>(rope_cache_.size()) / (half * 2);
    if (max_pos >= have) {
      const int64_t want = std::max<int64_t>(max_pos + 1, have * 2);
      rope_cache_.resize(static_cast<size_t>(want * half * 2));
      for (int64_t p = have; p < want; ++p) compute_cos_sin(table, static_cast<double>(p), &rope_cache_[p * half * 2]);
    }
    for (int64_t t = 0; t < n; ++t) {
      if (pos[t] >= 0)
        std::copy_n(&rope_cache_[pos[t] * half * 2], half * 2, dst + t * half * 2);
      else
        compute_cos_sin(table, static_cast<double>(pos[t]), dst + t * half * 2);
    }
  }
  static void compute_cos_sin(const RopeTable& table, double p, float* dst) {
    for (int64_t i = 0; i < table.head_dim / 2; ++i) {
      const double a = p * table.inv_freq[i];
      dst[2 * i] = static_cast<float>(std::cos(a));
      dst[2 * i + 1] = static_cast<float>(std::sin(a));
    }
  }

  std::mutex rope_mu_;
  std::vector<float> rope_freqs_;
  std::vector<float> rope_cache_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

int cpu_compute_threads() { return omp_get_max_threads(); }

}  // namespace bs::kernels
