// Sliding-window attention (KvView::window, Gemma 3's local layers) and the GeGLU and
// scale ops, on every CPU kernel variant against the scalar reference, and the
// reference's window against its own definition: a query at p with window W is the
// windowless attention over just the keys [p - W + 1, p]. A variant this CPU cannot
// execute is skipped ("Not Run" in ctest).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/op_math.h"
#include "paged_kv.h"
#include "random_data.h"

namespace bs::kernels {
namespace {

using cpu::CpuIsa;
using test::random_vec;
using test::rel_max_err;

class WindowOps : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (GetParam() > cpu::detect_cpu_isa())
      GTEST_SKIP() << "this CPU cannot execute the " << cpu::isa_name(GetParam()) << " kernels";
    cpu = make_cpu_backend_for(GetParam());
  }
  std::unique_ptr<Backend> ref = make_reference_backend();
  std::unique_ptr<Backend> cpu;
};

// Row i of attention with window W over keys [0, n_kv), computed by `be` without a
// window over a cache of only the keys row i sees (they start at position 0 there).
std::vector<float> by_definition(Backend& be, const std::vector<float>& q, const std::vector<int32_t>& pos,
                                 const std::vector<float>& k, const std::vector<float>& v, int64_t kv_heads,
                                 int64_t stride, int64_t hd, int64_t q_heads, int64_t n_kv, int64_t window,
                                 float scale) {
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<float> out(static_cast<size_t>(n * q_heads * hd));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t last = std::min<int64_t>(n_kv - 1, pos[i]);
    const int64_t lo = std::max<int64_t>(0, pos[i] - window + 1);
    const int64_t m = last - lo + 1;
    if (m <= 0) continue;
    std::vector<float> ks(static_cast<size_t>(kv_heads * m * hd)), vs(ks.size());
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t d = 0; d < hd; ++d) {
          ks[static_cast<size_t>((h * m + j) * hd + d)] = k[static_cast<size_t>((h * stride + lo + j) * hd + d)];
          vs[static_cast<size_t>((h * m + j) * hd + d)] = v[static_cast<size_t>((h * stride + lo + j) * hd + d)];
        }
    const int32_t p = static_cast<int32_t>(pos[i] - lo);
    be.attention(q.data() + i * q_heads * hd, &p, KvView::contiguous(ks.data(), vs.data(), kv_heads, m, hd),
                 out.data() + i * q_heads * hd, 1, q_heads, m, scale, Precision::F32);
  }
  return out;
}

struct WindowCase {
  const char* what;
  int64_t q_heads, kv_heads, head_dim, n_kv, window;
  std::vector<int32_t> pos;
};

std::vector<WindowCase> window_cases() {
  std::vector<int32_t> all(200);
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> sel;
  for (int32_t p = 2; p < 300; p += 11) sel.push_back(p);
  sel.push_back(299);
  return {
      {"prefill of 200, window 1", 4, 2, 64, 200, 1, all},
      {"prefill of 200, window 7", 4, 2, 64, 200, 7, all},
      {"prefill of 200, window 64 (a tile)", 9, 3, 64, 200, 64, all},
      {"prefill of 200, window 100, head_dim 256 (Gemma 3)", 4, 1, 256, 200, 100, all},
      {"prefill of 200, window past the prompt", 4, 2, 64, 200, 512, all},
      {"selected queries, window 50", 9, 3, 64, 300, 50, sel},
      {"decode, 2 queries, window 33", 4, 2, 128, 300, 33, {298, 299}},
      {"decode, 1 query, window 300", 4, 1, 256, 300, 300, {299}},
  };
}

