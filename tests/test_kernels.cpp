// Every op of every CPU kernel variant (scalar, avx2, avx512, avx512bf16) against the
// scalar reference, at model sizes and odd ones. A variant this CPU cannot execute is
// skipped (and shows as "Not Run" in ctest), never passed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/activation_quant.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/dequant.h"
#include "paged_kv.h"
#include "random_data.h"

namespace bs::kernels {
namespace {

using cpu::CpuIsa;

using test::random_vec;
using test::rel_max_err;

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

std::vector<uint8_t> quantize_q4_0(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols / 32 * 18));
  uint8_t* p = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b, p += 18) {
      const float* x = &w[r * cols + b * 32];
      float amax = 0, mx = 0;
      for (int i = 0; i < 32; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), mx = x[i];
      const float d = mx / -8.0f;
      const uint16_t dh = fp32_to_fp16(d);
      std::memcpy(p, &dh, 2);
      const float id = d != 0 ? 1.0f / d : 0.0f;
      for (int i = 0; i < 16; ++i) {
        const int lo = std::min(15, static_cast<int>(x[i] * id + 8.5f));
        const int hi = std::min(15, static_cast<int>(x[i + 16] * id + 8.5f));
        p[2 + i] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  return out;
}

// Random stored blocks of the types without a test quantizer here (Q5_0, Q5_1 and the
// K-quants; test::random_blocks), or nothing for another type.
std::vector<uint8_t> random_typed_blocks(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  const auto& t = type_traits(type);
  switch (type) {
    case TensorType::Q5_0: case TensorType::Q4_K: case TensorType::Q5_K:
      return test::random_blocks(rows, cols, t.block_elements, t.block_bytes,
                                 type == TensorType::Q5_0 ? std::vector<int>{0} : std::vector<int>{0, 2}, seed);
    case TensorType::Q5_1: return test::random_blocks(rows, cols, 32, t.block_bytes, {0, 2}, seed);
    case TensorType::Q6_K: return test::random_blocks(rows, cols, 256, t.block_bytes, {208}, seed);
    default: return {};
  }
}

// Plain 16-bit encodings of fp32 weights.
std::vector<uint8_t> encode_16bit(const std::vector<float>& w, uint16_t (*conv)(float)) {
  std::vector<uint8_t> out(w.size() * 2);
  for (size_t i = 0; i < w.size(); ++i) {
    const uint16_t h = conv(w[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
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

// One CPU backend per kernel variant, against the reference.
class BackendOps : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (GetParam() > cpu::detect_cpu_isa())
      GTEST_SKIP() << "this CPU cannot execute the " << cpu::isa_name(GetParam()) << " kernels";
    cpu = make_cpu_backend_for(GetParam());
  }
  std::unique_ptr<Backend> ref = make_reference_backend();
  std::unique_ptr<Backend> cpu;
};

TEST_P(BackendOps, RmsnormMatchesReference) {
  for (int64_t dim : {576, 17, 64, 1000}) {
    const int64_t n = 7;
    auto x = random_vec(n * dim, 1), w = random_vec(dim, 2);
    std::vector<float> a(n * dim), b(n * dim);
    cpu->rmsnorm(x.data(), w.data(), a.data(), n, dim, 1e-5f);
    ref->rmsnorm(x.data(), w.data(), b.data(), n, dim, 1e-5f);
    EXPECT_LT(rel_max_err(a, b), 1e-6) << "dim " << dim;
  }
}

TEST_P(BackendOps, SwigluMatchesReference) {
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

TEST_P(BackendOps, RopeMatchesReferenceBothStyles) {
  for (auto style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
    RopeTable t;
    t.style = style;
    t.head_dim = 64;
    for (int i = 0; i < 32; ++i) t.inv_freq.push_back(static_cast<float>(std::pow(100000.0, -2.0 * i / 64)));
    const int64_t n = 9, heads = 3;
    std::vector<int32_t> pos = {0, 1, 2, 17, 100, 4095, 8000, -5, 3};
    auto x = random_vec(n * heads * 64, 4);
    auto a = x, b = x;
    const auto cpu_t = cpu->prepare_rope(t), ref_t = ref->prepare_rope(t);
    cpu->rope(a.data(), pos.data(), n, heads, *cpu_t);
    ref->rope(b.data(), pos.data(), n, heads, *ref_t);
    EXPECT_LT(rel_max_err(a, b), 2e-6);
    // rotating back by -p restores the input (composition law behind delta-RoPE)
    std::vector<int32_t> neg(pos.size());
    for (size_t i = 0; i < pos.size(); ++i) neg[i] = -pos[i];
    cpu->rope(a.data(), neg.data(), n, heads, *cpu_t);
    EXPECT_LT(rel_max_err(a, x), 1e-5);
  }
}

TEST_P(BackendOps, AttentionMatchesReference) {
  struct Case { int64_t n, q_heads, kv_heads, head_dim, n_kv; bool prefill; };
  for (auto c : {Case{1, 9, 3, 64, 1, true}, Case{37, 9, 3, 64, 37, true}, Case{130, 9, 3, 64, 130, true},
                 Case{1, 9, 3, 64, 300, false}, Case{5, 4, 4, 32, 71, false}, Case{3, 8, 2, 128, 200, false},
                 Case{4, 9, 3, 64, 1000, false}, Case{2, 2, 1, 256, 17, false}}) {
    const int64_t stride = c.n_kv + 11;  // cache capacity larger than the filled part
    auto q = random_vec(c.n * c.q_heads * c.head_dim, 5);
    auto k = random_vec(c.kv_heads * stride * c.head_dim, 6);
    auto v = random_vec(c.kv_heads * stride * c.head_dim, 7);
    const auto kv = KvView::contiguous(k.data(), v.data(), c.kv_heads, stride, c.head_dim);
    std::vector<int32_t> pos(c.n);
    for (int64_t i = 0; i < c.n; ++i)
      pos[i] = static_cast<int32_t>(c.prefill ? i : c.n_kv - c.n + i);
    if (!c.prefill && c.n > 2) pos[0] = 3;  // a query far back: sees only 4 keys
    std::vector<float> a(c.n * c.q_heads * c.head_dim), b(a.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    ref->attention(q.data(), pos.data(), kv, b.data(), c.n, c.q_heads, c.n_kv, scale, Precision::F32);
    cpu->attention(q.data(), pos.data(), kv, a.data(), c.n, c.q_heads, c.n_kv, scale, Precision::F32);
    EXPECT_LT(rel_max_err(a, b), 1e-5) << "fp32 n " << c.n << " n_kv " << c.n_kv << " hd " << c.head_dim;
    if (!cpu->supports(Precision::BF16)) {
      EXPECT_THROW(cpu->attention(q.data(), pos.data(), kv, a.data(), c.n, c.q_heads, c.n_kv, scale, Precision::BF16),
                   std::invalid_argument);
      continue;
    }
    // bf16 inputs: ~3 significant digits per product, errors average out over keys
    cpu->attention(q.data(), pos.data(), kv, a.data(), c.n, c.q_heads, c.n_kv, scale, Precision::BF16);
    EXPECT_LT(rel_max_err(a, b), 2e-2) << "bf16 n " << c.n << " n_kv " << c.n_kv << " hd " << c.head_dim;
  }
}

// Attention cases over a cache of n_kv rows, queries at `pos`: every kernel path
// (fp32 tiled, bf16 tiled, decode-size), a blend-style selection of queries.
struct PagedCase {
  const char* what;
  int64_t q_heads, kv_heads, head_dim, n_kv;
  std::vector<int32_t> pos;
};
std::vector<PagedCase> paged_attention_cases() {
  std::vector<PagedCase> cases;
  std::vector<int32_t> all(150);
  std::iota(all.begin(), all.end(), 0);
  cases.push_back({"prefill of 150", 9, 3, 64, 150, all});
  cases.push_back({"prefill of 150, group 1, head_dim 128", 2, 2, 128, 150, all});
  std::vector<int32_t> sel;
  for (int32_t p = 2; p < 200; p += 7) sel.push_back(p);
  sel.push_back(199);
  cases.push_back({"selected queries", 9, 3, 64, 200, sel});
  cases.push_back({"decode, 2 queries", 9, 3, 64, 131, {129, 130}});
  return cases;
}

// Paged attention is the contiguous attention of the same backend, bit for bit: the
// kernels read the same rows in the same order wherever their pages lie. Pages of
// 1 to 128 positions in shuffled pool order, unused NaN pages among them, a partial
// last page; prefill (every kernel path: fp32 tiled, bf16 tiled, decode-size), a
// blend-style selection of queries, and batched decode rows over caches paged
// differently.
TEST_P(BackendOps, PagedAttentionEqualsContiguous) {
  const std::vector<PagedCase> cases = paged_attention_cases();
  for (Backend* backend : {ref.get(), cpu.get()}) {
    auto& be = *backend;
    for (const Precision prec : {Precision::F32, Precision::BF16}) {
      if (!be.supports(prec)) continue;
      for (const auto& c : cases) {
        const int64_t n = static_cast<int64_t>(c.pos.size()), stride = c.n_kv;
        auto q = random_vec(n * c.q_heads * c.head_dim, 21);
        auto k = random_vec(c.kv_heads * stride * c.head_dim, 22);
        auto v = random_vec(c.kv_heads * stride * c.head_dim, 23);
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
        std::vector<float> want(q.size());
        be.attention(q.data(), c.pos.data(), KvView::contiguous(k.data(), v.data(), c.kv_heads, stride, c.head_dim),
                     want.data(), n, c.q_heads, c.n_kv, scale, prec);
        for (int shift : {0, 2, 4, 5, 6, 7}) {
          auto paged = test::make_paged(k, v, c.kv_heads, stride, c.head_dim, c.n_kv, shift, 31 + shift);
          std::vector<float> got(q.size(), NAN);
          be.attention(q.data(), c.pos.data(), paged.view, got.data(), n, c.q_heads, c.n_kv, scale, prec);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << be.name() << " " << precision_name(prec) << ", " << c.what << ", pages of " << (1 << shift);
        }
      }
    }
    // Batched decode: each row over its own cache, paged its own way, equals that row alone.
    const int64_t q_heads = 9, kv_heads = 3, hd = 64;
    const std::vector<int64_t> lengths = {1, 64, 65, 300};
    const std::vector<int> shifts = {0, 6, 4, 7};
    std::vector<std::vector<float>> ks, vs;
    std::vector<test::PagedKv> paged;
    for (size_t i = 0; i < lengths.size(); ++i) {
      ks.push_back(random_vec(kv_heads * lengths[i] * hd, 40 + static_cast<uint32_t>(i)));
      vs.push_back(random_vec(kv_heads * lengths[i] * hd, 50 + static_cast<uint32_t>(i)));
    }
    paged.reserve(lengths.size());
    std::vector<KvView> views;
    std::vector<int32_t> qpos;
    for (size_t i = 0; i < lengths.size(); ++i) {
      paged.push_back(test::make_paged(ks[i], vs[i], kv_heads, lengths[i], hd, lengths[i], shifts[i], 60 + i));
      views.push_back(paged.back().view);
      qpos.push_back(static_cast<int32_t>(lengths[i] - 1));
    }
    const int64_t B = static_cast<int64_t>(lengths.size());
    auto q = random_vec(B * q_heads * hd, 70);
    const float scale = 0.125f;
    std::vector<float> rows(q.size(), NAN);
    be.attention_rows(q.data(), qpos.data(), views.data(), rows.data(), B, q_heads, scale, Precision::F32);
    for (int64_t i = 0; i < B; ++i) {
      std::vector<float> alone(static_cast<size_t>(q_heads * hd));
      be.attention(q.data() + i * q_heads * hd, &qpos[i],
                   KvView::contiguous(ks[i].data(), vs[i].data(), kv_heads, lengths[i], hd), alone.data(), 1, q_heads,
                   lengths[i], scale, Precision::F32);
      EXPECT_EQ(0, std::memcmp(alone.data(), rows.data() + i * q_heads * hd, alone.size() * sizeof(float)))
          << be.name() << " attention_rows row " << i;
    }
  }
}

// Half-precision KV (f16, bf16): attention over such a cache is attention over the
// same values widened to fp32, bit for bit (every kernel widens each element exactly
// and then does the fp32 arithmetic; the bf16 path rounds them to bf16 either way),
// paged in shuffled order or not: prefill (tiled fp32 and bf16 paths), selected
// queries, decode-size queries and batched decode rows. And it stays within the
// rounding of the values from attention over the unrounded fp32 K/V.
TEST_P(BackendOps, HalfPrecisionKvIsAttentionOverItsWidenedValues) {
  std::vector<PagedCase> cases = paged_attention_cases();
  cases.push_back({"decode, 1 query, head_dim 48", 4, 2, 48, 77, {76}});
  for (Backend* backend : {ref.get(), cpu.get()}) {
    auto& be = *backend;
    for (const TensorType dtype : {TensorType::F16, TensorType::BF16}) {
      for (const Precision prec : {Precision::F32, Precision::BF16}) {
        if (!be.supports(prec)) continue;
        for (const auto& c : cases) {
          if (prec == Precision::BF16 && c.head_dim % 32 != 0) continue;
          const int64_t n = static_cast<int64_t>(c.pos.size()), stride = c.n_kv;
          auto q = random_vec(n * c.q_heads * c.head_dim, 81);
          auto k = random_vec(c.kv_heads * stride * c.head_dim, 82);
          auto v = random_vec(c.kv_heads * stride * c.head_dim, 83);
          const auto kw = test::as_stored(k, dtype), vw = test::as_stored(v, dtype);
          const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
          std::vector<float> want(q.size()), exact(q.size());
          be.attention(q.data(), c.pos.data(), KvView::contiguous(kw.data(), vw.data(), c.kv_heads, stride, c.head_dim),
                       want.data(), n, c.q_heads, c.n_kv, scale, prec);
          ref->attention(q.data(), c.pos.data(), KvView::contiguous(k.data(), v.data(), c.kv_heads, stride, c.head_dim),
                         exact.data(), n, c.q_heads, c.n_kv, scale, Precision::F32);
          const std::string what = be.name() + " " + precision_name(prec) + " " + kv_dtype_name(dtype) + ", " + c.what;
          // bf16 keeps 8 significant bits, f16 11: the outputs move by about that much.
          EXPECT_LT(rel_max_err(want, exact), dtype == TensorType::BF16 || prec == Precision::BF16 ? 3e-2 : 4e-3)
              << what;
          for (int shift : {0, 4, 6, 7}) {
            auto paged = test::make_paged(k, v, c.kv_heads, stride, c.head_dim, c.n_kv, shift, 91 + shift, 3, dtype);
            std::vector<float> got(q.size(), NAN);
            be.attention(q.data(), c.pos.data(), paged.view, got.data(), n, c.q_heads, c.n_kv, scale, prec);
            EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                << what << ", pages of " << (1 << shift);
          }
        }
      }
      // Batched decode rows over half-precision caches, each paged its own way.
      const int64_t q_heads = 9, kv_heads = 3, hd = 64;
      const std::vector<int64_t> lengths = {1, 65, 300};
      std::vector<test::PagedKv> paged;
      std::vector<std::vector<float>> kws, vws;
      std::vector<KvView> views;
      std::vector<int32_t> qpos;
      paged.reserve(lengths.size());
      for (size_t i = 0; i < lengths.size(); ++i) {
        const auto k = random_vec(kv_heads * lengths[i] * hd, 100 + static_cast<uint32_t>(i));
        const auto v = random_vec(kv_heads * lengths[i] * hd, 110 + static_cast<uint32_t>(i));
        kws.push_back(test::as_stored(k, dtype));
        vws.push_back(test::as_stored(v, dtype));
        paged.push_back(test::make_paged(k, v, kv_heads, lengths[i], hd, lengths[i], static_cast<int>(2 * i + 2),
                                         120 + static_cast<uint32_t>(i), 3, dtype));
        views.push_back(paged.back().view);
        qpos.push_back(static_cast<int32_t>(lengths[i] - 1));
      }
      const int64_t B = static_cast<int64_t>(lengths.size());
      auto q = random_vec(B * q_heads * hd, 130);
      std::vector<float> rows(q.size(), NAN);
      be.attention_rows(q.data(), qpos.data(), views.data(), rows.data(), B, q_heads, 0.125f, Precision::F32);
      for (int64_t i = 0; i < B; ++i) {
        std::vector<float> alone(static_cast<size_t>(q_heads * hd));
        be.attention(q.data() + i * q_heads * hd, &qpos[i],
                     KvView::contiguous(kws[i].data(), vws[i].data(), kv_heads, lengths[i], hd), alone.data(), 1,
                     q_heads, lengths[i], 0.125f, Precision::F32);
        EXPECT_EQ(0, std::memcmp(alone.data(), rows.data() + i * q_heads * hd, alone.size() * sizeof(float)))
            << be.name() << " " << kv_dtype_name(dtype) << " attention_rows row " << i;
      }
      // Rows of one call must share a dtype.
      if (backend == cpu.get()) {
        views[1].dtype = dtype == TensorType::F16 ? TensorType::BF16 : TensorType::F16;
        EXPECT_THROW(be.attention_rows(q.data(), qpos.data(), views.data(), rows.data(), B, q_heads, 0.125f,
                                       Precision::F32),
                     std::invalid_argument);
      }
    }
  }
}

// The KV element conversions equal the scalar ones bit for bit (rounding to nearest
// even, subnormals, overflow to inf, NaN), with and without F16C, at odd lengths.
TEST(KvElements, RowConversionsEqualTheScalarOnes) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6.1e-5f, 5.96e-8f, 1e-9f,
                          3.14159265f, 1.00048828125f, 1.0009765625f, INFINITY, -INFINITY, NAN};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-300.0f, 300.0f);
  for (int i = 0; i < 1000; ++i) x.push_back(u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20));
  for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, x.size()}) {
      std::vector<uint16_t> half(n);
      std::vector<float> full(n), back(n);
      void* dst = dtype == TensorType::F32 ? static_cast<void*>(full.data()) : static_cast<void*>(half.data());
      kv_from_fp32(dtype, x.data(), dst, static_cast<int64_t>(n));
      kv_to_fp32(dtype, dst, back.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        if (dtype == TensorType::F32) {
          ASSERT_EQ(0, std::memcmp(&back[i], &x[i], sizeof(float)));
          continue;
        }
        const uint16_t want = dtype == TensorType::F16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
        ASSERT_EQ(half[i], want) << kv_dtype_name(dtype) << " of " << x[i];
        const float wide = dtype == TensorType::F16 ? fp16_to_fp32(want) : bf16_to_fp32(want);
        ASSERT_EQ(0, std::memcmp(&back[i], &wide, sizeof(float))) << kv_dtype_name(dtype) << " of " << x[i];
      }
    }
  }
  EXPECT_THROW(kv_from_fp32(TensorType::Q8_0, x.data(), x.data(), 1), std::invalid_argument);
}

