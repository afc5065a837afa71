// The CUDA backend through the Backend interface (kernels/cuda/cuda_backend.h), every
// op against the CPU backend on the same inputs: uploaded with the backend's copies,
// run, copied back — so what is tested is the glue the model relies on (prepared
// weights, page tables carried with each call, the index flag, streams, events,
// pinned staging), on top of the kernels tests/cuda_test_ops.cpp checks one by one.
// Label "cuda": without a GPU it prints why and exits 77 (CTest: skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/dequant.h"
#include "kernels/sampling.h"
#include "tests/paged_kv.h"
#include "tests/random_data.h"

namespace bs::kernels {
namespace {

using test::random_vec;
using test::rel_max_err;

class CudaBackendOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cuda = make_cuda_backend(0);
  std::unique_ptr<Backend> cpu = make_cpu_backend();

  template <class T>
  DeviceBuffer up(const std::vector<T>& host) {
    return cuda->upload(host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
  }
  template <class T>
  std::vector<T> down(const DeviceBuffer& d, size_t count) {
    std::vector<T> host(count);
    cuda->copy_to_host(host.data(), d.data(), static_cast<int64_t>(count * sizeof(T)));
    return host;
  }
  DeviceBuffer zeros(size_t bytes) { return cuda->alloc(static_cast<int64_t>(bytes)); }

  // A host paged cache (tests/paged_kv.h) as the device sees it: its pool uploaded, the
  // view's k/v pointing there, the page table still host memory (the call carries it).
  struct DevicePaged {
    DeviceBuffer k, v;
    KvView view;
  };
  DevicePaged on_device(const test::PagedKv& host) {
    DevicePaged d{up(host.k), up(host.v), host.view};
    d.view.k = d.k.data();
    d.view.v = d.v.data();
    return d;
  }
};

TEST_F(CudaBackendOps, SaysWhatItIs) {
  EXPECT_EQ(cuda->name(), "cuda");
  EXPECT_EQ(cuda->kernel_id().rfind("cuda/sm_", 0), 0u) << cuda->kernel_id();
  EXPECT_FALSE(cuda->device_name().empty());
  EXPECT_FALSE(cuda->host_accessible());
  EXPECT_TRUE(cuda->supports(Precision::BF16));
  EXPECT_FALSE(cuda->supports(Precision::F32));
  EXPECT_GT(cuda->free_memory_bytes(), 0);
  EXPECT_THROW(choose_precision("f32", *cuda), std::invalid_argument);
  EXPECT_EQ(choose_precision("auto", *cuda), Precision::BF16);
  try {
    make_cuda_backend(cuda::device_count());
    ADD_FAILURE() << "a device past the last one";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda->alloc(int64_t{1} << 50), std::bad_alloc);
}

// Products: every stored type dequantized to bf16, against the CPU's fp32 product
// within bf16's rounding; up to linear_exact_rows() rows each row bit-identical alone
// or in a batch (a batched decode step equals one-token forwards); beyond it cuBLAS.
TEST_F(CudaBackendOps, LinearMatchesTheCpuAndRowsAreExactAloneOrBatched) {
  for (auto [out, in] : {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {96, 64}, {33, 160}}) {
    const auto w = random_vec(static_cast<size_t>(out * in), 1, 1.0f / std::sqrt(static_cast<float>(in)));
    std::vector<uint8_t> bf16(w.size() * 2);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t b = fp32_to_bf16(w[i]);
      std::memcpy(bf16.data() + 2 * i, &b, 2);
    }
    const WeightView f32_view{TensorType::F32, w.data(), out, in};
    const WeightView bf16_view{TensorType::BF16, bf16.data(), out, in};
    const auto cpu_w = cpu->prepare(f32_view, Precision::F32);
    for (const WeightView& view : {f32_view, bf16_view}) {
      const auto dev_w = cuda->prepare(view, Precision::BF16);
      const auto bias = random_vec(static_cast<size_t>(out), 2);
      const auto d_bias = up(bias);
      for (int64_t n : {int64_t{1}, int64_t{5}, cuda->linear_exact_rows(), cuda->linear_exact_rows() + 1, int64_t{300}}) {
        const auto x = random_vec(static_cast<size_t>(n * in), 3);
        std::vector<float> want(static_cast<size_t>(n * out));
        cpu->linear(*cpu_w, x.data(), want.data(), n, bias.data());
        const auto dx = up(x);
        auto dy = zeros(want.size() * sizeof(float));
        cuda->linear(*dev_w, dx.as<float>(), dy.as<float>(), n, d_bias.as<float>());
        EXPECT_LT(rel_max_err(down<float>(dy, want.size()), want), 2e-2)
            << out << "x" << in << " n " << n << " type " << static_cast<int>(view.type);
      }
      // Exact rows: row r of a batch of linear_exact_rows() equals it alone.
      const int64_t B = cuda->linear_exact_rows();
      const auto x = random_vec(static_cast<size_t>(B * in), 4);
      const auto dx = up(x);
      auto dy = zeros(static_cast<size_t>(B * out) * sizeof(float));
      cuda->linear(*dev_w, dx.as<float>(), dy.as<float>(), B, nullptr);
      const auto batched = down<float>(dy, static_cast<size_t>(B * out));
      for (int64_t r : {int64_t{0}, B / 2, B - 1}) {
        auto one = zeros(static_cast<size_t>(out) * sizeof(float));
        cuda->linear(*dev_w, dx.as<float>() + r * in, one.as<float>(), 1, nullptr);
        const auto alone = down<float>(one, static_cast<size_t>(out));
        EXPECT_EQ(0, std::memcmp(alone.data(), batched.data() + r * out, static_cast<size_t>(out) * sizeof(float)))
            << out << "x" << in << " row " << r;
      }
    }
  }
}

// Embedding rows exactly as the CPU's; an id out of range is reported at the next host
// wait (the kernel writes no memory for it), and the backend works on afterwards.
TEST_F(CudaBackendOps, EmbedEqualsTheCpuAndReportsBadIdsAtTheNextWait) {
  const int64_t vocab = 301, dim = 96;
  const auto table = random_vec(static_cast<size_t>(vocab * dim), 5);
  const WeightView view{TensorType::F32, table.data(), vocab, dim};
  const auto cpu_t = cpu->prepare_embedding(view);
  const auto dev_t = cuda->prepare_embedding(view);
  const std::vector<int32_t> ids = {0, 300, 7, 7, 150};
  std::vector<float> want(ids.size() * dim);
  cpu->embed(*cpu_t, ids.data(), want.data(), static_cast<int64_t>(ids.size()));
  const auto d_ids = up(ids);
  auto out = zeros(want.size() * sizeof(float));
  cuda->embed(*dev_t, d_ids.as<int32_t>(), out.as<float>(), static_cast<int64_t>(ids.size()));
  EXPECT_EQ(down<float>(out, want.size()), want);

  const std::vector<int32_t> bad = {3, 301};
  const auto d_bad = up(bad);
  cuda->embed(*dev_t, d_bad.as<int32_t>(), out.as<float>(), 2);
  std::vector<float> host(2 * dim);
  EXPECT_THROW(cuda->copy_to_host(host.data(), out.data(), static_cast<int64_t>(host.size() * sizeof(float))),
               std::out_of_range);
  cuda->embed(*dev_t, d_ids.as<int32_t>(), out.as<float>(), static_cast<int64_t>(ids.size()));
  EXPECT_EQ(down<float>(out, want.size()), want) << "the flag was cleared once reported";
}

// The types without a device decoder (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) reach the device
// dequantized on the host (CudaBackend::decodable_view): products as the CPU's within
// bf16's rounding, embedding rows exactly the CPU's.
TEST_F(CudaBackendOps, HostDecodedTypesEqualTheCpu) {
  struct Case { TensorType type; int64_t elements, bytes; std::vector<int> scale_at; };
  for (const Case& c : {Case{TensorType::Q5_0, 32, 22, {0}}, Case{TensorType::Q5_1, 32, 24, {0, 2}},
                        Case{TensorType::Q4_K, 256, 144, {0, 2}}, Case{TensorType::Q5_K, 256, 176, {0, 2}},
                        Case{TensorType::Q6_K, 256, 210, {208}}}) {
    const int64_t out = 96, in = 512;
    const auto raw = bs::test::random_blocks(out, in, c.elements, c.bytes, c.scale_at, 21);
    const WeightView view{c.type, raw.data(), out, in};
    const auto cpu_w = cpu->prepare(view, Precision::F32);
    const auto dev_w = cuda->prepare(view, Precision::BF16);
    for (int64_t n : {int64_t{1}, int64_t{40}}) {
      const auto x = random_vec(static_cast<size_t>(n * in), 22);
      std::vector<float> want(static_cast<size_t>(n * out));
      cpu->linear(*cpu_w, x.data(), want.data(), n, nullptr);
      const auto dx = up(x);
      auto dy = zeros(want.size() * sizeof(float));
      cuda->linear(*dev_w, dx.as<float>(), dy.as<float>(), n, nullptr);
      EXPECT_LT(rel_max_err(down<float>(dy, want.size()), want), 2e-2) << type_traits(c.type).name << " n " << n;
    }
    const auto cpu_t = cpu->prepare_embedding(view);
    const auto dev_t = cuda->prepare_embedding(view);
    const std::vector<int32_t> ids = {0, 95, 7, 7, 50};
    std::vector<float> want(ids.size() * in);
    cpu->embed(*cpu_t, ids.data(), want.data(), static_cast<int64_t>(ids.size()));
    const auto d_ids = up(ids);
    auto emb = zeros(want.size() * sizeof(float));
    cuda->embed(*dev_t, d_ids.as<int32_t>(), emb.as<float>(), static_cast<int64_t>(ids.size()));
    EXPECT_EQ(down<float>(emb, want.size()), want) << type_traits(c.type).name;
  }
}

TEST_F(CudaBackendOps, ElementwiseOpsEqualTheCpu) {
  const int64_t n = 7, dim = 577, ff = 1537, q_dim = 192, kv_dim = 64;
  {
    const auto x = random_vec(static_cast<size_t>(n * dim), 6), w = random_vec(static_cast<size_t>(dim), 7);
    std::vector<float> want(x.size());
    cpu->rmsnorm(x.data(), w.data(), want.data(), n, dim, 1e-5f);
    auto dx = up(x), dw = up(w);
    auto d = zeros(want.size() * sizeof(float));
    cuda->rmsnorm(dx.as<float>(), dw.as<float>(), d.as<float>(), n, dim, 1e-5f);
    EXPECT_LT(rel_max_err(down<float>(d, want.size()), want), 1e-5);
  }
  {
    const auto gu = random_vec(static_cast<size_t>(n * 2 * ff), 8, 3.0f);
    std::vector<float> want(static_cast<size_t>(n * ff));
    cpu->swiglu(gu.data(), want.data(), n, ff);
    auto dgu = up(gu);
    auto d = zeros(want.size() * sizeof(float));
    cuda->swiglu(dgu.as<float>(), d.as<float>(), n, ff);
    EXPECT_LT(rel_max_err(down<float>(d, want.size()), want), 1e-5);
  }
  {
    auto y = random_vec(1001, 9);
    const auto x = random_vec(1001, 10);
    auto dy = up(y), dx = up(x);
    cpu->add(y.data(), x.data(), 1001);
    cuda->add(dy.as<float>(), dx.as<float>(), 1001);
    EXPECT_EQ(down<float>(dy, y.size()), y);
  }
  {
    const auto qkv = random_vec(static_cast<size_t>(n * (q_dim + 2 * kv_dim)), 11);
    std::vector<float> q(static_cast<size_t>(n * q_dim)), k(static_cast<size_t>(n * kv_dim)), v(k.size());
    cpu->split_qkv(qkv.data(), q.data(), k.data(), v.data(), n, q_dim, kv_dim);
    auto dqkv = up(qkv);
    auto dq = zeros(q.size() * 4), dk = zeros(k.size() * 4), dv = zeros(v.size() * 4);
    cuda->split_qkv(dqkv.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), n, q_dim, kv_dim);
    EXPECT_EQ(down<float>(dq, q.size()), q);
    EXPECT_EQ(down<float>(dk, k.size()), k);
    EXPECT_EQ(down<float>(dv, v.size()), v);
    const std::vector<int32_t> rows = {6, 0, 3, 3};
    std::vector<float> g(rows.size() * q_dim);
    cpu->gather_rows(q.data(), rows.data(), g.data(), 4, q_dim);
    auto drows = up(rows);
    auto dg = zeros(g.size() * 4);
    cuda->gather_rows(dq.as<float>(), drows.as<int32_t>(), dg.as<float>(), 4, q_dim);
    EXPECT_EQ(down<float>(dg, g.size()), g);
  }
}

