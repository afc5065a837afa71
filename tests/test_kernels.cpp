// Every op of every backend against the scalar reference, at model sizes and odd ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dequant.h"

namespace bs::kernels {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |a-b| / (max |b| + eps): a scale-aware error measure for whole outputs
double rel_max_err(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, mag = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(b[i])));
  }
  return err / mag;
}

// Quantize fp32 rows into Q4_1 blocks (the ggml encoding) for test weights.
std::vector<uint8_t> quantize_q4_1(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols / 32 * 20));
  uint8_t* p = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b, p += 20) {
      const float* x = &w[r * cols + b * 32];
      float mn = x[0], mx = x[0];
      for (int i = 0; i < 32; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
      const float d = (mx - mn) / 15.0f;
      const uint16_t dh = fp32_to_fp16(d), mh = fp32_to_fp16(mn);
      std::memcpy(p, &dh, 2);
      std::memcpy(p + 2, &mh, 2);
      const float id = d > 0 ? 1.0f / d : 0.0f;
      for (int i = 0; i < 16; ++i) {
        const int lo = std::min(15, static_cast<int>(std::lround((x[i] - mn) * id)));
        const int hi = std::min(15, static_cast<int>(std::lround((x[i + 16] - mn) * id)));
        p[4 + i] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  return out;
}

std::vector<uint8_t> quantize_q8_0(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols / 32 * 34));
  uint8_t* p = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b, p += 34) {
      const float* x = &w[r * cols + b * 32];
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f;
      const uint16_t dh = fp32_to_fp16(d);
      std::memcpy(p, &dh, 2);
      for (int i = 0; i < 32; ++i) p[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(d > 0 ? x[i] / d : 0)));
    }
  return out;
}

class BackendOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> ref = make_reference_backend();
  std::unique_ptr<Backend> cpu = make_cpu_backend();
};

TEST_F(BackendOps, RmsnormMatchesReference) {
  for (int64_t dim : {576, 17, 64, 1000}) {
    const int64_t n = 7;
    auto x = random_vec(n * dim, 1), w = random_vec(dim, 2);
    std::vector<float> a(n * dim), b(n * dim);
    cpu->rmsnorm(x.data(), w.data(), a.data(), n, dim, 1e-5f);
    ref->rmsnorm(x.data(), w.data(), b.data(), n, dim, 1e-5f);
    EXPECT_LT(rel_max_err(a, b), 1e-6) << "dim " << dim;
  }
}

TEST_F(BackendOps, SwigluMatchesReference) {
  for (int64_t ff : {1536, 33, 16}) {
    const int64_t n = 5;
    auto gu = random_vec(n * 2 * ff, 3, 4.0f);
    gu[0] = -100.0f;  // saturating inputs
    gu[1] = 100.0f;
    std::vector<float> a(n * ff), b(n * ff);
    cpu->swiglu(gu.data(), a.data(), n, ff);
    ref->swiglu(gu.data(), b.data(), n, ff);
    EXPECT_LT(rel_max_err(a, b), 1e-6) << "ff " << ff;
  }
}

TEST_F(BackendOps, RopeMatchesReferenceBothStyles) {
  for (auto style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
    RopeTable t;
    t.style = style;
    t.head_dim = 64;
    for (int i = 0; i < 32; ++i) t.inv_freq.push_back(static_cast<float>(std::pow(100000.0, -2.0 * i / 64)));
    const int64_t n = 9, heads = 3;
    std::vector<int32_t> pos = {0, 1, 2, 17, 100, 4095, 8000, -5, 3};
    auto x = random_vec(n * heads * 64, 4);
    auto a = x, b = x;
    cpu->rope(a.data(), pos.data(), n, heads, t);
    ref->rope(b.data(), pos.data(), n, heads, t);
    EXPECT_LT(rel_max_err(a, b), 2e-6);
    // rotating back by -p restores the input (composition law behind delta-RoPE)
    std::vector<int32_t> neg(pos.size());
    for (size_t i = 0; i < pos.size(); ++i) neg[i] = -pos[i];
    cpu->rope(a.data(), neg.data(), n, heads, t);
    EXPECT_LT(rel_max_err(a, x), 1e-5);
  }
}

