// The CPU backend: the kernel variant of one ISA (kernels/cpu/kernel_table.h) for the
// element-wise ops, attention and decode products, oneDNN for prefill GEMMs (batch-
// invariant: the decode products and attention for every row count).
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <stdexcept>
#include <vector>

#include "kernels/activation_quant.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm_onednn.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/dequant.h"
#include "kernels/op_math.h"

namespace bs::kernels {
namespace {

// Up to this many rows a product reads the stored weights directly (one pass of the
// GEMV kernel, which takes 8 rows per pass); above it, the oneDNN GEMM
// (kernels/cpu/gemm_onednn.h), or with batch_invariant the GEMV 8 rows a pass. A
// batched decode step (Transformer::decode_step) needs the GEMV, whose rows are
// exactly the one-token products. Measured on one AVX2 core (SmolLM2-135M, 8 rows):
// the output projection (Q8_0, 49152 x 576) takes 11.2 ms in the GEMV vs 31.3 ms in
// oneDNN, a layer's four Q4_1 products 1.02 vs 1.10 ms; a decode step of 8
// sequences costs 6.8 ms of CPU per token with 8 here vs 7.4 with 4 (two passes).
constexpr int64_t kGemvMaxRows = 8;
// Up to this many query tokens (any number with batch_invariant) attention reads the
// cache directly (decode).
constexpr int64_t kDecodeMaxQueries = 4;

// A prepared weight reads the file's rows in place: one part per fused matrix (query,
// key, value; gate, up), each writing its columns of the output. Nothing is copied.
struct CpuPart {
  WeightView view;
  int64_t col0 = 0;  // its first output column
};
struct CpuWeights final : PreparedWeights {
  std::vector<CpuPart> parts;
  std::vector<WeightView> views;         // the parts' views, for the prefill GEMM
  Precision precision = Precision::F32;  // of the prefill GEMMs
};

// A RoPE table with its (cos, sin) per position and frequency, cached for non-negative
// positions as they are first asked for: computing them is as costly as the rotation.
struct CpuRope final : PreparedRope {
  std::mutex mu;
  std::vector<float> cos_sin;  // [positions cached, head_dim / 2, 2]

  // (cos, sin) of each of n positions into dst [n, head_dim / 2, 2].
  void fill(const int32_t* pos, int64_t n, float* dst) {
    const int64_t half = table.head_dim / 2;
    std::lock_guard<std::mutex> lock(mu);
    int32_t max_pos = -1;
    for (int64_t t = 0; t < n; ++t) max_pos = std::max(max_pos, pos[t]);
    const int64_t have = static_cast<int64_t>(cos_sin.size()) / (half * 2);
    if (max_pos >= have) {
      const int64_t want = std::max<int64_t>(max_pos + 1, have * 2);
      cos_sin.resize(static_cast<size_t>(want * half * 2));
      for (int64_t p = have; p < want; ++p) compute(static_cast<double>(p), &cos_sin[p * half * 2]);
    }
    for (int64_t t = 0; t < n; ++t) {
      if (pos[t] >= 0)
        std::copy_n(&cos_sin[pos[t] * half * 2], half * 2, dst + t * half * 2);
      else
        compute(static_cast<double>(pos[t]), dst + t * half * 2);
    }
  }
  void compute(double p, float* dst) const {
    for (int64_t i = 0; i < table.head_dim / 2; ++i) {
      const double a = p * table.inv_freq[i];
      dst[2 * i] = static_cast<float>(std::cos(a));
      dst[2 * i + 1] = static_cast<float>(std::sin(a));
    }
  }
};

// The ops' staging vectors, the calling thread's, grown as needed; release_scratch
// frees them.
struct ThreadScratch {
  std::vector<uint16_t> bf16_x;      // linear: the activations as bf16, [n, in]
  std::vector<float> part_out;       // gemv_part: one part's columns, [n, out]
  std::vector<float> rope_cos_sin;   // rope: [n, head_dim/2, 2]
  std::vector<int32_t> top_k_ids;    // top_k: [n]
  std::vector<float> kv_cos_sin;     // rope_kv_rows: [rows of a page run, head_dim]
  std::vector<float> kv_rows;        // rope_kv_rows: [rows of a page run, head_dim]
};
thread_local ThreadScratch thread_scratch;

// bf16 needs native bf16 dot products for attention and a oneDNN bf16 matmul.
bool bf16_supported(const cpu::CpuKernels& k) {
  return k.attention_bf16 && k.to_bf16 && cpu::onednn_bf16_matmul_available();
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const cpu::CpuKernels& kernels, DecodeActivations decode, bool batch_invariant)
      : k_(kernels), bf16_(!batch_invariant && bf16_supported(kernels)),
        int8_decode_(decode == DecodeActivations::Int8 && kernels.gemv_int8 != nullptr),
        batch_invariant_(batch_invariant) {}