// RoPE at any position (negative ones: delta-RoPE), both styles, Llama-3-style scaled
// frequencies: the CPU's (cos, sin) arithmetic in double, so equal up to a rare ulp.
TEST_F(CudaBackendOps, RopeEqualsTheCpuAtAnyPosition) {
  const int64_t hd = 64, heads = 5;
  RopeTable t;
  t.head_dim = hd;
  for (int i = 0; i < hd / 2; ++i)
    t.inv_freq.push_back(static_cast<float>(std::pow(500000.0, -2.0 * i / hd) / (i > 20 ? 8.0 : 1.0)));
  const std::vector<int32_t> pos = {0, 1, 8191, -3000, 131071, -1, 77};
  const int64_t n = static_cast<int64_t>(pos.size());
  for (auto style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
    t.style = style;
    auto x = random_vec(static_cast<size_t>(n * heads * hd), 12);
    auto dx = up(x);
    auto dpos = up(pos);
    const auto cpu_t = cpu->prepare_rope(t), dev_t = cuda->prepare_rope(t);
    cpu->rope(x.data(), pos.data(), n, heads, *cpu_t);
    cuda->rope(dx.as<float>(), dpos.as<int32_t>(), n, heads, *dev_t);
    EXPECT_LT(rel_max_err(down<float>(dx, x.size()), x), 1e-6);
  }
}