TEST_P(WindowOps, AttentionSeesOnlyTheWindowOnEveryPath) {
  for (const auto& c : window_cases()) {
    const int64_t n = static_cast<int64_t>(c.pos.size()), stride = c.n_kv + 5, hd = c.head_dim;
    auto q = random_vec(n * c.q_heads * hd, 11);
    for (auto& x : q) x *= 3.0f;  // peaked rows: the window's edge matters
    auto k = random_vec(c.kv_heads * stride * hd, 12);
    auto v = random_vec(c.kv_heads * stride * hd, 13);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const auto want = by_definition(*ref, q, c.pos, k, v, c.kv_heads, stride, hd, c.q_heads, c.n_kv, c.window, scale);
    for (int shift : {-1, 3, 6}) {  // contiguous, pages of 8 and of 64 positions
      test::PagedKv paged;
      KvView view = KvView::contiguous(k.data(), v.data(), c.kv_heads, stride, hd);
      if (shift >= 0) {
        paged = test::make_paged(k, v, c.kv_heads, stride, hd, c.n_kv, shift, 14);
        view = paged.view;
      }
      view.window = c.window;
      const std::string what = std::string(c.what) + (shift < 0 ? ", contiguous" : ", pages of " + std::to_string(1 << shift));
      std::vector<float> a(q.size(), NAN), b(q.size(), NAN);
      ref->attention(q.data(), c.pos.data(), view, b.data(), n, c.q_heads, c.n_kv, scale, Precision::F32);
      EXPECT_LT(rel_max_err(b, want), 1e-6) << "reference: " << what;
      cpu->attention(q.data(), c.pos.data(), view, a.data(), n, c.q_heads, c.n_kv, scale, Precision::F32);
      EXPECT_LT(rel_max_err(a, want), 1e-5) << "fp32: " << what;
      if (cpu->supports(Precision::BF16)) {
        cpu->attention(q.data(), c.pos.data(), view, a.data(), n, c.q_heads, c.n_kv, scale, Precision::BF16);
        EXPECT_LT(rel_max_err(a, want), 3e-2) << "bf16: " << what;
      }
    }
    // The window changes the answer wherever a row sees more keys than it (else the
    // cases would not test it).
    if (c.window < c.pos.back() + 1) {
      std::vector<float> whole(q.size());
      cpu->attention(q.data(), c.pos.data(), KvView::contiguous(k.data(), v.data(), c.kv_heads, stride, hd),
                     whole.data(), n, c.q_heads, c.n_kv, scale, Precision::F32);
      EXPECT_GT(rel_max_err(whole, want), 1e-2) << c.what;
    }
  }
}

// Batched decode rows, each over its own cache with its own window (or none), equal
// attention() of each row alone, bit for bit, and the definition.
TEST_P(WindowOps, DecodeRowsKeepEachRowsWindow) {
  const int64_t q_heads = 4, kv_heads = 2, hd = 64;
  const std::vector<int64_t> lengths = {1, 40, 65, 300};
  const std::vector<int64_t> windows = {5, 0, 64, 17};
  std::vector<std::vector<float>> ks, vs;
  for (size_t i = 0; i < lengths.size(); ++i) {
    ks.push_back(random_vec(kv_heads * lengths[i] * hd, 20 + static_cast<uint32_t>(i)));
    vs.push_back(random_vec(kv_heads * lengths[i] * hd, 30 + static_cast<uint32_t>(i)));
  }
  std::vector<test::PagedKv> paged;
  paged.reserve(lengths.size());
  std::vector<KvView> views;
  std::vector<int32_t> qpos;
  for (size_t i = 0; i < lengths.size(); ++i) {
    paged.push_back(test::make_paged(ks[i], vs[i], kv_heads, lengths[i], hd, lengths[i], 4, 40 + static_cast<uint32_t>(i)));
    views.push_back(paged.back().view);
    views.back().window = windows[i];
    qpos.push_back(static_cast<int32_t>(lengths[i] - 1));
  }
  const int64_t B = static_cast<int64_t>(lengths.size());
  auto q = random_vec(B * q_heads * hd, 50);
  for (Backend* be : {ref.get(), cpu.get()}) {
    std::vector<float> rows(q.size(), NAN);
    be->attention_rows(q.data(), qpos.data(), views.data(), rows.data(), B, q_heads, 0.125f, Precision::F32);
    for (int64_t i = 0; i < B; ++i) {
      std::vector<float> alone(static_cast<size_t>(q_heads * hd));
      be->attention(q.data() + i * q_heads * hd, &qpos[i], views[i], alone.data(), 1, q_heads, lengths[i], 0.125f,
                    Precision::F32);
      EXPECT_EQ(0, std::memcmp(alone.data(), rows.data() + i * q_heads * hd, alone.size() * sizeof(float)))
          << be->name() << " row " << i;
      const std::vector<float> qi(q.begin() + i * q_heads * hd, q.begin() + (i + 1) * q_heads * hd);
      const auto want = by_definition(*ref, qi, {qpos[i]}, ks[i], vs[i], kv_heads, lengths[i], hd, q_heads, lengths[i],
                                      windows[i] > 0 ? windows[i] : lengths[i], 0.125f);
      EXPECT_LT(rel_max_err(alone, want), 1e-5) << be->name() << " row " << i;
    }
  }
}