TEST_P(BackendOps, LinearQuantizedMatchesReference) {
  struct Case { TensorType type; int64_t out, in; };
  for (auto c : {Case{TensorType::Q4_1, 96, 576}, Case{TensorType::Q4_0, 40, 96}, Case{TensorType::Q8_0, 70, 64},
                 Case{TensorType::F32, 33, 96}, Case{TensorType::F16, 17, 64}, Case{TensorType::BF16, 19, 128},
                 Case{TensorType::Q5_0, 41, 96}, Case{TensorType::Q5_1, 23, 640}, Case{TensorType::Q4_K, 37, 512},
                 Case{TensorType::Q5_K, 19, 256}, Case{TensorType::Q6_K, 29, 768}}) {
    auto wf = random_vec(c.out * c.in, 8, 0.05f);
    std::vector<uint8_t> raw;
    if (c.type == TensorType::Q4_1) raw = quantize_q4_1(wf, c.out, c.in);
    else if (c.type == TensorType::Q4_0) raw = quantize_q4_0(wf, c.out, c.in);
    else if (c.type == TensorType::Q8_0) raw = quantize_q8_0(wf, c.out, c.in);
    else if (c.type == TensorType::F16) raw = encode_16bit(wf, fp32_to_fp16);
    else if (c.type == TensorType::BF16) raw = encode_16bit(wf, fp32_to_bf16);
    else if (c.type != TensorType::F32) raw = random_typed_blocks(c.type, c.out, c.in, 77);
    else raw.assign(reinterpret_cast<uint8_t*>(wf.data()), reinterpret_cast<uint8_t*>(wf.data() + wf.size()));
    WeightView view{c.type, raw.data(), c.out, c.in};
    auto bias = random_vec(c.out, 10);
    for (auto prec : {Precision::F32, Precision::BF16}) {
      if (!cpu->supports(prec)) {
        EXPECT_THROW(cpu->prepare(view, prec), std::invalid_argument);
        continue;
      }
      auto pc = cpu->prepare(view, prec);
      auto pr = ref->prepare(view, prec);
      const int64_t gemv_rows = cpu->linear_exact_rows();  // up to here the GEMV, above it the GEMM
      for (int64_t n : {int64_t{1}, int64_t{3}, gemv_rows, gemv_rows + 1, int64_t{64}, int64_t{129}}) {
        auto x = random_vec(n * c.in, 9);
        std::vector<float> a(n * c.out), b(n * c.out);
        cpu->linear(*pc, x.data(), a.data(), n, bias.data());
        ref->linear(*pr, x.data(), b.data(), n, bias.data());
        // bf16 GEMM rounds activations and weights to 8 mantissa bits; from AVX2 up the
        // decode product of 4/5-bit weights rounds activations to int16 per block (2^-16
        // of the block's largest value, kernels/cpu/variant/gemv_quantized.cpp)
        const bool int16_activations =
            GetParam() != CpuIsa::Scalar && n <= gemv_rows && has_int16_decode_product(c.type);
        const double tol = (prec == Precision::BF16 && n > gemv_rows) ? 2e-2 : int16_activations ? 1e-4 : 1e-5;
        EXPECT_LT(rel_max_err(a, b), tol) << "type " << static_cast<int>(c.type) << " n " << n;
      }
    }
  }
}