// The KV ops and attention over a paged cache in every dtype: store_kv's stored bytes
// equal the CPU's; prefill attention over a subset of rows (the blend's selected
// tokens) and batched decode rows each with its own cache within fp32 rounding;
// kv_deviation bit-identical; delta-RoPE of cached rows equal; top_k the same order.
TEST_F(CudaBackendOps, PagedKvOpsAndAttentionEqualTheCpu) {
  const int64_t kv_heads = 2, q_heads = 6, hd = 80, rows = 203;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto k = random_vec(static_cast<size_t>(kv_heads * rows * hd), 13);
  const auto v = random_vec(k.size(), 14);
  for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    const std::string what = kv_dtype_name(dtype);
    auto host = test::make_paged(k, v, kv_heads, rows, hd, rows, 5, 15, 3, dtype);
    auto dev = on_device(host);

    // store_kv of new rows at scattered positions: the same bytes in both pools.
    const std::vector<int32_t> pos = {3, 202, 100, 31, 32};
    const int64_t n = static_cast<int64_t>(pos.size());
    const auto nk = random_vec(static_cast<size_t>(n * kv_heads * hd), 16), nv = random_vec(nk.size(), 17);
    cpu->store_kv(host.view, pos.data(), nk.data(), nv.data(), n);
    const auto dpos = up(pos);
    const auto dnk = up(nk), dnv = up(nv);
    cuda->store_kv(dev.view, dpos.as<int32_t>(), dnk.as<float>(), dnv.as<float>(), n);
    EXPECT_EQ(down<std::byte>(dev.k, host.k.size()), host.k) << what;
    EXPECT_EQ(down<std::byte>(dev.v, host.v.size()), host.v) << what;

    // Prefill attention for a subset of query rows at their positions.
    const std::vector<int32_t> qpos = {0, 5, 64, 150, 202, 31};
    const int64_t nq = static_cast<int64_t>(qpos.size());
    const auto q = random_vec(static_cast<size_t>(nq * q_heads * hd), 18);
    std::vector<float> want(q.size());
    cpu->attention(q.data(), qpos.data(), host.view, want.data(), nq, q_heads, rows, scale, Precision::F32);
    const auto dq = up(q), dqpos = up(qpos);
    auto dout = zeros(want.size() * sizeof(float));
    cuda->attention(dq.as<float>(), dqpos.as<int32_t>(), dev.view, dout.as<float>(), nq, q_heads, rows, scale,
                    Precision::BF16);
    EXPECT_LT(rel_max_err(down<float>(dout, want.size()), want), 1e-4) << what;

    // A whole prefill (every row at its position): from 64 rows on, through cuBLAS with
    // bf16 inputs to both products (attention_gemm.cuh), so within bf16's rounding.
    {
      std::vector<int32_t> all(static_cast<size_t>(rows));
      for (int64_t t = 0; t < rows; ++t) all[static_cast<size_t>(t)] = static_cast<int32_t>(t);
      const auto qa = random_vec(static_cast<size_t>(rows * q_heads * hd), 21);
      std::vector<float> want_all(qa.size());
      cpu->attention(qa.data(), all.data(), host.view, want_all.data(), rows, q_heads, rows, scale, Precision::F32);
      const auto dqa = up(qa), dall = up(all);
      auto dout_all = zeros(want_all.size() * sizeof(float));
      cuda->attention(dqa.as<float>(), dall.as<int32_t>(), dev.view, dout_all.as<float>(), rows, q_heads, rows, scale,
                      Precision::BF16);
      EXPECT_LT(rel_max_err(down<float>(dout_all, want_all.size()), want_all), 2e-2) << what << ": prefill through cuBLAS";
    }

    // Decode rows, each its own cache (the same pool, different lengths).
    std::vector<KvView> views(3, host.view), dev_views(3, dev.view);
    const std::vector<int32_t> dpos3 = {202, 17, 99};
    const auto q3 = random_vec(static_cast<size_t>(3 * q_heads * hd), 19);
    std::vector<float> want3(q3.size());
    cpu->attention_rows(q3.data(), dpos3.data(), views.data(), want3.data(), 3, q_heads, scale, Precision::F32);
    const auto dq3 = up(q3), dp3 = up(dpos3);
    auto dout3 = zeros(want3.size() * sizeof(float));
    cuda->attention_rows(dq3.as<float>(), dp3.as<int32_t>(), dev_views.data(), dout3.as<float>(), 3, q_heads, scale,
                         Precision::BF16);
    EXPECT_LT(rel_max_err(down<float>(dout3, want3.size()), want3), 1e-4) << what;

    // The blend's deviation of fresh rows against the cached ones.
    for (const KvDeviation which : {KvDeviation::K, KvDeviation::V, KvDeviation::KV}) {
      std::vector<double> want_dev(static_cast<size_t>(n));
      cpu->kv_deviation(host.view, pos.data(), nk.data(), nv.data(), n, which, want_dev.data());
      auto d_dev = zeros(want_dev.size() * sizeof(double));
      cuda->kv_deviation(dev.view, dpos.as<int32_t>(), dnk.as<float>(), dnv.as<float>(), n, which, d_dev.as<double>());
      const auto got = down<double>(d_dev, want_dev.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want_dev.data(), got.size() * sizeof(double))) << what;
    }

    // The attention the query rows pay each key (the blend's query-aware selection):
    // double atomics add in the scheduler's order, so within rounding of the CPU's.
    {
      std::vector<double> want_mass(static_cast<size_t>(rows));
      cpu->attention_mass(q.data(), qpos.data(), host.view, nq, q_heads, rows, scale, want_mass.data());
      auto d_mass = zeros(want_mass.size() * sizeof(double));
      cuda->attention_mass(dq.as<float>(), dqpos.as<int32_t>(), dev.view, nq, q_heads, rows, scale,
                           d_mass.as<double>());
      const auto got = down<double>(d_mass, want_mass.size());
      for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want_mass[j], 1e-5) << what << " key " << j;
    }

    // Delta-RoPE of a chunk's rows in place, both pools.
    RopeTable t;
    t.head_dim = hd;
    for (int i = 0; i < hd / 2; ++i) t.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / hd)));
    const auto cpu_t = cpu->prepare_rope(t), dev_t = cuda->prepare_rope(t);
    cpu->rope_kv_rows(host.view, 40, 120, 1234, *cpu_t);
    cuda->rope_kv_rows(dev.view, 40, 120, 1234, *dev_t);
    // The same fp32 (cos, sin); the rotation's products may be fused on one side and
    // not the other: equal within an fp32 rounding before the dtype's.
    const auto got_k = down<std::byte>(dev.k, host.k.size());
    const int64_t elements = static_cast<int64_t>(host.k.size()) / kv_dtype_bytes(dtype);
    std::vector<float> got_f(static_cast<size_t>(elements)), want_f(got_f.size());
    kv_to_fp32(dtype, got_k.data(), got_f.data(), elements);
    kv_to_fp32(dtype, host.k.data(), want_f.data(), elements);
    double worst = 0;
    for (size_t i = 0; i < got_f.size(); ++i)
      if (!std::isnan(want_f[i])) worst = std::max(worst, static_cast<double>(std::fabs(got_f[i] - want_f[i])));
    EXPECT_LT(worst, dtype == TensorType::F32 ? 1e-5 : dtype == TensorType::F16 ? 4e-3 : 3e-2) << what;
    EXPECT_EQ(down<std::byte>(dev.v, host.v.size()), host.v) << what << ": V untouched";

    // A position outside the cache: reported at the next wait, nothing written.
    const std::vector<int32_t> bad = {rows};
    const auto dbad = up(bad);
    cuda->store_kv(dev.view, dbad.as<int32_t>(), dnk.as<float>(), dnv.as<float>(), 1);
    EXPECT_THROW(cuda->synchronize(), std::out_of_range) << what;
  }

  std::mt19937 rng(20);
  std::vector<double> score(1000);
  for (auto& s : score) s = static_cast<double>(rng() % 13);
  score[3] = NAN;
  for (int64_t kk : {int64_t{0}, int64_t{1}, int64_t{150}, int64_t{1000}}) {
    std::vector<int32_t> want(static_cast<size_t>(kk));
    cpu->top_k(score.data(), 1000, kk, want.data());
    const auto ds = up(score);
    auto dk = zeros(std::max<size_t>(1, want.size()) * sizeof(int32_t));
    cuda->top_k(ds.as<double>(), 1000, kk, dk.as<int32_t>());
    EXPECT_EQ(down<int32_t>(dk, want.size()), want) << "k " << kk;
  }
}