  std::string name() const override { return "cpu"; }
  std::string kernel_id() const override {
    return std::string("cpu/") + cpu::isa_name(k_.isa) + (int8_decode_ ? "+int8" : "") +
           (batch_invariant_ ? "+batch-invariant" : "");
  }
  double setup_seconds() const override { return cpu::onednn_primitive_creation_seconds(); }
  void release_scratch() override {
    thread_scratch = ThreadScratch{};
    cpu::release_gemm_thread_buffers();
    Backend::release_scratch();  // last: it gives the freed heap back
  }
  bool supports(Precision precision) const override { return precision == Precision::F32 || bf16_; }
  // The GEMV kernels compute rows independently, in the same order for any count.
  int64_t linear_exact_rows() const override { return kGemvMaxRows; }
  // The GEMV for every row count (kGemvMaxRows rows a pass) and attention_decode for
  // every query count: both compute each row alone.
  bool batch_invariant() const override { return batch_invariant_; }

  std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision precision) override {
    return prepare_fused({w}, precision);
  }

  // Each part stays a view of the file (Backend::prepare_fused says why).
  std::unique_ptr<PreparedWeights> prepare_fused(const std::vector<WeightView>& parts, Precision precision) override {
    require(precision);
    if (parts.empty()) throw std::invalid_argument("cpu backend: prepare_fused without parts");
    auto out = std::make_unique<CpuWeights>();
    const int64_t in = parts[0].in_features;
    int64_t col = 0;
    for (const auto& w : parts) {
      if (w.in_features % 32 != 0)
        throw std::invalid_argument("cpu backend: in_features must be a multiple of 32 (got " +
                                    std::to_string(w.in_features) + ")");
      if (w.in_features != in) throw std::invalid_argument("cpu backend: fused parts of different in_features");
      auto& part = out->parts.emplace_back();
      part.view = w;
      out->views.push_back(w);
      part.col0 = col;
      col += w.out_features;
    }
    // The whole matrix's shape; its rows are in `parts` (data is not one array).
    out->view = WeightView{parts[0].type, parts.size() == 1 ? parts[0].data : nullptr, col, in};
    out->precision = precision;
    return out;
  }

