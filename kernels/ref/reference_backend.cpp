// Scalar reference backend: the plainest correct implementation of every op,
// in fp32 with double accumulation where it matters. It is what the optimized
// backends are tested against, never what serves requests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dequant.h"
#include "kernels/op_math.h"

namespace bs::kernels {
namespace {

struct RefWeights final : PreparedWeights {
  std::vector<float> dense;  // [out_features, in_features]
};

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  bool supports(Precision) const override { return true; }  // computes fp32 either way
  int64_t linear_exact_rows() const override { return std::numeric_limits<int64_t>::max(); }  // one row at a time
  bool batch_invariant() const override { return true; }  // every op one row at a time

  std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision) override {
    auto out = std::make_unique<RefWeights>();
    out->view = w;
    out->dense.resize(static_cast<size_t>(w.out_features * w.in_features));
    const int64_t row_bytes = type_row_bytes(w.type, w.in_features);
    for (int64_t r = 0; r < w.out_features; ++r)
      dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * row_bytes,
                     out->dense.data() + r * w.in_features, w.in_features);
    return out;
  }

  void linear(const PreparedWeights& pw, const float* x, float* y, int64_t n, const float* bias) override {
    const auto& w = static_cast<const RefWeights&>(pw);
    const int64_t in = w.view.in_features, outf = w.view.out_features;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < outf; ++o) {
        double acc = bias ? bias[o] : 0.0;
        const float* wr = w.dense.data() + o * in;
        for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(wr[i]) * x[t * in + i];
        y[t * outf + o] = static_cast<float>(acc);
      }
  }

  void embed(const PreparedWeights& prepared, const int32_t* ids, float* out, int64_t n) override {
    const WeightView& table = prepared.view;
    const auto type = table.type;
    for (int64_t t = 0; t < n; ++t)
      if (ids[t] < 0 || ids[t] >= table.out_features) throw std::out_of_range("embed: token id out of range");
    const int64_t row_bytes = type_row_bytes(type, table.in_features);
    for (int64_t t = 0; t < n; ++t)
      dequantize_row(type, static_cast<const uint8_t*>(table.data) + ids[t] * row_bytes,
                     out + t * table.in_features, table.in_features);
  }

  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override {
    for (int64_t t = 0; t < n; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[t * dim + i]) * x[t * dim + i];
      const double scale = op_math::rms_inv<double>(ss, dim, eps);
      for (int64_t i = 0; i < dim; ++i)
        out[t * dim + i] = static_cast<float>(x[t * dim + i] * scale * weight[i]);
    }
  }

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& prepared) override {
    const RopeTable& table = prepared.table;
    const int64_t d = table.head_dim, half = d / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(pos[t]) * table.inv_freq[i];
          const double c = std::cos(angle), s = std::sin(angle);
          const int64_t a = table.style == RopeStyle::Interleaved ? 2 * i : i;
          const int64_t b = table.style == RopeStyle::Interleaved ? 2 * i + 1 : i + half;
          double y0, y1;
          op_math::rotate_pair<double>(v[a], v[b], c, s, y0, y1);
          v[a] = static_cast<float>(y0);
          v[b] = static_cast<float>(y1);
        }
      }
  }

  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < ff; ++i) {
        const double g = gate_up[t * 2 * ff + i], u = gate_up[t * 2 * ff + ff + i];
        out[t * ff + i] = static_cast<float>(op_math::silu_mul(g, u));
      }
  }

  void geglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < ff; ++i) {
        const double g = gate_up[t * 2 * ff + i], u = gate_up[t * 2 * ff + ff + i];
        out[t * ff + i] = static_cast<float>(op_math::gelu_tanh_mul(g, u));
      }
  }

  void scale(float* x, int64_t count, float s) override {
    for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(static_cast<double>(x[i]) * s);
  }

  void add(float* y, const float* x, int64_t count) override {
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
  }

  void split_qkv(const float* qkv, float* q, float* k, float* v, int64_t n, int64_t q_dim, int64_t kv_dim) override {
    const int64_t width = q_dim + 2 * kv_dim;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < q_dim; ++i) q[t * q_dim + i] = qkv[t * width + i];
      for (int64_t i = 0; i < kv_dim; ++i) k[t * kv_dim + i] = qkv[t * width + q_dim + i];
      for (int64_t i = 0; i < kv_dim; ++i) v[t * kv_dim + i] = qkv[t * width + q_dim + kv_dim + i];
    }
  }

  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t width) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < width; ++i) dst[t * width + i] = src[static_cast<int64_t>(rows[t]) * width + i];
  }

  void store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) override {
    check_positions(kv, pos, n, "store_kv");
    const int64_t hd = kv.head_dim;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < kv.kv_heads; ++h) {
        const int64_t at = kv.row_offset(h, pos[t]);
        const int64_t src = (t * kv.kv_heads + h) * hd;
        for (int64_t i = 0; i < hd; ++i) {
          store_element(kv.dtype, kv.k, at + i, k[src + i]);
          if (v) store_element(kv.dtype, kv.v, at + i, v[src + i]);
        }
      }
  }

  void kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                    KvDeviation which, double* out) override {
    check_positions(kv, pos, n, "kv_deviation");
    const int64_t hd = kv.head_dim;
    std::vector<float> kl(static_cast<size_t>(hd)), vl(static_cast<size_t>(hd));
    for (int64_t t = 0; t < n; ++t) {
      double dev = 0;
      for (int64_t h = 0; h < kv.kv_heads; ++h) {
        kv.read_k_row(h, pos[t], kl.data());
        kv.read_v_row(h, pos[t], vl.data());
        const float* kf = k + (t * kv.kv_heads + h) * hd;
        const float* vf = v + (t * kv.kv_heads + h) * hd;
        dev = op_math::add_row_deviation(dev, kf, kl.data(), vf, vl.data(), hd, which != KvDeviation::V,
                                         which != KvDeviation::K);
      }
      out[t] = dev;
    }
  }

  void top_k(const double* score, int64_t n, int64_t k, int32_t* out) override {
    if (k < 0 || k > n) throw std::invalid_argument("top_k: k must be in [0, n]");
    // k passes of a plain maximum search: the obvious order, nothing clever.
    std::vector<char> taken(static_cast<size_t>(n), 0);
    for (int64_t r = 0; r < k; ++r) {
      int64_t best = -1;
      for (int64_t i = 0; i < n; ++i)
        if (!taken[i] && (best < 0 || op_math::ranks_before(score[i], i, score[best], best))) best = i;
      taken[best] = 1;
      out[r] = static_cast<int32_t>(best);
    }
  }

  void rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta, const PreparedRope& rope_table) override {
    if (first < 0 || m < 0 || first + m > kv.capacity) throw std::out_of_range("rope_kv_rows: rows outside the cache");
    if (kv.head_dim != rope_table.table.head_dim) throw std::invalid_argument("rope_kv_rows: head_dim differs from the table");
    const int64_t hd = kv.head_dim;
    std::vector<float> row(static_cast<size_t>(hd));
    for (int64_t h = 0; h < kv.kv_heads; ++h)
      for (int64_t j = first; j < first + m; ++j) {
        kv.read_k_row(h, j, row.data());
        rope(row.data(), &delta, 1, 1, rope_table);
        const int64_t at = kv.row_offset(h, j);
        for (int64_t i = 0; i < hd; ++i) store_element(kv.dtype, kv.k, at + i, row[static_cast<size_t>(i)]);
      }
  }

  // The definition (backend.h): per query head, then per row, the plain loops.
  void attention_mass(const float* q, const int32_t* qpos, const KvView& kv, int64_t n, int64_t q_heads,
                      int64_t n_kv, float scale, double* out) override {
    if (n_kv < 0 || n_kv > kv.capacity) throw std::out_of_range("reference attention_mass: n_kv beyond the cache");
    if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
      throw std::invalid_argument("reference attention_mass: query heads not a multiple of KV heads");
    const int64_t hd = kv.head_dim, group = q_heads / kv.kv_heads;
    std::fill(out, out + n_kv, 0.0);
    std::vector<float> kr(static_cast<size_t>(hd)), e(static_cast<size_t>(n_kv));
    for (int64_t h = 0; h < q_heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t count = std::min<int64_t>(n_kv, int64_t{qpos[i]} + 1);
        const int64_t first = kv.first_visible(qpos[i]);
        if (count <= first) continue;
        const float* qv = q + (i * q_heads + h) * hd;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = first; j < count; ++j) {
          kv.read_k_row(h / group, j, kr.data());
          float s = 0.0f;
          for (int64_t d = 0; d < hd; ++d) s += qv[d] * kr[d];
          e[j] = s * scale;
          mx = std::max(mx, e[j]);
        }
        float sum = 0.0f;
        for (int64_t j = first; j < count; ++j) sum += (e[j] = std::exp(e[j] - mx));
        for (int64_t j = first; j < count; ++j) out[j] += static_cast<double>(e[j] / sum);
      }
  }

  void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                 int64_t n_kv, float scale, Precision) override {
    if (n_kv > kv.capacity) throw std::out_of_range("reference attention: n_kv beyond the cache");
    if (!is_kv_dtype(kv.dtype)) throw std::invalid_argument("reference attention: K/V must be F32, F16 or BF16");
    const int64_t head_dim = kv.head_dim, group = q_heads / kv.kv_heads;
    std::vector<double> scores(static_cast<size_t>(n_kv));
    // The rows of each KV head widened to fp32 once (half-precision KV is read as its
    // exact fp32 value, then everything is double).
    std::vector<float> kf(static_cast<size_t>(kv.kv_heads * n_kv * head_dim)), vf(kf.size());
    for (int64_t h = 0; h < kv.kv_heads; ++h)
      for (int64_t j = 0; j < n_kv; ++j) {
        kv.read_k_row(h, j, &kf[static_cast<size_t>((h * n_kv + j) * head_dim)]);
        kv.read_v_row(h, j, &vf[static_cast<size_t>((h * n_kv + j) * head_dim)]);
      }
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < q_heads; ++h) {
        const float* qv = q + (t * q_heads + h) * head_dim;
        const int64_t kvh = h / group;
        const int64_t last = std::min<int64_t>(n_kv - 1, qpos[t]);
        const int64_t first = kv.first_visible(qpos[t]);  // kv.window's first key
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j <= last; ++j) {
          const float* kr = &kf[static_cast<size_t>((kvh * n_kv + j) * head_dim)];
          double s = 0;
          for (int64_t i = 0; i < head_dim; ++i) s += static_cast<double>(qv[i]) * kr[i];
          scores[j] = s * scale;
          mx = std::max(mx, scores[j]);
        }
        double denom = 0;
        for (int64_t j = first; j <= last; ++j) denom += (scores[j] = std::exp(scores[j] - mx));
        float* o = out + (t * q_heads + h) * head_dim;
        for (int64_t i = 0; i < head_dim; ++i) {
          double acc = 0;
          for (int64_t j = first; j <= last; ++j) acc += scores[j] * vf[static_cast<size_t>((kvh * n_kv + j) * head_dim + i)];
          o[i] = last >= first ? static_cast<float>(acc / denom) : 0.0f;
        }
      }
  }

 private:
  static void check_positions(const KvView& kv, const int32_t* pos, int64_t n, const char* op) {
    for (int64_t t = 0; t < n; ++t)
      if (pos[t] < 0 || pos[t] >= kv.capacity)
        throw std::out_of_range(std::string(op) + ": position " + std::to_string(pos[t]) + " outside the KV cache");
  }
  // Element `at` of a K/V array of `dtype`, rounded from fp32 (round to nearest even).
  static void store_element(TensorType dtype, void* base, int64_t at, float x) {
    switch (dtype) {
      case TensorType::F16: static_cast<uint16_t*>(base)[at] = fp32_to_fp16(x); return;
      case TensorType::BF16: static_cast<uint16_t*>(base)[at] = fp32_to_bf16(x); return;
      default: static_cast<float*>(base)[at] = x;
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace bs::kernels