TEST_F(BackendOps, AttentionMatchesReference) {
  struct Case { int64_t n, q_heads, kv_heads, head_dim, n_kv; bool prefill; };
  for (auto c : {Case{1, 9, 3, 64, 1, true}, Case{37, 9, 3, 64, 37, true}, Case{130, 9, 3, 64, 130, true},
                 Case{1, 9, 3, 64, 300, false}, Case{5, 4, 4, 32, 71, false}, Case{3, 8, 2, 128, 200, false},
                 Case{4, 9, 3, 64, 1000, false}, Case{2, 2, 1, 256, 17, false}}) {
    const int64_t stride = c.n_kv + 11;  // cache capacity larger than the filled part
    auto q = random_vec(c.n * c.q_heads * c.head_dim, 5);
    auto k = random_vec(c.kv_heads * stride * c.head_dim, 6);
    auto v = random_vec(c.kv_heads * stride * c.head_dim, 7);
    std::vector<int32_t> pos(c.n);
    for (int64_t i = 0; i < c.n; ++i)
      pos[i] = static_cast<int32_t>(c.prefill ? i : c.n_kv - c.n + i);
    if (!c.prefill && c.n > 2) pos[0] = 3;  // a query far back: sees only 4 keys
    std::vector<float> a(c.n * c.q_heads * c.head_dim), b(a.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    ref->attention(q.data(), pos.data(), k.data(), v.data(), b.data(), c.n, c.q_heads, c.kv_heads, c.head_dim,
                   c.n_kv, stride, scale, Precision::F32);
    cpu->attention(q.data(), pos.data(), k.data(), v.data(), a.data(), c.n, c.q_heads, c.kv_heads, c.head_dim,
                   c.n_kv, stride, scale, Precision::F32);
    EXPECT_LT(rel_max_err(a, b), 1e-5) << "fp32 n " << c.n << " n_kv " << c.n_kv << " hd " << c.head_dim;
    // bf16 inputs: ~3 significant digits per product, errors average out over keys
    cpu->attention(q.data(), pos.data(), k.data(), v.data(), a.data(), c.n, c.q_heads, c.kv_heads, c.head_dim,
                   c.n_kv, stride, scale, Precision::BF16);
    EXPECT_LT(rel_max_err(a, b), 2e-2) << "bf16 n " << c.n << " n_kv " << c.n_kv << " hd " << c.head_dim;
  }
}

TEST_F(BackendOps, LinearQuantizedMatchesReference) {
  struct Case { WeightType type; int64_t out, in; };
  for (auto c : {Case{WeightType::Q4_1, 96, 576}, Case{WeightType::Q8_0, 70, 64}, Case{WeightType::F32, 33, 96}}) {
    auto wf = random_vec(c.out * c.in, 8, 0.05f);
    std::vector<uint8_t> raw;
    if (c.type == WeightType::Q4_1) raw = quantize_q4_1(wf, c.out, c.in);
    else if (c.type == WeightType::Q8_0) raw = quantize_q8_0(wf, c.out, c.in);
    else raw.assign(reinterpret_cast<uint8_t*>(wf.data()), reinterpret_cast<uint8_t*>(wf.data() + wf.size()));
    WeightView view{c.type, raw.data(), c.out, c.in};
    auto bias = random_vec(c.out, 10);
    for (auto prec : {Precision::F32, Precision::BF16}) {
      auto pc = cpu->prepare(view, prec);
      auto pr = ref->prepare(view, prec);
      for (int64_t n : {1, 3, 4, 5, 64, 129}) {  // GEMV sizes and GEMM sizes
        auto x = random_vec(n * c.in, 9);
        std::vector<float> a(n * c.out), b(n * c.out);
        cpu->linear(*pc, x.data(), a.data(), n, bias.data());
        ref->linear(*pr, x.data(), b.data(), n, bias.data());
        // bf16 GEMM rounds activations and weights to 8 mantissa bits
        const double tol = (prec == Precision::BF16 && n > 4) ? 2e-2 : 1e-5;
        EXPECT_LT(rel_max_err(a, b), tol) << "type " << static_cast<int>(c.type) << " n " << n;
      }
    }
  }
}

TEST_F(BackendOps, EmbedMatchesReferenceAndRejectsBadIds) {
  auto wf = random_vec(100 * 64, 11);
  auto raw = quantize_q8_0(wf, 100, 64);
  WeightView view{WeightType::Q8_0, raw.data(), 100, 64};
  std::vector<int32_t> ids = {0, 99, 42, 42};
  std::vector<float> a(4 * 64), b(4 * 64);
  cpu->embed(view, ids.data(), a.data(), 4);
  ref->embed(view, ids.data(), b.data(), 4);
  EXPECT_EQ(a, b);
  std::vector<int32_t> bad = {100};
  EXPECT_THROW(cpu->embed(view, bad.data(), a.data(), 1), std::out_of_range);
}

}  // namespace
}  // namespace bs::kernels
