// Attention of every CPU kernel variant (fp32 tiled, bf16 tiled, decode-size) against the
// scalar reference: prefills, selected rows, paged caches, half-precision KV. A variant
// this CPU cannot execute is skipped (and shows as "Not Run" in ctest), never passed.
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
#include "kernel_ops_fixture.h"

namespace bs::kernels {
namespace {

using cpu::CpuIsa;
using test::random_vec;
using test::rel_max_err;
using test_ops::BackendOps;
using test_ops::encode_16bit;
using test_ops::quantize_q4_0;
using test_ops::quantize_q4_1;
using test_ops::quantize_q8_0;
using test_ops::random_typed_blocks;

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


INSTANTIATE_TEST_SUITE_P(Isa, BackendOps, ::testing::ValuesIn(cpu::kAllIsas),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) { return cpu::isa_name(info.param); });

}  // namespace
}  // namespace bs::kernels
