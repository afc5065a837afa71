// The CPU backend: the kernel variant of one ISA (kernels/cpu/kernel_table.h) for the
// element-wise ops, attention and decode products, oneDNN for prefill GEMMs.
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/gemm_onednn.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/dequant.h"

namespace bs::kernels {
namespace {

// Up to this many rows a product reads the stored weights directly (one pass of the
// GEMV kernel, which takes 8 rows per pass); above it, the packed oneDNN GEMM. A
// batched decode step (Transformer::decode_step) needs the GEMV, whose rows are
// exactly the one-token products. Measured on one AVX2 core (SmolLM2-135M, 8 rows):
// the output projection (Q8_0, 49152 x 576) takes 11.2 ms in the GEMV vs 31.3 ms in
// oneDNN, a layer's four Q4_1 products 1.02 vs 1.10 ms; a decode step of 8
// sequences costs 6.8 ms of CPU per token with 8 here vs 7.4 with 4 (two passes).
constexpr int64_t kGemvMaxRows = 8;
// Up to this many query tokens attention reads the cache directly (decode).
constexpr int64_t kDecodeMaxQueries = 4;

struct CpuWeights final : PreparedWeights {
  cpu::DnnlWeightsPtr packed;
  std::vector<float> block_scales;  // Q4_0/Q4_1: cpu::extract_block_scales, for decode
};

// bf16 needs native bf16 dot products for attention and a oneDNN bf16 matmul.
bool bf16_supported(const cpu::CpuKernels& k) {
  return k.attention_bf16 && k.to_bf16 && cpu::onednn_bf16_matmul_available();
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const cpu::CpuKernels& kernels) : k_(kernels), bf16_(bf16_supported(kernels)) {}

  std::string name() const override { return "cpu"; }
  std::string kernel_id() const override { return std::string("cpu/") + cpu::isa_name(k_.isa); }
  double setup_seconds() const override { return cpu::onednn_primitive_creation_seconds(); }
  bool supports(Precision precision) const override { return precision == Precision::F32 || bf16_; }
  // The GEMV kernels compute rows independently, in the same order for any count.
  int64_t linear_exact_rows() const override { return kGemvMaxRows; }

  std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision precision) override {
    require(precision);
    if (w.in_features % 32 != 0)
      throw std::invalid_argument("cpu backend: in_features must be a multiple of 32 (got " +
                                  std::to_string(w.in_features) + ")");
    auto out = std::make_unique<CpuWeights>();
    out->view = w;
    out->packed = cpu::pack_for_gemm(w, precision);
    if (w.type == TensorType::Q4_0 || w.type == TensorType::Q4_1) {
      out->block_scales.resize(static_cast<size_t>(cpu::block_scales_count(w.out_features, w.in_features)));
      cpu::extract_block_scales(w.type, w.data, w.out_features, w.in_features, out->block_scales.data());
    }
    return out;
  }