// The variants' vectorized dequantization (the prefill GEMM's chunks) gives the
// baseline's values bit for bit, fp32 and bf16, for every block type; F32/F16/BF16 are
// left to the baseline (false, nothing written).
TEST(CpuDequantize, EveryVariantEqualsTheBaselineBitForBit) {
  const int64_t rows = 6, cols = 512;
  for (auto isa : cpu::kAllIsas) {
    if (isa > cpu::detect_cpu_isa()) continue;
    const auto& k = cpu::kernels_for(isa);
    for (auto type : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
                      TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
      std::vector<uint8_t> raw = random_typed_blocks(type, rows, cols, 91);
      if (type == TensorType::Q4_0) raw = quantize_q4_0(random_vec(rows * cols, 92, 0.05f), rows, cols);
      if (type == TensorType::Q4_1) raw = quantize_q4_1(random_vec(rows * cols, 93, 0.05f), rows, cols);
      if (type == TensorType::Q8_0) raw = quantize_q8_0(random_vec(rows * cols, 94, 0.05f), rows, cols);
      ASSERT_FALSE(raw.empty());
      const int64_t row_bytes = type_row_bytes(type, cols);
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* src = raw.data() + r * row_bytes;
        std::vector<float> want(cols), got(cols, -1.0f);
        std::vector<uint16_t> want16(cols), got16(cols, 1);
        dequantize_row(type, src, want.data(), cols);
        dequantize_row_to_bf16(type, src, want16.data(), cols);
        ASSERT_TRUE(k.dequantize_row(type, src, got.data(), cols, false));
        ASSERT_TRUE(k.dequantize_row(type, src, got16.data(), cols, true));
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), cols * sizeof(float)))
            << cpu::isa_name(isa) << " type " << static_cast<int>(type) << " row " << r;
        ASSERT_EQ(want16, got16) << cpu::isa_name(isa) << " type " << static_cast<int>(type) << " row " << r;
      }
    }
    float sink[32];
    EXPECT_FALSE(k.dequantize_row(TensorType::F16, sink, sink, 32, false));
  }
}

// A fused weight (the query, key and value rows; gate and up) of parts in different
// types, as a Q4_K_M file stores them, computes what their concatenation computes: the
// CPU backend reads each part in place and writes its columns, the default (the
// reference) concatenates them as F32 rows. Decode-size products of a part equal that
// part alone bit for bit (the GEMV computes rows independently); the GEMM is checked
// with a part taller than one dequantization chunk (kernels/cpu/gemm_onednn.cpp).
TEST_P(BackendOps, LinearFusedPartsEqualTheirConcatenation) {
  const int64_t in = 512;
  struct Part { TensorType type; int64_t out; };
  const std::vector<Part> parts{{TensorType::Q4_K, 37}, {TensorType::Q6_K, 1100}, {TensorType::Q4_1, 24},
                                {TensorType::Q8_0, 16}, {TensorType::BF16, 11}};
  std::vector<std::vector<uint8_t>> raw;
  std::vector<WeightView> views;
  int64_t out = 0;
  for (const auto& p : parts) {
    if (p.type == TensorType::BF16) raw.push_back(encode_16bit(random_vec(p.out * in, 31, 0.05f), fp32_to_bf16));
    else if (p.type == TensorType::Q4_1) raw.push_back(quantize_q4_1(random_vec(p.out * in, 32, 0.05f), p.out, in));
    else if (p.type == TensorType::Q8_0) raw.push_back(quantize_q8_0(random_vec(p.out * in, 33, 0.05f), p.out, in));
    else raw.push_back(random_typed_blocks(p.type, p.out, in, 34 + static_cast<int>(out)));
    views.push_back(WeightView{p.type, raw.back().data(), p.out, in});
    out += p.out;
  }
  auto bias = random_vec(out, 35);
  for (auto prec : {Precision::F32, Precision::BF16}) {
    if (!cpu->supports(prec)) continue;
    auto fused = cpu->prepare_fused(views, prec);
    ASSERT_EQ(fused->view.out_features, out);
    ASSERT_EQ(fused->view.in_features, in);
    auto reference = ref->prepare_fused(views, prec);
    std::vector<std::unique_ptr<PreparedWeights>> alone;
    for (const auto& v : views) alone.push_back(cpu->prepare(v, prec));
    const int64_t gemv_rows = cpu->linear_exact_rows();
    for (int64_t n : {int64_t{1}, int64_t{3}, gemv_rows, int64_t{40}}) {
      auto x = random_vec(n * in, 36);
      std::vector<float> a(n * out), b(n * out);
      cpu->linear(*fused, x.data(), a.data(), n, bias.data());
      ref->linear(*reference, x.data(), b.data(), n, bias.data());
      const bool int16_activations = GetParam() != CpuIsa::Scalar && n <= gemv_rows;  // its Q4_K and Q4_1 parts
      const double tol = (prec == Precision::BF16 && n > gemv_rows) ? 2e-2 : int16_activations ? 1e-4 : 1e-5;
      EXPECT_LT(rel_max_err(a, b), tol) << precision_name(prec) << " n " << n;
      if (n > gemv_rows) continue;
      int64_t col = 0;
      for (size_t i = 0; i < views.size(); ++i) {
        std::vector<float> part(n * views[i].out_features);
        cpu->linear(*alone[i], x.data(), part.data(), n, nullptr);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t o = 0; o < views[i].out_features; ++o)
            ASSERT_EQ(part[t * views[i].out_features + o] + bias[col + o], a[t * out + col + o])
                << "part " << i << " row " << t << " column " << o;
        col += views[i].out_features;
      }
    }
  }
  EXPECT_THROW(cpu->prepare_fused({}, Precision::F32), std::invalid_argument);
  EXPECT_THROW(cpu->prepare_fused({views[0], WeightView{TensorType::F32, raw[0].data(), 4, 256}}, Precision::F32),
               std::invalid_argument);
}

