// Scalar reference backend: the plainest correct implementation of every op,
// in fp32 with double accumulation where it matters. It is what the optimized
// backends are tested against, never what serves requests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dequant.h"

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

  void embed(const WeightView& table, const int32_t* ids, float* out, int64_t n) override {
    const auto type = table.type;
    const int64_t row_bytes = type_row_bytes(type, table.in_features);
    for (int64_t t = 0; t < n; ++t) {
      if (ids[t] < 0 || ids[t] >= table.out_features) throw std::out_of_range("embed: token id out of range");
      dequantize_row(type, static_cast<const uint8_t*>(table.data) + ids[t] * row_bytes,
                     out + t * table.in_features, table.in_features);
    }
  }

  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override {
    for (int64_t t = 0; t < n; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[t * dim + i]) * x[t * dim + i];
      const double scale = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
      for (int64_t i = 0; i < dim; ++i)
        out[t * dim + i] = static_cast<float>(x[t * dim + i] * scale * weight[i]);
    }
  }

  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const RopeTable& table) override {
    const int64_t d = table.head_dim, half = d / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(pos[t]) * table.inv_freq[i];
          const double c = std::cos(angle), s = std::sin(angle);
          const int64_t a = table.style == RopeStyle::Interleaved ? 2 * i : i;
          const int64_t b = table.style == RopeStyle::Interleaved ? 2 * i + 1 : i + half;
          const double x0 = v[a], x1 = v[b];
          v[a] = static_cast<float>(x0 * c - x1 * s);
          v[b] = static_cast<float>(x0 * s + x1 * c);
        }
      }
  }

  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < ff; ++i) {
        const double g = gate_up[t * 2 * ff + i], u = gate_up[t * 2 * ff + ff + i];
        out[t * ff + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
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
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= last; ++j) {
          const float* kr = &kf[static_cast<size_t>((kvh * n_kv + j) * head_dim)];
          double s = 0;
          for (int64_t i = 0; i < head_dim; ++i) s += static_cast<double>(qv[i]) * kr[i];
          scores[j] = s * scale;
          mx = std::max(mx, scores[j]);
        }
        double denom = 0;
        for (int64_t j = 0; j <= last; ++j) denom += (scores[j] = std::exp(scores[j] - mx));
        float* o = out + (t * q_heads + h) * head_dim;
        for (int64_t i = 0; i < head_dim; ++i) {
          double acc = 0;
          for (int64_t j = 0; j <= last; ++j) acc += scores[j] * vf[static_cast<size_t>((kvh * n_kv + j) * head_dim + i)];
          o[i] = last >= 0 ? static_cast<float>(acc / denom) : 0.0f;
        }
      }
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace bs::kernels