// Sampling on the device picks the host's token (kernels/sampling.h) from the same
// logits and draw: greedy rows (ties to the lower index), temperature, top-k and top-p
// rows in one call, a vocabulary the size of Llama 3's.
// A batched decode step's store: each row into its own cache (separate pools, shuffled
// page tables, every dtype) in one call, the same bytes as the CPU's store_kv of each
// row alone; a row outside its cache writes nothing and is reported at the next wait.
// Then the views the backend keeps on the device between a store and the attention
// after it (uploaded once when they are the same): attention over caches A after a
// store into caches B reads A, not B's views left from the store.
TEST_F(CudaBackendOps, StoreKvRowsWritesEachRowIntoItsOwnCache) {
  const int64_t kv_heads = 2, q_heads = 4, hd = 64, rows = 150, n = 3;
  const float scale = 0.125f;
  for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    const std::string what = kv_dtype_name(dtype);
    std::vector<test::PagedKv> hosts;
    std::vector<DevicePaged> devs;
    hosts.reserve(static_cast<size_t>(2 * n));  // the views point into each one's page table
    for (int64_t i = 0; i < 2 * n; ++i) {  // caches A = [0, n), B = [n, 2n)
      const auto k = random_vec(static_cast<size_t>(kv_heads * rows * hd), static_cast<uint32_t>(30 + i));
      const auto v = random_vec(k.size(), static_cast<uint32_t>(40 + i));
      hosts.push_back(test::make_paged(k, v, kv_heads, rows, hd, rows, 5, static_cast<uint32_t>(50 + i), 2, dtype));
    }
    for (auto& h : hosts) devs.push_back(on_device(h));
    std::vector<KvView> host_a, dev_a, dev_b;
    for (int64_t i = 0; i < n; ++i) {
      host_a.push_back(hosts[static_cast<size_t>(i)].view);
      dev_a.push_back(devs[static_cast<size_t>(i)].view);
      dev_b.push_back(devs[static_cast<size_t>(n + i)].view);
    }
    const std::vector<int32_t> pos = {149, 0, 77};
    const auto nk = random_vec(static_cast<size_t>(n * kv_heads * hd), 60), nv = random_vec(nk.size(), 61);
    for (int64_t i = 0; i < n; ++i)
      cpu->store_kv(host_a[static_cast<size_t>(i)], pos.data() + i, nk.data() + i * kv_heads * hd,
                    nv.data() + i * kv_heads * hd, 1);
    const auto dpos = up(pos), dnk = up(nk), dnv = up(nv);
    cuda->store_kv_rows(dev_a.data(), dpos.as<int32_t>(), dnk.as<float>(), dnv.as<float>(), n);
    for (int64_t i = 0; i < n; ++i) {
      const auto& h = hosts[static_cast<size_t>(i)];
      const auto& d = devs[static_cast<size_t>(i)];
      EXPECT_EQ(down<std::byte>(d.k, h.k.size()), h.k) << what << " row " << i;
      EXPECT_EQ(down<std::byte>(d.v, h.v.size()), h.v) << what << " row " << i;
    }

    // Store into B, then attend over A: A's views, not the ones the store left.
    const std::vector<int32_t> pos_b = {10, 20, 30};
    const auto dpos_b = up(pos_b);
    cuda->store_kv_rows(dev_b.data(), dpos_b.as<int32_t>(), dnk.as<float>(), dnv.as<float>(), n);
    const auto q = random_vec(static_cast<size_t>(n * q_heads * hd), 62);
    std::vector<float> want(q.size());
    cpu->attention_rows(q.data(), pos.data(), host_a.data(), want.data(), n, q_heads, scale, Precision::F32);
    const auto dq = up(q);
    auto dout = zeros(want.size() * sizeof(float));
    cuda->attention_rows(dq.as<float>(), dpos.as<int32_t>(), dev_a.data(), dout.as<float>(), n, q_heads, scale,
                         Precision::BF16);
    EXPECT_LT(rel_max_err(down<float>(dout, want.size()), want), 1e-4) << what;

    // Row 1 outside its cache: rows 0 and 2 written, row 1 not, the wait throws.
    const std::vector<int32_t> bad = {5, static_cast<int32_t>(rows), 6};
    const auto dbad = up(bad);
    for (int64_t i = 0; i < n; ++i)
      if (i != 1)
        cpu->store_kv(host_a[static_cast<size_t>(i)], bad.data() + i, nk.data() + i * kv_heads * hd,
                      nv.data() + i * kv_heads * hd, 1);
    cuda->store_kv_rows(dev_a.data(), dbad.as<int32_t>(), dnk.as<float>(), dnv.as<float>(), n);
    EXPECT_THROW(cuda->synchronize(), std::out_of_range) << what;
    for (int64_t i = 0; i < n; ++i) {
      const auto& h = hosts[static_cast<size_t>(i)];
      const auto& d = devs[static_cast<size_t>(i)];
      EXPECT_EQ(down<std::byte>(d.k, h.k.size()), h.k) << what << " row " << i << " after the bad store";
    }
  }
}