// Batched decode (Transformer::decode_step) relies on it: up to linear_exact_rows()
// rows, every row of a product is bit-identical to the product of that row alone.
TEST_P(BackendOps, LinearRowsAreExactAloneOrBatched) {
  const int64_t rows = cpu->linear_exact_rows();
  ASSERT_GE(rows, 8) << "decode batches of 8 should stay on the exact path";
  struct Case { TensorType type; int64_t out, in; };
  for (auto c : {Case{TensorType::Q4_1, 96, 576}, Case{TensorType::Q4_0, 40, 96}, Case{TensorType::Q8_0, 70, 576},
                 Case{TensorType::F32, 33, 96}, Case{TensorType::F16, 17, 64}, Case{TensorType::BF16, 19, 128},
                 Case{TensorType::Q5_0, 41, 96}, Case{TensorType::Q5_1, 23, 640}, Case{TensorType::Q4_K, 37, 512},
                 Case{TensorType::Q5_K, 19, 256}, Case{TensorType::Q6_K, 29, 768}}) {
    auto wf = random_vec(c.out * c.in, 12, 0.05f);
    std::vector<uint8_t> raw;
    if (c.type == TensorType::Q4_1) raw = quantize_q4_1(wf, c.out, c.in);
    else if (c.type == TensorType::Q4_0) raw = quantize_q4_0(wf, c.out, c.in);
    else if (c.type == TensorType::Q8_0) raw = quantize_q8_0(wf, c.out, c.in);
    else if (c.type == TensorType::F16) raw = encode_16bit(wf, fp32_to_fp16);
    else if (c.type == TensorType::BF16) raw = encode_16bit(wf, fp32_to_bf16);
    else if (c.type != TensorType::F32) raw = random_typed_blocks(c.type, c.out, c.in, 77);
    else raw.assign(reinterpret_cast<uint8_t*>(wf.data()), reinterpret_cast<uint8_t*>(wf.data() + wf.size()));
    WeightView view{c.type, raw.data(), c.out, c.in};
    auto pw = cpu->prepare(view, Precision::F32);
    auto x = random_vec(rows * c.in, 13);
    for (int64_t n = 2; n <= rows; ++n) {
      std::vector<float> batch(n * c.out);
      cpu->linear(*pw, x.data(), batch.data(), n, nullptr);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> alone(c.out);
        cpu->linear(*pw, x.data() + t * c.in, alone.data(), 1, nullptr);
        EXPECT_EQ(std::memcmp(alone.data(), batch.data() + t * c.out, c.out * sizeof(float)), 0)
            << "type " << static_cast<int>(c.type) << ": row " << t << " of " << n << " differs from the row alone";
      }
    }
  }
}

// model.batch_invariant: every row of a product and of attention is bit-identical to
// that row computed alone, for any row count (prefill sizes included, a fused product's
// parts too) and any KV dtype, so a prompt split anywhere computes the same KV and
// logits as one prefill. Up to linear_exact_rows() rows it is the default backend's
// product bit for bit (the same kernel); bf16 is refused by name.
TEST_P(BackendOps, BatchInvariantBackendComputesEveryRowAsItAlone) {
  auto inv = make_cpu_backend_for(GetParam(), DecodeActivations::Exact, /*batch_invariant=*/true);
  EXPECT_TRUE(inv->batch_invariant());
  EXPECT_FALSE(cpu->batch_invariant());
  EXPECT_EQ(inv->kernel_id(), cpu->kernel_id() + "+batch-invariant");
  EXPECT_FALSE(inv->supports(Precision::BF16));
  EXPECT_EQ(inv->default_precision(), Precision::F32);
  try {
    choose_precision("bf16", *inv);
    ADD_FAILURE() << "bf16 accepted by a batch-invariant backend";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("batch-invariant"), std::string::npos) << e.what();
  }
  struct Case { TensorType type; int64_t out, in; };
  const std::vector<int64_t> counts = {1, 3, 9, 17, 33};
  for (auto c : {Case{TensorType::Q4_1, 96, 576}, Case{TensorType::Q8_0, 70, 576}, Case{TensorType::F32, 33, 96},
                 Case{TensorType::BF16, 19, 128}, Case{TensorType::Q4_K, 37, 512}, Case{TensorType::Q6_K, 29, 768}}) {
    auto wf = random_vec(c.out * c.in, 31, 0.05f);
    std::vector<uint8_t> raw;
    if (c.type == TensorType::Q4_1) raw = quantize_q4_1(wf, c.out, c.in);
    else if (c.type == TensorType::Q8_0) raw = quantize_q8_0(wf, c.out, c.in);
    else if (c.type == TensorType::BF16) raw = encode_16bit(wf, fp32_to_bf16);
    else if (c.type != TensorType::F32) raw = random_typed_blocks(c.type, c.out, c.in, 33);
    else raw.assign(reinterpret_cast<uint8_t*>(wf.data()), reinterpret_cast<uint8_t*>(wf.data() + wf.size()));
    const WeightView view{c.type, raw.data(), c.out, c.in};
    // One matrix, and the same rows as a fused product of two parts (columns split).
    const int64_t first = c.out / 3;
    const int64_t row_bytes = static_cast<int64_t>(raw.size()) / c.out;
    const WeightView top{c.type, raw.data(), first, c.in}, rest{c.type, raw.data() + first * row_bytes,
                                                                 c.out - first, c.in};
    auto one = inv->prepare(view, Precision::F32);
    auto fused = inv->prepare_fused({top, rest}, Precision::F32);
    auto plain = cpu->prepare(view, Precision::F32);
    auto x = random_vec(counts.back() * c.in, 32);
    std::vector<float> alone(c.out * counts.back());
    for (int64_t t = 0; t < counts.back(); ++t)
      inv->linear(*one, x.data() + t * c.in, alone.data() + t * c.out, 1, nullptr);
    for (int64_t n : counts) {
      std::vector<float> batch(n * c.out), parts(n * c.out), base(n * c.out);
      inv->linear(*one, x.data(), batch.data(), n, nullptr);
      inv->linear(*fused, x.data(), parts.data(), n, nullptr);
      const std::string what = std::string(type_traits(c.type).name) + ", " + std::to_string(n) + " rows";
      EXPECT_EQ(0, std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float))) << what;
      EXPECT_EQ(0, std::memcmp(parts.data(), alone.data(), parts.size() * sizeof(float))) << what << ", fused";
      if (n <= cpu->linear_exact_rows()) {
        cpu->linear(*plain, x.data(), base.data(), n, nullptr);
        EXPECT_EQ(0, std::memcmp(base.data(), batch.data(), base.size() * sizeof(float))) << what << ", default";
      }
    }
  }
  // Attention: a prefill's rows (every query count, a sliding window too) are each that
  // query alone over the keys up to it, over f32 and f16 caches.
  const int64_t q_heads = 9, kv_heads = 3, hd = 64, n_kv = 70;
  for (const TensorType dtype : {TensorType::F32, TensorType::F16}) {
    for (const int64_t window : {int64_t{0}, int64_t{24}}) {
      auto k = random_vec(kv_heads * n_kv * hd, 34), v = random_vec(kv_heads * n_kv * hd, 35);
      const auto kw = test::as_stored(k, dtype), vw = test::as_stored(v, dtype);
      KvView kv = KvView::contiguous(kw.data(), vw.data(), kv_heads, n_kv, hd, dtype);
      kv.window = window;
      auto q = random_vec(n_kv * q_heads * hd, 36);
      const float scale = 0.125f;
      std::vector<int32_t> pos(n_kv);
      std::iota(pos.begin(), pos.end(), 0);
      std::vector<float> alone(q.size());
      for (int64_t t = 0; t < n_kv; ++t)
        inv->attention(q.data() + t * q_heads * hd, pos.data() + t, kv, alone.data() + t * q_heads * hd, 1, q_heads,
                       t + 1, scale, Precision::F32);
      for (const int64_t from : {int64_t{0}, int64_t{33}, int64_t{66}}) {  // rows [from, n_kv): a suffix's prefill
        const int64_t n = n_kv - from;
        std::vector<float> got(n * q_heads * hd, NAN);
        inv->attention(q.data() + from * q_heads * hd, pos.data() + from, kv, got.data(), n, q_heads, n_kv, scale,
                       Precision::F32);
        EXPECT_EQ(0, std::memcmp(got.data(), alone.data() + from * q_heads * hd, got.size() * sizeof(float)))
            << kv_dtype_name(dtype) << ", window " << window << ", rows from " << from;
      }
    }
  }
}