  void linear(const PreparedWeights& pw, const float* x, float* y, int64_t n, const float* bias) override {
    const auto& w = static_cast<const CpuWeights&>(pw);
    const int64_t in = w.view.in_features, out = w.view.out_features;
    if (n <= kGemvMaxRows) {
      for (const auto& part : w.parts) gemv_part(part, x, y, n, out);
    } else if (batch_invariant_) {
      for (int64_t t0 = 0; t0 < n; t0 += kGemvMaxRows) {
        const int64_t m = std::min(kGemvMaxRows, n - t0);
        for (const auto& part : w.parts) gemv_part(part, x + t0 * in, y + t0 * out, m, out);
      }
    } else {
      // The activations in the GEMM's precision once, for every part.
      const void* xs = x;
      auto& xb = thread_scratch.bf16_x;
      if (w.precision == Precision::BF16) {
        xb.resize(static_cast<size_t>(n * in));
        k_.to_bf16(x, xb.data(), n * in);
        xs = xb.data();
      }
      cpu::gemm_stored(k_, w.views, w.precision, xs, y, n);
    }
    if (bias) {
      for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < out; ++o) y[t * out + o] += bias[o];
    }
  }

  // A decode-size product of one part into its columns of y [n, ldy]: straight into y
  // where the part spans the row or there is one row, else through a small buffer.
  void gemv_part(const CpuPart& part, const float* x, float* y, int64_t n, int64_t ldy) {
    const auto& v = part.view;
    auto run = [&](float* dst) {
      if (int8_decode_ && has_int8_decode_product(v.type))
        k_.gemv_int8(v.type, v.data, x, dst, n, v.in_features, v.out_features);
      else
        k_.gemv_quantized(v.type, v.data, x, dst, n, v.in_features, v.out_features);
    };
    if (n == 1 || v.out_features == ldy) {
      run(y + part.col0);
      return;
    }
    auto& tmp = thread_scratch.part_out;
    tmp.resize(static_cast<size_t>(n * v.out_features));
    run(tmp.data());
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(tmp.data() + t * v.out_features, v.out_features, y + t * ldy + part.col0);
  }

  std::unique_ptr<PreparedRope> prepare_rope(const RopeTable& table) override {
    Backend::prepare_rope(table);  // validates
    auto out = std::make_unique<CpuRope>();
    out->table = table;
    return out;
  }

  void embed(const PreparedWeights& prepared, const int32_t* ids, float* out, int64_t n) override {
    const WeightView& table = prepared.view;
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

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& prepared) override {
    auto& rope = cpu_rope(prepared);
    const int64_t half = rope.table.head_dim / 2;
    auto& cos_sin = thread_scratch.rope_cos_sin;
    cos_sin.resize(static_cast<size_t>(n * half * 2));
    rope.fill(pos, n, cos_sin.data());
    k_.rope(x, cos_sin.data(), n, heads, rope.table.head_dim, rope.table.style);
  }

  void add(float* y, const float* x, int64_t count) override {
    // No `simd` clause: the compilers vectorize this loop themselves, and clang warns
    // (-Wpass-failed) when a sanitizer build keeps it from honouring the clause.
#pragma omp parallel for schedule(static) if (count >= (1 << 16))
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
  }

  void split_qkv(const float* qkv, float* q, float* k, float* v, int64_t n, int64_t q_dim, int64_t kv_dim) override {
    const int64_t width = q_dim + 2 * kv_dim;
#pragma omp parallel for schedule(static) if (n >= 256)
    for (int64_t t = 0; t < n; ++t) {
      const float* row = qkv + t * width;
      std::memcpy(q + t * q_dim, row, static_cast<size_t>(q_dim) * sizeof(float));
      std::memcpy(k + t * kv_dim, row + q_dim, static_cast<size_t>(kv_dim) * sizeof(float));
      std::memcpy(v + t * kv_dim, row + q_dim + kv_dim, static_cast<size_t>(kv_dim) * sizeof(float));
    }
  }

  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t width) override {
#pragma omp parallel for schedule(static) if (n * width >= (1 << 16))
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(dst + t * width, src + static_cast<int64_t>(rows[t]) * width,
                  static_cast<size_t>(width) * sizeof(float));
  }

  void store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) override {
    check_positions(kv, pos, n, "store_kv");
    const int64_t hd = kv.head_dim, eb = kv_dtype_bytes(kv.dtype);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < kv.kv_heads; ++h) {
        const int64_t at = kv.row_offset(h, pos[t]) * eb;
        const int64_t src = (t * kv.kv_heads + h) * hd;
        kv_from_fp32(kv.dtype, k + src, static_cast<std::byte*>(kv.k) + at, hd);
        if (v) kv_from_fp32(kv.dtype, v + src, static_cast<std::byte*>(kv.v) + at, hd);
      }
  }

  // The reference's order of summation (heads, then elements, K before V), so the
  // scores and with them the blend's selection are the reference's exactly.
  void kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                    KvDeviation which, double* out) override {
    check_positions(kv, pos, n, "kv_deviation");
    const int64_t hd = kv.head_dim, eb = kv_dtype_bytes(kv.dtype);
#pragma omp parallel if (n >= 64)
    {
      std::vector<float> kl(static_cast<size_t>(hd)), vl(static_cast<size_t>(hd));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < n; ++t) {
        double dev = 0;
        for (int64_t h = 0; h < kv.kv_heads; ++h) {
          const int64_t at = kv.row_offset(h, pos[t]) * eb;
          kv_to_fp32(kv.dtype, static_cast<const std::byte*>(kv.k) + at, kl.data(), hd);
          kv_to_fp32(kv.dtype, static_cast<const std::byte*>(kv.v) + at, vl.data(), hd);
          const float* kf = k + (t * kv.kv_heads + h) * hd;
          const float* vf = v + (t * kv.kv_heads + h) * hd;
          dev = op_math::add_row_deviation(dev, kf, kl.data(), vf, vl.data(), hd, which != KvDeviation::V,
                                           which != KvDeviation::K);
        }
        out[t] = dev;
      }
    }
  }

  // Three parallel phases per KV head: its K widened and transposed once
  // ([head_dim, n_kv]); each (head, row)'s exps and their sum by the variant's
  // softmax_exps (vector FMAs across keys and a vector exp: within fp32 rounding of
  // the reference, not its bits); then the weights added per key in double, in the
  // reference's (head, row) order, by threads that own runs of keys. Rows go in blocks
  // whose exps fit kMassBlockBytes, so a long question does not hold
  // n * q_heads * n_kv floats.
  void attention_mass(const float* q, const int32_t* qpos, const KvView& kv, int64_t n, int64_t q_heads,
                      int64_t n_kv, float scale, double* out) override {
    if (n_kv < 0 || n_kv > kv.capacity) throw std::out_of_range("attention_mass: n_kv beyond the cache");
    if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
      throw std::invalid_argument("attention_mass: query heads not a multiple of KV heads");
    std::fill(out, out + n_kv, 0.0);
    if (n <= 0 || n_kv == 0) return;
    constexpr int64_t kMassBlockBytes = int64_t{16} << 20;
    const int64_t hd = kv.head_dim, group = q_heads / kv.kv_heads, eb = kv_dtype_bytes(kv.dtype);
    const int64_t block = std::max<int64_t>(1, kMassBlockBytes / (n_kv * static_cast<int64_t>(sizeof(float))));
    std::vector<float> kt(static_cast<size_t>(hd * n_kv));
    std::vector<float> e;
    std::vector<float> sums;
    std::vector<int64_t> counts, firsts;
    for (int64_t g = 0; g < kv.kv_heads; ++g) {
#pragma omp parallel if (n_kv >= 256)
      {
        std::vector<float> row(static_cast<size_t>(hd));
#pragma omp for schedule(static)
        for (int64_t j = 0; j < n_kv; ++j) {
          kv_to_fp32(kv.dtype, static_cast<const std::byte*>(kv.k) + kv.row_offset(g, j) * eb, row.data(), hd);
          for (int64_t d = 0; d < hd; ++d) kt[static_cast<size_t>(d * n_kv + j)] = row[static_cast<size_t>(d)];
        }
      }
      // This KV head's (query head, row) pairs in the reference's order: heads
      // g * group .. (g + 1) * group - 1 outer, rows inner.
      const int64_t pairs = group * n;
      for (int64_t first = 0; first < pairs; first += block) {
        const int64_t m = std::min(block, pairs - first);
        e.resize(static_cast<size_t>(m * n_kv));
        sums.assign(static_cast<size_t>(m), 0.0f);
        counts.assign(static_cast<size_t>(m), 0);
        firsts.assign(static_cast<size_t>(m), 0);
#pragma omp parallel for schedule(dynamic, 1) if (m * n_kv >= (1 << 14))
        for (int64_t b = 0; b < m; ++b) {
          const int64_t h = g * group + (first + b) / n, i = (first + b) % n;
          const int64_t count = std::min<int64_t>(n_kv, int64_t{qpos[i]} + 1);
          const int64_t lo = kv.first_visible(qpos[i]);  // kv.window's first key
          counts[static_cast<size_t>(b)] = count;
          firsts[static_cast<size_t>(b)] = lo;
          if (count <= lo) continue;
          sums[static_cast<size_t>(b)] = k_.softmax_exps(q + (i * q_heads + h) * hd, kt.data() + lo, n_kv, hd,
                                                         count - lo, scale, e.data() + b * n_kv + lo);
        }
#pragma omp parallel for schedule(static) if (m * n_kv >= (1 << 14))
        for (int64_t j = 0; j < n_kv; ++j) {
          double acc = out[j];
          for (int64_t b = 0; b < m; ++b)
            if (j < counts[static_cast<size_t>(b)] && j >= firsts[static_cast<size_t>(b)])
              acc += static_cast<double>(e[static_cast<size_t>(b * n_kv + j)] / sums[static_cast<size_t>(b)]);
          out[j] = acc;
        }
      }
    }
  }

  void top_k(const double* score, int64_t n, int64_t k, int32_t* out) override {
    if (k < 0 || k > n) throw std::invalid_argument("top_k: k must be in [0, n]");
    auto& idx = thread_scratch.top_k_ids;
    idx.resize(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const auto above = [score](int32_t a, int32_t b) {
      const double x = score[a], y = score[b];
      if (std::isnan(x) != std::isnan(y)) return std::isnan(y);  // numbers above NaN
      if (!std::isnan(x) && x != y) return x > y;
      return a < b;
    };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), above);
    std::copy_n(idx.begin(), k, out);
  }

  // Per KV head and per run of rows in one page (consecutive in memory): widened to
  // fp32, rotated by the rope kernel at the same (cos, sin) for every row, rounded back.
  void rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta, const PreparedRope& prepared) override {
    if (first < 0 || m < 0 || first + m > kv.capacity) throw std::out_of_range("rope_kv_rows: rows outside the cache");
    auto& rope = cpu_rope(prepared);
    const int64_t hd = kv.head_dim, eb = kv_dtype_bytes(kv.dtype);
    if (hd != rope.table.head_dim) throw std::invalid_argument("rope_kv_rows: head_dim differs from the table");
    if (m == 0) return;
    const int64_t run_max = std::min(m, kv.page_positions());
    auto& cos_sin = thread_scratch.kv_cos_sin;
    auto& rows = thread_scratch.kv_rows;
    cos_sin.resize(static_cast<size_t>(run_max * hd));
    rope.fill(&delta, 1, cos_sin.data());
    for (int64_t r = 1; r < run_max; ++r) std::copy_n(cos_sin.data(), hd, cos_sin.data() + r * hd);
    rows.resize(static_cast<size_t>(run_max * hd));
    const int64_t page = kv.page_positions();
    for (int64_t h = 0; h < kv.kv_heads; ++h)
      for (int64_t at = first; at < first + m;) {
        const int64_t count = std::min(first + m, (at / page + 1) * page) - at;
        std::byte* base = static_cast<std::byte*>(kv.k) + kv.row_offset(h, at) * eb;
        kv_to_fp32(kv.dtype, base, rows.data(), count * hd);
        k_.rope(rows.data(), cos_sin.data(), count, 1, hd, rope.table.style);
        kv_from_fp32(kv.dtype, rows.data(), base, count * hd);
        at += count;
      }
  }

  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    k_.swiglu(gate_up, out, n, ff);
  }

  void geglu(const float* gate_up, float* out, int64_t n, int64_t ff) override { k_.geglu(gate_up, out, n, ff); }

  void scale(float* x, int64_t count, float s) override {
#pragma omp parallel for schedule(static) if (count >= (1 << 16))
    for (int64_t i = 0; i < count; ++i) x[i] *= s;
  }

  void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                 int64_t n_kv, float scale, Precision precision) override {
    require(precision);
    check_kv(kv, q_heads);
    if (n_kv > kv.capacity) throw std::out_of_range("cpu attention: n_kv beyond the cache");
    if (n <= kDecodeMaxQueries || batch_invariant_)
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

  static CpuRope& cpu_rope(const PreparedRope& prepared) {
    auto* rope = dynamic_cast<const CpuRope*>(&prepared);
    if (!rope) throw std::invalid_argument("cpu backend: a RoPE table prepared by another backend");
    return const_cast<CpuRope&>(*rope);  // its cache grows under its own mutex
  }
  static void check_positions(const KvView& kv, const int32_t* pos, int64_t n, const char* op) {
    for (int64_t t = 0; t < n; ++t)
      if (pos[t] < 0 || pos[t] >= kv.capacity)
        throw std::out_of_range(std::string(op) + ": position " + std::to_string(pos[t]) + " outside the KV cache");
  }

  void require(Precision precision) const {
    if (supports(precision)) return;
    if (batch_invariant_)
      throw std::invalid_argument("bf16 products are the prefill GEMM's, which are not batch-invariant; this backend "
                                  "runs " + kernel_id() + ": use f32");
    throw std::invalid_argument(std::string("bf16 needs a CPU with AVX512-BF16 and a oneDNN bf16 matmul; this "
                                            "backend runs ") + kernel_id() + ": use f32");
  }

  const cpu::CpuKernels& k_;
  const bool bf16_;
  // Decode products of block types through the int8-activation kernel (asked for, and
  // present in this variant).
  const bool int8_decode_;
  const bool batch_invariant_;  // Backend::batch_invariant()
};

}  // namespace