TEST_F(CudaBackendOps, SamplingPicksTheHostsTokens) {
  const int64_t vocab = 128256, n = 6;
  auto logits = random_vec(static_cast<size_t>(n * vocab), 22, 3.0f);
  logits[5] = logits[70000] = 100.0f;  // row 0: a tie for the maximum
  const auto d = up(logits);
  std::mt19937_64 rng(23);
  for (int round = 0; round < 20; ++round) {
    std::vector<SampleRow> rows = {{0.0f, 1.0f, 0, 0.0},
                                   {1.0f, 1.0f, 0, uniform_draw(rng)},
                                   {0.6f, 0.9f, 0, uniform_draw(rng)},
                                   {1.2f, 1.0f, 40, uniform_draw(rng)},
                                   {0.8f, 0.5f, 7, uniform_draw(rng)},
                                   {2.0f, 0.99f, 2000, uniform_draw(rng)}};
    std::vector<int32_t> got(static_cast<size_t>(n), -1);
    cuda->sample_rows(d.as<float>(), n, vocab, rows.data(), got.data());
    for (int64_t r = 0; r < n; ++r)
      EXPECT_EQ(got[r], pick_token(logits.data() + r * vocab, vocab, rows[static_cast<size_t>(r)]))
          << "round " << round << " row " << r;
    EXPECT_EQ(got[0], 5);
  }
}