  void linear(const PreparedWeights& pw, const float* x, float* y, int64_t n, const float* bias) override {
    const auto& w = static_cast<const CpuWeights&>(pw);
    if (n <= kGemvMaxRows)
      k_.gemv_quantized(w.view.type, w.view.data, w.block_scales.empty() ? nullptr : w.block_scales.data(), x, y,
                        n, w.view.in_features, w.view.out_features);
    else
      cpu::gemm(*w.packed, k_, x, y, n);
    if (bias) {
      const int64_t out = w.view.out_features;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < out; ++o) y[t * out + o] += bias[o];
    }
  }

  void embed(const WeightView& table, const int32_t* ids, float* out, int64_t n) override {
    const auto type = table.type;
    const int64_t row_bytes = type_row_bytes(type, table.in_features);
    for (int64_t t = 0; t < n; ++t)
      if (ids[t] < 0 || ids[t] >= table.out_features) throw std::out_of_range("embed: token id out of range");
#pragma omp parallel for schedule(static) if (n >= 64)
    for (int64_t t = 0; t < n; ++t)
      dequantize_row(type, static_cast<const uint8_t*>(table.data) + ids[t] * row_bytes,
                     out + t * table.in_features, table.in_features);
  }

  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override {
    k_.rmsnorm(x, weight, out, n, dim, eps);
  }

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const RopeTable& table) override {
    const int64_t half = table.head_dim / 2;
    std::vector<float> cos_sin(static_cast<size_t>(n * half * 2));
    fill_cos_sin(table, pos, n, cos_sin.data());
    k_.rope(x, cos_sin.data(), n, heads, table.head_dim, table.style);
  }

  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    k_.swiglu(gate_up, out, n, ff);
  }

  void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                 int64_t n_kv, float scale, Precision precision) override {
    require(precision);
    check_kv(kv, q_heads);
    if (n_kv > kv.capacity) throw std::out_of_range("cpu attention: n_kv beyond the cache");
    if (n <= kDecodeMaxQueries)
      k_.attention_decode(q, qpos, kv, out, n, q_heads, n_kv, scale);
    else if (precision == Precision::BF16 && kv.head_dim % 32 == 0)
      k_.attention_bf16(q, qpos, kv, out, n, q_heads, n_kv, scale);
    else
      k_.attention(q, qpos, kv, out, n, q_heads, n_kv, scale);
  }

  // One parallel loop over every row's heads (attention() per row would be one per row,
  // 9 heads over the threads each time); the rows are attention_decode's, n = 1.
  void attention_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n, int64_t q_heads,
                      float scale, Precision precision) override {
    require(precision);
    for (int64_t i = 0; i < n; ++i) {
      check_kv(kv[i], q_heads);
      if (kv[i].kv_heads != kv[0].kv_heads || kv[i].head_dim != kv[0].head_dim || kv[i].dtype != kv[0].dtype)
        throw std::invalid_argument("cpu attention_rows: the rows' caches differ in shape or dtype");
      if (qpos[i] < 0 || qpos[i] >= kv[i].capacity)
        throw std::out_of_range("cpu attention_rows: position outside the cache");
    }
    k_.attention_decode_rows(q, qpos, kv, out, n, q_heads, scale);
  }

 private:
  static void check_kv(const KvView& kv, int64_t q_heads) {
    if (kv.head_dim % 16 != 0 || kv.head_dim > 256)
      throw std::invalid_argument("cpu attention: head_dim must be a multiple of 16 and <= 256");
    if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
      throw std::invalid_argument("cpu attention: q_heads must be a multiple of kv_heads");
    if (!is_kv_dtype(kv.dtype)) throw std::invalid_argument("cpu attention: K/V must be F32, F16 or BF16");
  }

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

  void require(Precision precision) const {
    if (!supports(precision))
      throw std::invalid_argument(std::string("bf16 needs a CPU with AVX512-BF16 and a oneDNN bf16 matmul; this "
                                              "backend runs ") + kernel_id() + ": use f32");
  }

  const cpu::CpuKernels& k_;
  const bool bf16_;
  std::mutex rope_mu_;
  std::vector<float> rope_freqs_;
  std::vector<float> rope_cache_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>(cpu::kernels_for(cpu::selected_cpu_isa()));
}

std::unique_ptr<Backend> make_cpu_backend_for(cpu::CpuIsa isa) {
  if (isa > cpu::detect_cpu_isa())
    throw std::invalid_argument(std::string("this CPU cannot run the ") + cpu::isa_name(isa) + " kernels");
  return std::make_unique<CpuBackend>(cpu::kernels_for(isa));
}

const char* precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "f32"; }

Precision choose_precision(std::string_view name, const Backend& backend) {
  Precision p;
  if (name == "auto") return backend.default_precision();
  if (name == "bf16") p = Precision::BF16;
  else if (name == "f32") p = Precision::F32;
  else throw std::invalid_argument("precision '" + std::string(name) + "' is not one of auto, bf16, f32");
  if (!backend.supports(p))
    throw std::invalid_argument(std::string("precision ") + precision_name(p) + " is not supported by " +
                                backend.kernel_id() + " (bf16 needs AVX512-BF16); use auto or f32");
  return p;
}

namespace cpu {
void extract_block_scales(TensorType type, const void* w, int64_t rows, int64_t in_features, float* out) {
  const TensorTypeTraits& t = type_traits(type);
  const int64_t blocks = in_features / t.block_elements;
  const auto* p = static_cast<const uint8_t*>(w);
  std::fill_n(out, block_scales_count(rows, in_features), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b, p += t.block_bytes) {
      uint16_t h[2] = {0, 0};
      std::memcpy(h, p, type == TensorType::Q4_1 ? 4 : 2);
      float* at = out + ((r / 8) * blocks + b) * 16 + r % 8;
      at[0] = fp16_to_fp32(h[0]);
      at[8] = type == TensorType::Q4_1 ? fp16_to_fp32(h[1]) : 0.0f;
    }
}

int64_t block_scales_count(int64_t rows, int64_t in_features) { return (rows + 7) / 8 * (in_features / 32) * 16; }

const CpuKernels& kernels_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return isa_scalar::kKernels;
    case CpuIsa::Avx2: return isa_avx2::kKernels;
    case CpuIsa::Avx512: return isa_avx512::kKernels;
    case CpuIsa::Avx512Bf16: return isa_avx512bf16::kKernels;
  }
  throw std::invalid_argument("unknown CPU ISA");
}
}  // namespace cpu

int cpu_compute_threads() { return omp_get_max_threads(); }

}  // namespace bs::kernels