// DecodeActivations::Int8: where the variant has the int8 path (every variant but the
// scalar one) the decode-size products of every block type equal the scalar reference
// of that product (activations rounded by quantize_block_int8, exact integer block
// sums; the kernel differs only in rounding factor * scale to fp32 and summing blocks
// in fp32), their rows are bit-identical alone or batched, the path stays a close
// approximation of the exact product, and prefill-size products and F32/F16/BF16
// weights are the exact backend's bit for bit. In the scalar variant the setting
// changes nothing (and kernel_id says so).
TEST_P(BackendOps, Int8DecodeActivationsEqualTheirReference) {
  auto int8 = make_cpu_backend_for(GetParam(), DecodeActivations::Int8);
  const bool has_path = GetParam() != CpuIsa::Scalar;
  EXPECT_EQ(int8->kernel_id(), cpu->kernel_id() + (has_path ? "+int8" : ""));
  struct Case { TensorType type; int64_t out, in; };
  for (auto c : {Case{TensorType::Q4_0, 40, 96}, Case{TensorType::Q4_1, 96, 576}, Case{TensorType::Q4_1, 13, 64},
                 Case{TensorType::Q4_0, 70, 32}, Case{TensorType::Q8_0, 33, 64}, Case{TensorType::Q5_0, 21, 128},
                 Case{TensorType::Q5_1, 72, 96}, Case{TensorType::Q4_K, 19, 512}, Case{TensorType::Q5_K, 64, 256},
                 Case{TensorType::Q6_K, 27, 512}, Case{TensorType::F16, 16, 64}}) {
    auto wf = random_vec(c.out * c.in, 21, 0.05f);
    std::vector<uint8_t> raw = c.type == TensorType::Q4_1   ? quantize_q4_1(wf, c.out, c.in)
                               : c.type == TensorType::Q4_0 ? quantize_q4_0(wf, c.out, c.in)
                               : c.type == TensorType::Q8_0 ? quantize_q8_0(wf, c.out, c.in)
                               : c.type == TensorType::F16  ? encode_16bit(wf, fp32_to_fp16)
                                                            : random_typed_blocks(c.type, c.out, c.in, 23);
    ASSERT_FALSE(raw.empty());
    WeightView view{c.type, raw.data(), c.out, c.in};
    auto p8 = int8->prepare(view, Precision::F32);
    auto pe = cpu->prepare(view, Precision::F32);
    auto pr = ref->prepare(view, Precision::F32);
    const int64_t rows = int8->linear_exact_rows();
    auto x = random_vec((rows + 1) * c.in, 22);
    x[5] = 0.0f;  // an exact zero and a block of zeros (scale 1, q 0)
    std::fill_n(x.begin() + c.in, 32, 0.0f);
    for (int64_t n = 1; n <= rows + 1; ++n) {
      std::vector<float> a(n * c.out), exact(n * c.out), want(n * c.out);
      int8->linear(*p8, x.data(), a.data(), n, nullptr);
      cpu->linear(*pe, x.data(), exact.data(), n, nullptr);
      const std::string what = std::string(type_traits(c.type).name) + " n " + std::to_string(n);
      if (!has_path || !has_int8_decode_product(c.type) || n > rows) {
        EXPECT_EQ(std::memcmp(a.data(), exact.data(), a.size() * sizeof(float)), 0) << what;
        continue;
      }
      reference_gemv_rounded_activations(c.type, 8, raw.data(), x.data(), want.data(), n, c.in, c.out);
      EXPECT_LT(rel_max_err(a, want), 1e-5) << what;
      ref->linear(*pr, x.data(), exact.data(), n, nullptr);
      const double err = rel_max_err(a, exact);
      EXPECT_LT(err, 2e-2) << what;  // 8-bit activations: a few parts per thousand here
      EXPECT_GT(err, 1e-5) << what;  // and not the exact product by accident
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> alone(c.out);
        int8->linear(*p8, x.data() + t * c.in, alone.data(), 1, nullptr);
        EXPECT_EQ(std::memcmp(alone.data(), a.data() + t * c.out, c.out * sizeof(float)), 0)
            << what << ": row " << t << " differs from the row alone";
      }
    }
  }
}

// quantize (quantize_block_int8 or _int16) on a zero block (scale 1, all q 0) and on a
// block whose largest |x| is 4: scale 4 / qmax, that element at -qmax, halves rounded
// to even, every element within scale / 2.
template <class Q>
void check_block_rounding(float (*quantize)(const float*, Q*), float qmax) {
  float x[32];
  Q q[32];
  for (int i = 0; i < 32; ++i) x[i] = 0.0f;
  EXPECT_EQ(quantize(x, q), 1.0f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], 0);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.25f;  // max |x| = 4 at i = 0
  x[31] = 2.5f * 4.0f / qmax;  // x / scale = 2.5 (within fp32): rounds to 2
  x[30] = 3.5f * 4.0f / qmax;  // 3.5: rounds to 4
  const float scale = quantize(x, q);
  EXPECT_FLOAT_EQ(scale, 4.0f / qmax);
  EXPECT_EQ(q[0], -static_cast<int>(qmax));
  EXPECT_EQ(q[16], 0);
  EXPECT_EQ(q[31], 2);
  EXPECT_EQ(q[30], 4);
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(x[i] - scale * q[i]), scale / 2 * 1.0001f) << i;
}

TEST(ActivationQuant, Int8BlocksRoundToNearestEvenWithinPlusMinus127) {
  check_block_rounding(quantize_block_int8, 127.0f);
  const float x[32] = {};
  std::vector<float> y(1);
  EXPECT_THROW(reference_gemv_rounded_activations(TensorType::F16, 8, nullptr, x, y.data(), 1, 32, 1),
               std::invalid_argument);
  EXPECT_THROW(reference_gemv_rounded_activations(TensorType::Q4_K, 8, nullptr, x, y.data(), 1, 32, 1),
               std::invalid_argument);  // a K-quant row is whole super-blocks of 256
  EXPECT_THROW(reference_gemv_rounded_activations(TensorType::Q4_0, 4, nullptr, x, y.data(), 1, 32, 1),
               std::invalid_argument);  // 8 or 16 bits
  EXPECT_THROW(reference_gemv_rounded_activations(TensorType::Q8_0, 16, nullptr, x, y.data(), 1, 32, 1),
               std::invalid_argument);  // Q8_0 has no int16 product
}

// The reference's reading of every block type is the dequantizer's: with activations
// that round exactly (integers k times 2^-(bits - 1), a block's largest |k| 2^(bits - 1)
// - 1), the rounded product is the exact product of the dequantized weights.
TEST(ActivationQuant, TheReferenceReadsEveryBlockTypeAsItsDequantizer) {
  const int64_t out = 5, in = 512;
  for (int bits : {8, 16}) {
    const int kmax = (1 << (bits - 1)) - 1;
    std::vector<float> x(in);
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> k(-kmax, kmax);
    for (int64_t i = 0; i < in; ++i) x[i] = std::ldexp(static_cast<float>(i % 32 == 7 ? -kmax : k(rng)), 1 - bits);
    int checked = 0;
    for (TensorType type : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
                            TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
      ASSERT_TRUE(has_int8_decode_product(type));
      if (bits == 16 && !has_int16_decode_product(type)) continue;
      ++checked;
      std::vector<uint8_t> raw = type == TensorType::Q4_0   ? quantize_q4_0(random_vec(out * in, 3, 0.05f), out, in)
                                 : type == TensorType::Q4_1 ? quantize_q4_1(random_vec(out * in, 3, 0.05f), out, in)
                                 : type == TensorType::Q8_0 ? quantize_q8_0(random_vec(out * in, 3, 0.05f), out, in)
                                                            : random_typed_blocks(type, out, in, 29);
      std::vector<float> w(out * in), y(out);
      const int64_t row_bytes = type_row_bytes(type, in);
      for (int64_t o = 0; o < out; ++o) dequantize_row(type, raw.data() + o * row_bytes, w.data() + o * in, in);
      reference_gemv_rounded_activations(type, bits, raw.data(), x.data(), y.data(), 1, in, out);
      for (int64_t o = 0; o < out; ++o) {
        double want = 0.0, mag = 0.0;
        for (int64_t i = 0; i < in; ++i) {
          want += static_cast<double>(w[o * in + i]) * x[i];
          mag += std::fabs(static_cast<double>(w[o * in + i]) * x[i]);
        }
        EXPECT_NEAR(y[o], want, 1e-6 * mag + 1e-30) << bits << " bits, " << type_traits(type).name << " row " << o;
      }
    }
    EXPECT_EQ(checked, bits == 8 ? 8 : 4);
  }
  EXPECT_FALSE(has_int8_decode_product(TensorType::BF16));
  EXPECT_FALSE(has_int16_decode_product(TensorType::Q8_0));
  EXPECT_FALSE(has_int16_decode_product(TensorType::Q6_K));
  EXPECT_FALSE(has_int16_decode_product(TensorType::Q4_K));
}

TEST(ActivationQuant, Int16BlocksRoundToNearestEvenWithinPlusMinus32767) {
  check_block_rounding(quantize_block_int16, 32767.0f);
}