// Greedy rows whatever the vocabulary: a multiple of 4 (16-byte loads) or not (one
// value at a time), the maximum first, last or tied (the lower index wins), a NaN at
// the front (kept, as std::max_element keeps it) or inside (never picked).
TEST_F(CudaBackendOps, GreedyPicksAreTheHostsForAnyVocabulary) {
  for (int64_t vocab : {1000, 1001, 4099, 128256}) {
    const int64_t n = 5;
    auto logits = random_vec(static_cast<size_t>(n * vocab), 31, 3.0f);
    logits[0] = 50.0f;                                              // row 0: the first
    logits[2 * vocab - 1] = 50.0f;                                  // row 1: the last
    logits[2 * vocab + 7] = logits[2 * vocab + vocab / 2] = 50.0f;  // row 2: a tie
    logits[3 * vocab] = std::nanf("");                              // row 3: NaN first
    logits[4 * vocab + 3] = std::nanf("");                          // row 4: NaN inside
    logits[4 * vocab + 9] = 50.0f;
    const auto d = up(logits);
    const std::vector<SampleRow> rows(static_cast<size_t>(n), SampleRow{0.0f, 1.0f, 0, 0.0});
    std::vector<int32_t> got(static_cast<size_t>(n), -1);
    cuda->sample_rows(d.as<float>(), n, vocab, rows.data(), got.data());
    for (int64_t r = 0; r < n; ++r)
      EXPECT_EQ(got[r], pick_token(logits.data() + r * vocab, vocab, rows[static_cast<size_t>(r)]))
          << "vocab " << vocab << " row " << r;
    EXPECT_EQ(got, (std::vector<int32_t>{0, static_cast<int32_t>(vocab - 1), 7, 0, 9})) << "vocab " << vocab;
  }
}