// attention_mass under a window: the CPU's sums are the reference's, a key no row's
// window holds gets nothing, and each (row, head) still spreads a weight of one.
TEST_P(WindowOps, AttentionMassCountsOnlyTheWindow) {
  const int64_t kv_heads = 2, q_heads = 4, hd = 64, rows = 160, n_kv = 150, window = 20;
  const std::vector<int32_t> qpos = {149, 100, 5, 149 - 25};
  const int64_t n = static_cast<int64_t>(qpos.size());
  const auto ck = random_vec(static_cast<size_t>(kv_heads * rows * hd), 61), cv = random_vec(ck.size(), 62);
  auto q = random_vec(static_cast<size_t>(n * q_heads * hd), 63);
  for (auto& x : q) x *= 4.0f;
  auto paged = test::make_paged(ck, cv, kv_heads, rows, hd, rows, 4, 64);
  paged.view.window = window;
  std::vector<double> a(static_cast<size_t>(n_kv), NAN), b(a.size(), NAN);
  cpu->attention_mass(q.data(), qpos.data(), paged.view, n, q_heads, n_kv, 0.125f, a.data());
  ref->attention_mass(q.data(), qpos.data(), paged.view, n, q_heads, n_kv, 0.125f, b.data());
  double total = 0;
  for (int64_t j = 0; j < n_kv; ++j) {
    EXPECT_NEAR(a[static_cast<size_t>(j)], b[static_cast<size_t>(j)], 1e-5 * (1.0 + b[static_cast<size_t>(j)])) << j;
    bool seen = false;
    for (int32_t p : qpos) seen = seen || (j <= p && p - j < window);
    if (!seen) {
      EXPECT_EQ(a[static_cast<size_t>(j)], 0.0) << "key " << j << " is in no row's window";
    }
    total += a[static_cast<size_t>(j)];
  }
  EXPECT_NEAR(total, static_cast<double>(n * q_heads), 1e-4 * n * q_heads);
}

TEST_P(WindowOps, GegluAndScaleMatchTheReference) {
  for (int64_t ff : {2048, 33, 16}) {
    const int64_t n = 5;
    auto gu = random_vec(n * 2 * ff, 3, 4.0f);
    gu[0] = -100.0f;  // saturating inputs: gelu -> 0 and -> identity
    gu[1] = 100.0f;
    gu[2] = 0.0f;
    std::vector<float> a(n * ff), b(n * ff);
    cpu->geglu(gu.data(), a.data(), n, ff);
    ref->geglu(gu.data(), b.data(), n, ff);
    EXPECT_LT(rel_max_err(a, b), 1e-6) << "ff " << ff;
    // The formula itself, in double: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u.
    for (int64_t i = 0; i < ff; ++i) {
      const double g = gu[static_cast<size_t>(i)], u = gu[static_cast<size_t>(ff + i)];
      const double want = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
      EXPECT_NEAR(b[static_cast<size_t>(i)], want, 1e-6 * (1.0 + std::fabs(want))) << i;
    }
  }
  auto x = random_vec(1000, 5), y = x, z = x;
  cpu->scale(y.data(), 1000, 25.298221f);
  ref->scale(z.data(), 1000, 25.298221f);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], x[i] * 25.298221f) << i;
    EXPECT_EQ(z[i], y[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, WindowOps, ::testing::ValuesIn(cpu::kAllIsas),
                         [](const auto& info) { return std::string(cpu::isa_name(info.param)); });

}  // namespace
}  // namespace bs::kernels