// The default decode product of the 4/5-bit types of 32-element blocks (from AVX2 up:
// int16 activations)
// equals its scalar reference within fp32 rounding, stays within 1e-4 of the exact
// product, and its rows are bit-identical alone or batched; the other types keep fp32
// activations (the scalar backend's product within 1e-5).
TEST_P(BackendOps, Int16DecodeActivationsEqualTheirReference) {
  const bool has_path = GetParam() != CpuIsa::Scalar;
  struct Case { TensorType type; int64_t out, in; };
  for (auto c : {Case{TensorType::Q4_0, 40, 96}, Case{TensorType::Q4_1, 96, 576}, Case{TensorType::Q5_0, 21, 128},
                 Case{TensorType::Q5_1, 72, 96}, Case{TensorType::Q4_K, 19, 512}, Case{TensorType::Q5_K, 64, 256},
                 Case{TensorType::Q8_0, 33, 64}, Case{TensorType::Q6_K, 27, 512}}) {
    auto wf = random_vec(c.out * c.in, 41, 0.05f);
    std::vector<uint8_t> raw = c.type == TensorType::Q4_1   ? quantize_q4_1(wf, c.out, c.in)
                               : c.type == TensorType::Q4_0 ? quantize_q4_0(wf, c.out, c.in)
                               : c.type == TensorType::Q8_0 ? quantize_q8_0(wf, c.out, c.in)
                                                            : random_typed_blocks(c.type, c.out, c.in, 43);
    WeightView view{c.type, raw.data(), c.out, c.in};
    auto pc = cpu->prepare(view, Precision::F32);
    auto pr = ref->prepare(view, Precision::F32);
    const int64_t rows = cpu->linear_exact_rows();
    auto x = random_vec(rows * c.in, 42);
    std::fill_n(x.begin() + c.in, 32, 0.0f);  // a block of zeros (scale 1, q 0)
    for (int64_t n = 1; n <= rows; ++n) {
      std::vector<float> a(n * c.out), exact(n * c.out), want(n * c.out);
      cpu->linear(*pc, x.data(), a.data(), n, nullptr);
      ref->linear(*pr, x.data(), exact.data(), n, nullptr);
      const std::string what = std::string(type_traits(c.type).name) + " n " + std::to_string(n);
      const double err = rel_max_err(a, exact);
      if (!has_path || !has_int16_decode_product(c.type)) {
        EXPECT_LT(err, 1e-5) << what;
        continue;
      }
      reference_gemv_rounded_activations(c.type, 16, raw.data(), x.data(), want.data(), n, c.in, c.out);
      EXPECT_LT(rel_max_err(a, want), 1e-5) << what;
      EXPECT_LT(err, 1e-4) << what;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> alone(c.out);
        cpu->linear(*pc, x.data() + t * c.in, alone.data(), 1, nullptr);
        EXPECT_EQ(std::memcmp(alone.data(), a.data() + t * c.out, c.out * sizeof(float)), 0)
            << what << ": row " << t << " differs from the row alone";
      }
    }
  }
}

TEST(DecodeActivations, NamesAndTheEnvironmentChoice) {
  DecodeActivations d;
  ASSERT_TRUE(decode_activations_from_name("int8", d));
  EXPECT_EQ(d, DecodeActivations::Int8);
  EXPECT_STREQ(decode_activations_name(d), "int8");
  ASSERT_TRUE(decode_activations_from_name("exact", d));
  EXPECT_EQ(d, DecodeActivations::Exact);
  EXPECT_FALSE(decode_activations_from_name("int4", d));
  const char* was = std::getenv("BLENDSERVE_DECODE_ACTIVATIONS");
  const std::string saved = was ? was : "";
  setenv("BLENDSERVE_DECODE_ACTIVATIONS", "int8", 1);
  EXPECT_EQ(default_decode_activations(), DecodeActivations::Int8);
  setenv("BLENDSERVE_DECODE_ACTIVATIONS", "fast", 1);
  EXPECT_THROW(default_decode_activations(), std::invalid_argument);
  unsetenv("BLENDSERVE_DECODE_ACTIVATIONS");
  EXPECT_EQ(default_decode_activations(), kDefaultDecodeActivations);
  if (was) setenv("BLENDSERVE_DECODE_ACTIVATIONS", saved.c_str(), 1);
}

TEST_P(BackendOps, EmbedMatchesReferenceAndRejectsBadIds) {
  auto wf = random_vec(100 * 64, 11);
  auto raw = quantize_q8_0(wf, 100, 64);
  WeightView view{TensorType::Q8_0, raw.data(), 100, 64};
  const auto cpu_table = cpu->prepare_embedding(view), ref_table = ref->prepare_embedding(view);
  std::vector<int32_t> ids = {0, 99, 42, 42};
  std::vector<float> a(4 * 64), b(4 * 64);
  cpu->embed(*cpu_table, ids.data(), a.data(), 4);
  ref->embed(*ref_table, ids.data(), b.data(), 4);
  EXPECT_EQ(a, b);
  for (Backend* be : {cpu.get(), ref.get()}) {
    const auto table = be->prepare_embedding(view);
    std::vector<float> untouched(2 * 64, 7.0f);
    for (std::vector<int32_t> bad : {std::vector<int32_t>{100}, std::vector<int32_t>{3, -1}}) {
      EXPECT_THROW(be->embed(*table, bad.data(), untouched.data(), static_cast<int64_t>(bad.size())),
                   std::out_of_range)
          << be->name();
      EXPECT_EQ(untouched, std::vector<float>(2 * 64, 7.0f)) << be->name() << ": written before the check";
    }
  }
}

// ---- Backend memory and the ops that replaced host loops (issue 18) ----

// Buffers, copies, streams/events and workspaces behave the same on every backend:
// bytes go in and come back unchanged, a workspace slot keeps its memory until it must
// grow, and each thread has its own.
TEST_P(BackendOps, MemoryCopiesStreamsAndWorkspaces) {
  for (Backend* backend : {ref.get(), cpu.get()}) {
    auto& be = *backend;
    EXPECT_TRUE(be.host_accessible()) << be.name();
    DeviceBuffer empty = be.alloc(0);
    EXPECT_TRUE(empty) << "a zero-byte buffer is still a valid handle";
    const auto data = random_vec(1001, 7);
    const int64_t bytes = static_cast<int64_t>(data.size() * sizeof(float));
    DeviceBuffer a = be.upload(data.data(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u) << be.name();
    DeviceBuffer b = be.alloc(bytes);
    auto stream = be.make_stream();
    auto event = be.make_event();
    be.copy_within(b.data(), a.data(), bytes, stream.get());
    be.record(*event, stream.get());
    be.wait(*event);  // the op stream waits for the copy
    std::vector<float> back(data.size(), NAN);
    be.copy_to_host(back.data(), b.data(), bytes, stream.get());
    be.record(*event, stream.get());
    be.synchronize(*event);
    EXPECT_EQ(0, std::memcmp(back.data(), data.data(), static_cast<size_t>(bytes))) << be.name();
    be.copy_to_backend(b.as<float>() + 1, data.data(), 4 * sizeof(float));
    be.synchronize();
    EXPECT_EQ(b.as<float>()[1], data[0]);
    EXPECT_EQ(b.as<float>()[5], data[5]) << "a copy writes only its bytes";
    DeviceBuffer moved = std::move(b);
    EXPECT_FALSE(b);
    EXPECT_EQ(moved.bytes(), bytes);

    Workspace& ws = be.workspace();
    EXPECT_EQ(&ws, &be.workspace()) << "one workspace per thread";
    float* s1 = ws.get<float>(3, 100);
    EXPECT_EQ(s1, ws.get<float>(3, 50)) << "a slot keeps its memory while it is large enough";
    EXPECT_NE(static_cast<void*>(s1), ws.bytes(4, 100)) << "slots are distinct";
    Workspace* other = nullptr;
    std::thread([&] { other = &be.workspace(); }).join();
    EXPECT_NE(other, &ws) << "another thread has its own workspace";
  }
}

// add, split_qkv and gather_rows: the CPU backend's results are the reference's bit
// for bit (no arithmetic but one addition each), at odd sizes.
TEST_P(BackendOps, ResidualSplitAndGatherEqualTheReference) {
  for (int64_t count : {int64_t{1}, int64_t{17}, int64_t{100003}}) {
    const auto y = random_vec(static_cast<size_t>(count), 21), x = random_vec(static_cast<size_t>(count), 22);
    auto a = y, b = y;
    cpu->add(a.data(), x.data(), count);
    ref->add(b.data(), x.data(), count);
    EXPECT_EQ(a, b) << "add of " << count;
    EXPECT_EQ(a[count / 2], y[count / 2] + x[count / 2]);
  }
  for (auto [n, qd, kvd] : {std::tuple<int64_t, int64_t, int64_t>{1, 576, 192}, {300, 576, 192}, {5, 9, 3}}) {
    const auto qkv = random_vec(static_cast<size_t>(n * (qd + 2 * kvd)), 23);
    std::vector<float> q[2], k[2], v[2];
    int i = 0;
    for (Backend* be : {cpu.get(), ref.get()}) {
      q[i].assign(static_cast<size_t>(n * qd), NAN);
      k[i].assign(static_cast<size_t>(n * kvd), NAN);
      v[i].assign(static_cast<size_t>(n * kvd), NAN);
      be->split_qkv(qkv.data(), q[i].data(), k[i].data(), v[i].data(), n, qd, kvd);
      ++i;
    }
    EXPECT_EQ(q[0], q[1]);
    EXPECT_EQ(k[0], k[1]);
    EXPECT_EQ(v[0], v[1]);
    EXPECT_EQ(v[0][static_cast<size_t>((n - 1) * kvd)], qkv[static_cast<size_t>((n - 1) * (qd + 2 * kvd) + qd + kvd)]);
  }
  const int64_t width = 576;
  const auto src = random_vec(static_cast<size_t>(40 * width), 24);
  const std::vector<int32_t> rows = {39, 0, 7, 7, 12, 38, 1};  // out of order, repeated
  std::vector<float> a(rows.size() * width, NAN), b(a.size(), NAN);
  cpu->gather_rows(src.data(), rows.data(), a.data(), static_cast<int64_t>(rows.size()), width);
  ref->gather_rows(src.data(), rows.data(), b.data(), static_cast<int64_t>(rows.size()), width);
  EXPECT_EQ(a, b);
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_EQ(0, std::memcmp(&a[i * width], &src[rows[i] * width], width * sizeof(float))) << "row " << i;
}

// store_kv writes every row where the page table says, rounded to the dtype, on every
// backend the same bytes; rows it was not given stay as they were; a position outside
// the cache throws before anything is written.
TEST_P(BackendOps, StoreKvWritesPagedRowsRoundedToTheDtype) {
  const int64_t kv_heads = 3, hd = 64, rows = 150;
  const std::vector<int32_t> pos = {149, 0, 63, 64, 65, 128, 7, 100};  // out of order, across pages, the last partial
  const int64_t n = static_cast<int64_t>(pos.size());
  const auto k = random_vec(static_cast<size_t>(n * kv_heads * hd), 31), v = random_vec(k.size(), 32);
  const auto filler = random_vec(static_cast<size_t>(kv_heads * rows * hd), 33);
  for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    for (int shift : {0, 3, 6}) {
      auto pc = test::make_paged(filler, filler, kv_heads, rows, hd, rows, shift, 34, 2, dtype);
      auto pr = test::make_paged(filler, filler, kv_heads, rows, hd, rows, shift, 34, 2, dtype);
      const std::string what = std::string(kv_dtype_name(dtype)) + ", pages of " + std::to_string(1 << shift);
      cpu->store_kv(pc.view, pos.data(), k.data(), v.data(), n);
      ref->store_kv(pr.view, pos.data(), k.data(), v.data(), n);
      EXPECT_EQ(pc.k, pr.k) << what;
      EXPECT_EQ(pc.v, pr.v) << what;
      const auto ks = test::as_stored(k, dtype), fs = test::as_stored(filler, dtype);
      std::vector<float> row(static_cast<size_t>(hd));
      for (int64_t h = 0; h < kv_heads; ++h)
        for (int64_t j = 0; j < rows; ++j) {
          pc.view.read_k_row(h, j, row.data());
          const auto it = std::find(pos.begin(), pos.end(), static_cast<int32_t>(j));
          const float* want = it == pos.end() ? &fs[static_cast<size_t>((h * rows + j) * hd)]
                                              : &ks[static_cast<size_t>(((it - pos.begin()) * kv_heads + h) * hd)];
          ASSERT_EQ(0, std::memcmp(row.data(), want, hd * sizeof(float))) << what << " head " << h << " row " << j;
        }
      // K only: V keeps what it had.
      const auto v_before = pc.v;
      cpu->store_kv(pc.view, pos.data(), v.data(), nullptr, n);
      EXPECT_EQ(pc.v, v_before) << what;
      EXPECT_NE(pc.k, pr.k) << what;
      for (Backend* be : {cpu.get(), ref.get()}) {
        const auto k_before = pc.k;
        for (int32_t bad : {-1, static_cast<int32_t>(rows)}) {
          const std::vector<int32_t> some = {5, bad};
          EXPECT_THROW(be->store_kv(pc.view, some.data(), k.data(), v.data(), 2), std::out_of_range) << be->name();
          EXPECT_EQ(pc.k, k_before) << be->name() << ": a refused store wrote rows";
        }
      }
    }
  }
}