// A loader's copies: on its own stream through the pinned staging ring (more bytes than
// the ring holds), gated by an event the compute stream waits for.
TEST_F(CudaBackendOps, CopiesOnAStreamAreGatedByEvents) {
  const size_t count = (size_t{40} << 20) / sizeof(float) + 3;  // 40 MiB: the ring goes round
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 100003);
  auto dst = zeros(count * sizeof(float));
  auto copy_stream = cuda->make_stream();
  const auto copied = cuda->make_event();
  // In pieces, as a loader writes rows of heads; the host buffer is reused at once.
  std::vector<float> piece;
  for (size_t at = 0; at < count; at += 1000003) {
    const size_t len = std::min<size_t>(1000003, count - at);
    piece.assign(host.begin() + static_cast<std::ptrdiff_t>(at), host.begin() + static_cast<std::ptrdiff_t>(at + len));
    cuda->copy_to_backend(dst.as<float>() + at, piece.data(), static_cast<int64_t>(len * sizeof(float)),
                          copy_stream.get());
    std::fill(piece.begin(), piece.end(), -1.0f);  // the caller's memory is free on return
  }
  cuda->record(*copied, copy_stream.get());
  cuda->wait(*copied);  // the compute stream: what follows sees the bytes
  auto doubled = zeros(count * sizeof(float));
  cuda->copy_within(doubled.data(), dst.data(), static_cast<int64_t>(count * sizeof(float)));
  cuda->add(doubled.as<float>(), dst.as<float>(), static_cast<int64_t>(count));
  const auto got = down<float>(doubled, count);
  for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(got[i], 2.0f * host[i]) << i;
  ASSERT_EQ(got[count - 1], 2.0f * host[count - 1]);
}

