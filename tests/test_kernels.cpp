// Every op of every CPU kernel variant (scalar, avx2, avx512, avx512bf16) against the
// scalar reference, at model sizes and odd ones: the element-wise, memory and KV ops here,
// attention in test_kernels_attention.cpp, the products in test_kernels_linear.cpp. A variant
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