// The deviation of fresh rows against the cache: the CPU backend's doubles are the
// reference's bit for bit (same order of summation), for every dtype and kind, and are
// the plain sum of squares of fresh minus stored.
TEST_P(BackendOps, KvDeviationEqualsTheReference) {
  const int64_t kv_heads = 3, hd = 64, rows = 130;
  const std::vector<int32_t> pos = {0, 129, 64, 5, 5, 77};
  const int64_t n = static_cast<int64_t>(pos.size());
  const auto ck = random_vec(static_cast<size_t>(kv_heads * rows * hd), 41), cv = random_vec(ck.size(), 42);
  const auto k = random_vec(static_cast<size_t>(n * kv_heads * hd), 43), v = random_vec(k.size(), 44);
  for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    auto paged = test::make_paged(ck, cv, kv_heads, rows, hd, rows, 4, 45, 2, dtype);
    const auto cks = test::as_stored(ck, dtype), cvs = test::as_stored(cv, dtype);
    for (const KvDeviation which : {KvDeviation::K, KvDeviation::V, KvDeviation::KV}) {
      std::vector<double> a(static_cast<size_t>(n), NAN), b(a.size(), NAN);
      cpu->kv_deviation(paged.view, pos.data(), k.data(), v.data(), n, which, a.data());
      ref->kv_deviation(paged.view, pos.data(), k.data(), v.data(), n, which, b.data());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double))) << kv_dtype_name(dtype);
      for (int64_t t = 0; t < n; ++t) {
        double want = 0;
        for (int64_t h = 0; h < kv_heads; ++h)
          for (int64_t i = 0; i < hd; ++i) {
            const size_t f = static_cast<size_t>((t * kv_heads + h) * hd + i);
            const size_t c = static_cast<size_t>((h * rows + pos[t]) * hd + i);
            if (which != KvDeviation::V) want += static_cast<double>(k[f] - cks[c]) * (k[f] - cks[c]);
            if (which != KvDeviation::K) want += static_cast<double>(v[f] - cvs[c]) * (v[f] - cvs[c]);
          }
        EXPECT_NEAR(a[static_cast<size_t>(t)], want, 1e-9 * want) << kv_dtype_name(dtype) << " token " << t;
      }
    }
    const std::vector<int32_t> bad = {rows};
    std::vector<double> out(1);
    EXPECT_THROW(cpu->kv_deviation(paged.view, bad.data(), k.data(), v.data(), 1, KvDeviation::KV, out.data()),
                 std::out_of_range);
  }
}

// The attention query rows pay each key: the CPU backend's (the variant's vector
// kernels) agree with the reference's within fp32 rounding (every dtype, a paged cache,
// rows that see all, part or none of the keys), and both are the softmax weights
// computed here in double: each row's weights over the keys it sees sum to one per
// query head.
TEST_P(BackendOps, AttentionMassEqualsTheReferenceAndIsTheSoftmaxWeights) {
  const int64_t kv_heads = 3, q_heads = 9, group = q_heads / kv_heads, hd = 64, rows = 130, n_kv = 120;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::vector<int32_t> qpos = {129, 40, -1, 0, 119};
  const int64_t n = static_cast<int64_t>(qpos.size());
  const auto ck = random_vec(static_cast<size_t>(kv_heads * rows * hd), 61), cv = random_vec(ck.size(), 62);
  auto q = random_vec(static_cast<size_t>(n * q_heads * hd), 63);
  for (auto& x : q) x *= 4.0f;  // peaked rows, not near-uniform ones
  for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    const std::string what = kv_dtype_name(dtype);
    auto paged = test::make_paged(ck, cv, kv_heads, rows, hd, rows, 4, 64, 2, dtype);
    const auto cks = test::as_stored(ck, dtype);
    std::vector<double> a(static_cast<size_t>(n_kv), NAN), b(a.size(), NAN);
    cpu->attention_mass(q.data(), qpos.data(), paged.view, n, q_heads, n_kv, scale, a.data());
    ref->attention_mass(q.data(), qpos.data(), paged.view, n, q_heads, n_kv, scale, b.data());
    for (int64_t j = 0; j < n_kv; ++j)
      EXPECT_NEAR(a[static_cast<size_t>(j)], b[static_cast<size_t>(j)], 1e-5 * (1.0 + b[static_cast<size_t>(j)]))
          << what << " key " << j;
    std::vector<double> want(static_cast<size_t>(n_kv), 0.0);
    double rows_seen = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t count = std::min<int64_t>(n_kv, qpos[i] + 1);
      if (count <= 0) continue;
      rows_seen += q_heads;
      for (int64_t h = 0; h < q_heads; ++h) {
        std::vector<double> s(static_cast<size_t>(count));
        for (int64_t j = 0; j < count; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d)
            dot += static_cast<double>(q[static_cast<size_t>((i * q_heads + h) * hd + d)]) *
                   cks[static_cast<size_t>(((h / group) * rows + j) * hd + d)];
          s[static_cast<size_t>(j)] = dot * scale;
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j < count; ++j) want[static_cast<size_t>(j)] += s[static_cast<size_t>(j)] / sum;
      }
    }
    double total = 0;
    for (int64_t j = 0; j < n_kv; ++j) {
      total += a[static_cast<size_t>(j)];
      EXPECT_NEAR(a[static_cast<size_t>(j)], want[static_cast<size_t>(j)], 1e-5 * rows_seen) << what << " key " << j;
    }
    EXPECT_NEAR(total, rows_seen, 1e-4 * rows_seen) << what << ": each (row, head) spreads a weight of one";
    // Key 1 is seen by the rows at 129, 40 and 119 only; key 0 also by the row at 0,
    // whose only key it is (weight one per head).
    EXPECT_GE(a[0], static_cast<double>(q_heads) - 1e-6) << what;
  }
  std::vector<double> out(static_cast<size_t>(rows + 1));
  auto paged = test::make_paged(ck, cv, kv_heads, rows, hd, rows, 4, 64);
  for (Backend* be : {cpu.get(), ref.get()}) {
    EXPECT_THROW(be->attention_mass(q.data(), qpos.data(), paged.view, n, q_heads, rows + 1, scale, out.data()),
                 std::out_of_range) << be->name();
    EXPECT_THROW(be->attention_mass(q.data(), qpos.data(), paged.view, n, 8, rows, scale, out.data()),
                 std::invalid_argument) << be->name();
  }
}