const char* decode_activations_name(DecodeActivations d) { return d == DecodeActivations::Int8 ? "int8" : "exact"; }

bool decode_activations_from_name(std::string_view name, DecodeActivations& d) {
  if (name == "exact") d = DecodeActivations::Exact;
  else if (name == "int8") d = DecodeActivations::Int8;
  else return false;
  return true;
}

DecodeActivations default_decode_activations() {
  const char* env = std::getenv("BLENDSERVE_DECODE_ACTIVATIONS");
  if (!env || !*env) return kDefaultDecodeActivations;
  DecodeActivations d;
  if (!decode_activations_from_name(env, d))
    throw std::invalid_argument(std::string("BLENDSERVE_DECODE_ACTIVATIONS='") + env + "' is not exact or int8");
  return d;
}

std::unique_ptr<Backend> make_cpu_backend() { return make_cpu_backend(default_decode_activations()); }

std::unique_ptr<Backend> make_cpu_backend(DecodeActivations decode, bool batch_invariant) {
  return std::make_unique<CpuBackend>(cpu::kernels_for(cpu::selected_cpu_isa()), decode, batch_invariant);
}

std::unique_ptr<Backend> make_cpu_backend_for(cpu::CpuIsa isa, DecodeActivations decode, bool batch_invariant) {
  if (isa > cpu::detect_cpu_isa())
    throw std::invalid_argument(std::string("this CPU cannot run the ") + cpu::isa_name(isa) + " kernels");
  return std::make_unique<CpuBackend>(cpu::kernels_for(isa), decode, batch_invariant);
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
                                backend.kernel_id() + (backend.batch_invariant() ? " (batch-invariant: f32 only)"
                                                                                  : " (bf16 needs AVX512-BF16)") +
                                "; use auto or f32");
  return p;
}

namespace cpu {
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