// A stored chunk's layer written as one block on a loader's stream (one DMA, a scatter
// into the pages): the same pool bytes as the CPU's page-run copies, every dtype, head
// dims whose rows take 16-, 4- and 2-byte units, blocks that start and end inside
// pages; the host block is reusable on return; blocks of growing size (the stream's
// staging grows) one after another on the same stream.
TEST_F(CudaBackendOps, WriteKvBlockOnAStreamPlacesTheBlockAsTheCpu) {
  const int64_t kv_heads = 3, rows = 300;
  auto copy_stream = cuda->make_stream();
  const auto copied = cuda->make_event();
  for (const int64_t hd : {64, 6, 5})
    for (const TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
      const std::string what = std::string(kv_dtype_name(dtype)) + " head_dim " + std::to_string(hd);
      const auto k = random_vec(static_cast<size_t>(kv_heads * rows * hd), 70);
      const auto v = random_vec(k.size(), 71);
      auto host = test::make_paged(k, v, kv_heads, rows, hd, rows, 5, 72, 3, dtype);
      auto dev = on_device(host);
      const int64_t eb = kv_dtype_bytes(dtype);
      for (const auto& [first, m] : std::vector<std::pair<int64_t, int64_t>>{{0, 32}, {7, 100}, {33, 267}}) {
        std::vector<std::byte> bk(static_cast<size_t>(kv_heads * m * hd * eb)), bv(bk.size());
        std::mt19937 rng(static_cast<uint32_t>(first + m));
        for (auto& b : bk) b = static_cast<std::byte>(rng() & 0x3f);  // finite in every dtype
        for (auto& b : bv) b = static_cast<std::byte>(rng() & 0x3f);
        cpu->write_kv_block(host.view, first, m, bk.data(), bv.data());
        cuda->write_kv_block(dev.view, first, m, bk.data(), bv.data(), copy_stream.get());
        std::fill(bk.begin(), bk.end(), std::byte{0xff});  // the caller's memory is free on return
        std::fill(bv.begin(), bv.end(), std::byte{0xff});
      }
      cuda->record(*copied, copy_stream.get());
      cuda->wait(*copied);
      EXPECT_EQ(down<std::byte>(dev.k, host.k.size()), host.k) << what;
      EXPECT_EQ(down<std::byte>(dev.v, host.v.size()), host.v) << what;
      EXPECT_THROW(cuda->write_kv_block(dev.view, rows - 1, 2, host.k.data(), host.v.data(), copy_stream.get()),
                   std::out_of_range);
    }
}

// A RAM-tier entry page-locked by pin_host is read in place (one DMA each for K and V,
// no staging copy): the same pool bytes as the CPU's; the pin is released after the
// stream drained; memory pinned twice is refused (nullptr), not an error.
TEST_F(CudaBackendOps, WriteKvBlockReadsPinnedMemoryInPlace) {
  const int64_t kv_heads = 4, rows = 600, hd = 128, first = 40, m = 512;
  const auto k = random_vec(static_cast<size_t>(kv_heads * rows * hd), 80);
  auto host = test::make_paged(k, random_vec(k.size(), 81), kv_heads, rows, hd, rows, 6, 82, 2, TensorType::F16);
  auto dev = on_device(host);
  const size_t bytes = static_cast<size_t>(kv_heads * m * hd * 2), page = 4096;
  const size_t alloc = (bytes + page - 1) / page * page;
  std::unique_ptr<std::byte, decltype(&std::free)> bk(static_cast<std::byte*>(std::aligned_alloc(page, alloc)), &std::free);
  std::unique_ptr<std::byte, decltype(&std::free)> bv(static_cast<std::byte*>(std::aligned_alloc(page, alloc)), &std::free);
  std::mt19937 rng(83);
  for (size_t i = 0; i < bytes; ++i) {
    bk.get()[i] = static_cast<std::byte>(rng() & 0x3f);
    bv.get()[i] = static_cast<std::byte>(rng() & 0x3f);
  }
  auto pin_k = cuda->pin_host(bk.get(), static_cast<int64_t>(alloc));
  auto pin_v = cuda->pin_host(bv.get(), static_cast<int64_t>(alloc));
  ASSERT_NE(pin_k, nullptr);
  ASSERT_NE(pin_v, nullptr);
  EXPECT_EQ(cuda->pin_host(bk.get(), static_cast<int64_t>(alloc)), nullptr) << "already registered";
  // What write_kv_block asks to read in place: pinned yes, pageable no.
  EXPECT_TRUE(cuda::is_page_locked(bk.get()));
  EXPECT_TRUE(cuda::is_page_locked(bv.get() + bytes / 2));
  const std::vector<std::byte> pageable(64);
  EXPECT_FALSE(cuda::is_page_locked(pageable.data()));
  auto copy_stream = cuda->make_stream();
  cpu->write_kv_block(host.view, first, m, bk.get(), bv.get());
  cuda->write_kv_block(dev.view, first, m, bk.get(), bv.get(), copy_stream.get());
  const auto copied = cuda->make_event();
  cuda->record(*copied, copy_stream.get());
  cuda->synchronize(*copied);
  pin_k.reset();
  pin_v.reset();
  EXPECT_FALSE(cuda::is_page_locked(bk.get())) << "unpinned with its handle";
  EXPECT_EQ(down<std::byte>(dev.k, host.k.size()), host.k);
  EXPECT_EQ(down<std::byte>(dev.v, host.v.size()), host.v);
}

}  // namespace
}  // namespace bs::kernels

int main(int argc, char** argv) {
  const int devices = bs::kernels::cuda::device_count();
  if (devices == 0) {
    std::printf("cuda_test_backend: no CUDA device (or no driver): skipped\n");
    return 77;
  }
  std::printf("cuda_test_backend: %s\n", bs::kernels::cuda::device_description(0).c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