// A long prompt: the CPU backend takes its (head, row) pairs in blocks whose exps fit
// its scratch bound; the sums stay the reference's (within rounding).
TEST_P(BackendOps, AttentionMassOverManyKeysEqualsTheReference) {
  const int64_t kv_heads = 1, q_heads = 2, hd = 16, rows = 70000, n = 40;
  const auto ck = random_vec(static_cast<size_t>(kv_heads * rows * hd), 71), cv = random_vec(ck.size(), 72);
  const auto q = random_vec(static_cast<size_t>(n * q_heads * hd), 73);
  std::vector<int32_t> qpos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) qpos[static_cast<size_t>(i)] = static_cast<int32_t>(rows - 1 - 1000 * i);
  auto paged = test::make_paged(ck, cv, kv_heads, rows, hd, rows, 10, 74, 1, TensorType::F16);
  std::vector<double> a(static_cast<size_t>(rows)), b(a.size());
  cpu->attention_mass(q.data(), qpos.data(), paged.view, n, q_heads, rows, 0.25f, a.data());
  ref->attention_mass(q.data(), qpos.data(), paged.view, n, q_heads, rows, 0.25f, b.data());
  double worst = 0;
  for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::fabs(a[j] - b[j]) / (1e-3 + b[j]));
  EXPECT_LT(worst, 1e-4);
  EXPECT_NEAR(std::accumulate(a.begin(), a.end(), 0.0), static_cast<double>(n * q_heads), 1e-5 * n * q_heads);
}

// top_k: the k largest, largest first, equal scores by lower index, NaN last; the CPU
// backend's order is the reference's, for every k from none to all.
TEST_P(BackendOps, TopKOrdersByScoreThenIndex) {
  std::mt19937 rng(51);
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{37}, int64_t{300}}) {
    std::vector<double> score(static_cast<size_t>(n));
    for (auto& s : score) s = static_cast<double>(rng() % 7);  // many ties
    if (n > 2) score[1] = NAN, score[static_cast<size_t>(n - 1)] = NAN;
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 3, n - 1, n}) {
      if (k < 0) continue;
      std::vector<int32_t> a(static_cast<size_t>(k), -1), b(a.size(), -1);
      cpu->top_k(score.data(), n, k, a.data());
      ref->top_k(score.data(), n, k, b.data());
      EXPECT_EQ(a, b) << "n " << n << " k " << k;
      for (int64_t i = 1; i < k; ++i) {
        const double x = score[a[i - 1]], y = score[a[i]];
        const bool ordered = std::isnan(y) ? (!std::isnan(x) || a[i - 1] < a[i])
                                           : (!std::isnan(x) && (x > y || (x == y && a[i - 1] < a[i])));
        EXPECT_TRUE(ordered) << "n " << n << " k " << k << " at " << i;
      }
    }
  }
  std::vector<double> s(3, 1.0);
  std::vector<int32_t> out(4);
  EXPECT_THROW(cpu->top_k(s.data(), 3, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(ref->top_k(s.data(), 3, 4, out.data()), std::invalid_argument);
}

// Delta-RoPE of cached rows: on the CPU backend exactly its rope() of the widened rows,
// rounded back to the dtype; within the cos/sin rounding of the reference; rows outside
// the range and V untouched; rotating by -delta undoes it (fp32).
TEST_P(BackendOps, RopeKvRowsRotatesCachedRowsInPlace) {
  const int64_t kv_heads = 3, hd = 64, rows = 200;
  RopeTable t;
  t.head_dim = hd;
  for (int i = 0; i < hd / 2; ++i) t.inv_freq.push_back(static_cast<float>(std::pow(100000.0, -2.0 * i / hd)));
  const auto k = random_vec(static_cast<size_t>(kv_heads * rows * hd), 61), v = random_vec(k.size(), 62);
  for (const auto style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
    t.style = style;
    const auto cpu_t = cpu->prepare_rope(t), ref_t = ref->prepare_rope(t);
    for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
      for (auto [first, m, delta] : {std::tuple<int64_t, int64_t, int32_t>{10, 120, 517}, {64, 64, -64}, {199, 1, 3},
                                     {0, 200, 0}}) {
        const std::string what = std::string(kv_dtype_name(dtype)) + " rows " + std::to_string(first) + "+" +
                                 std::to_string(m) + " by " + std::to_string(delta);
        auto pc = test::make_paged(k, v, kv_heads, rows, hd, rows, 5, 63, 2, dtype);
        auto pr = test::make_paged(k, v, kv_heads, rows, hd, rows, 5, 63, 2, dtype);
        const auto v_before = pc.v;
        cpu->rope_kv_rows(pc.view, first, m, delta, *cpu_t);
        ref->rope_kv_rows(pr.view, first, m, delta, *ref_t);
        EXPECT_EQ(pc.v, v_before) << what;
        const auto ks = test::as_stored(k, dtype);
        std::vector<float> got(static_cast<size_t>(hd)), want(static_cast<size_t>(hd)), r(static_cast<size_t>(hd));
        double worst = 0;
        for (int64_t h = 0; h < kv_heads; ++h)
          for (int64_t j = 0; j < rows; ++j) {
            pc.view.read_k_row(h, j, got.data());
            std::copy_n(&ks[static_cast<size_t>((h * rows + j) * hd)], hd, want.begin());
            if (j >= first && j < first + m) {
              cpu->rope(want.data(), &delta, 1, 1, *cpu_t);
              want = test::as_stored(want, dtype);
              pr.view.read_k_row(h, j, r.data());
              for (int64_t i = 0; i < hd; ++i) worst = std::max(worst, static_cast<double>(std::fabs(got[i] - r[i])));
            }
            ASSERT_EQ(0, std::memcmp(got.data(), want.data(), hd * sizeof(float))) << what << " head " << h << " row " << j;
          }
        // The reference computes cos/sin in double: apart by the rounding of the dtype at most.
        EXPECT_LT(worst, dtype == TensorType::F32 ? 1e-4 : dtype == TensorType::F16 ? 1e-2 : 6e-2) << what;
        if (dtype == TensorType::F32) {
          cpu->rope_kv_rows(pc.view, first, m, -delta, *cpu_t);
          std::vector<float> row(static_cast<size_t>(hd));
          for (int64_t j = first; j < first + m; ++j) {
            pc.view.read_k_row(1, j, row.data());
            for (int64_t i = 0; i < hd; ++i)
              EXPECT_NEAR(row[i], k[static_cast<size_t>((1 * rows + j) * hd + i)], 1e-4) << what << " back, row " << j;
          }
        }
      }
    }
    auto pc = test::make_paged(k, v, kv_heads, rows, hd, rows, 5, 63, 2, TensorType::F32);
    EXPECT_THROW(cpu->rope_kv_rows(pc.view, 150, 51, 1, *cpu_t), std::out_of_range);
    EXPECT_THROW(ref->rope_kv_rows(pc.view, -1, 2, 1, *ref_t), std::out_of_range);
    EXPECT_THROW(cpu->rope_kv_rows(pc.view, 0, 1, 1, *ref_t), std::invalid_argument)
        << "a table prepared by another backend";
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, BackendOps, ::testing::ValuesIn(cpu::kAllIsas),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) { return cpu::isa_name(info.param); });

// bf16 is offered exactly where the kernels have native bf16 dot products.
TEST(CpuBackend, PrecisionFollowsTheHardware) {
  for (CpuIsa isa : cpu::kAllIsas) {
    if (isa > cpu::detect_cpu_isa()) continue;
    auto b = make_cpu_backend_for(isa);
    EXPECT_EQ(b->kernel_id(), std::string("cpu/") + cpu::isa_name(isa));
    EXPECT_TRUE(b->supports(Precision::F32));
    if (isa < CpuIsa::Avx512Bf16) {
      EXPECT_FALSE(b->supports(Precision::BF16)) << cpu::isa_name(isa);
    }
    EXPECT_EQ(b->default_precision(), b->supports(Precision::BF16) ? Precision::BF16 : Precision::F32);
  }
  EXPECT_THROW(make_cpu_backend_for(static_cast<CpuIsa>(static_cast<int>(cpu::detect_cpu_isa()) + 1)),
               std::invalid_argument);
}

TEST(CpuIsaSelection, CapOnlyLowersAndBadNamesAreErrors) {
  std::string warn;
  EXPECT_EQ(cpu::resolve_cpu_isa(nullptr, CpuIsa::Avx512Bf16, &warn), CpuIsa::Avx512Bf16);
  EXPECT_EQ(cpu::resolve_cpu_isa("", CpuIsa::Avx2, &warn), CpuIsa::Avx2);
  EXPECT_TRUE(warn.empty()) << warn;
  EXPECT_EQ(cpu::resolve_cpu_isa("avx2", CpuIsa::Avx512Bf16, &warn), CpuIsa::Avx2);
  EXPECT_EQ(cpu::resolve_cpu_isa("scalar", CpuIsa::Avx2, &warn), CpuIsa::Scalar);
  EXPECT_TRUE(warn.empty()) << warn;
  // above what the CPU has: clamped, with a warning
  EXPECT_EQ(cpu::resolve_cpu_isa("avx512bf16", CpuIsa::Avx2, &warn), CpuIsa::Avx2);
  EXPECT_NE(warn.find("above what this CPU has"), std::string::npos) << warn;
  // no AVX2 at all: scalar, with a warning
  warn.clear();
  EXPECT_EQ(cpu::resolve_cpu_isa(nullptr, CpuIsa::Scalar, &warn), CpuIsa::Scalar);
  EXPECT_NE(warn.find("scalar"), std::string::npos) << warn;
  try {
    cpu::resolve_cpu_isa("avx1024", CpuIsa::Avx2, &warn);
    FAIL() << "an unknown ISA name must be an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("scalar, avx2, avx512, avx512bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bs::kernels
