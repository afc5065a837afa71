// The decode and blend CUDA ops, one by one, against the CPU reference backend on
// random inputs (cuda_test_ops.cpp has the element-wise ops, attention and the
// products, the resources and the main; the backend-level checks are in
// tests/cuda_test_backend.cpp). Label "cuda".
#include "tests/cuda_ops_fixture.h"

namespace bs::kernels::cuda {
namespace {

using namespace ops_test;

template <typename T>
DeviceAllocation upload(OnDevice& dev, const std::vector<T>& host) {
  DeviceAllocation d(std::max<size_t>(1, host.size()) * sizeof(T));
  if (!host.empty())
    BS_CUDA_CHECK(cudaMemcpyAsync(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice,
                                  dev.stream.get()));
  return d;
}

template <typename T>
std::vector<T> download(OnDevice& dev, const DeviceAllocation& d, size_t count) {
  std::vector<T> host(count);
  if (count > 0)
    BS_CUDA_CHECK(cudaMemcpyAsync(host.data(), d.get(), count * sizeof(T), cudaMemcpyDeviceToHost, dev.stream.get()));
  dev.stream.synchronize();
  return host;
}

// Llama-3-like inverse frequencies: half of them scaled down.
RopeTable scaled_rope(RopeStyle style, int64_t head_dim) {
  RopeTable table;
  table.style = style;
  table.head_dim = static_cast<int>(head_dim);
  for (int64_t i = 0; i < head_dim / 2; ++i)
    table.inv_freq.push_back(
        static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim)) *
                           (i < head_dim / 4 ? 1.0 : 0.125)));
  return table;
}

const char* dtype_label(TensorType dtype) { return kv_dtype_name(dtype); }

// (cos, sin) computed on the device in double from pos * inv_freq, rounded to fp32 (the
// CPU backend's RoPE cache arithmetic), then an fp32 rotation: the CPU backend's result
// within an fp32 rounding of the row (the rotation's products may be fused on one side
// only; a double cos/sin may differ in its last bit). Odd n, negative and large positions.
TEST_F(CudaOps, RopeAtPositionsMatchesTheCpuBackend) {
  auto cpu = make_cpu_backend();
  const std::vector<int32_t> pos = {0, 1, -7, 8191, -3000, 511, 12, 4096, -20000};
  const int64_t n = static_cast<int64_t>(pos.size()), heads = 3;
  const auto dpos = upload(dev, pos);
  for (int64_t head_dim : {64, 80, 128})
    for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
      const RopeTable table = scaled_rope(style, head_dim);
      auto prepared = cpu->prepare_rope(table);
      auto x = random_vec(static_cast<size_t>(n * heads * head_dim), 30);
      auto dx = dev.up(x), dfreq = dev.up(table.inv_freq);
      cpu->rope(x.data(), pos.data(), n, heads, *prepared);
      rope_at_positions(dx.as<float>(), dpos.as<int32_t>(), dfreq.as<float>(), n, heads, head_dim,
                        style == RopeStyle::Interleaved, dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dx), x), 1e-6) << "head_dim " << head_dim << " style " << static_cast<int>(style);
    }
}

// Delta-RoPE of cached rows [first, first + m) in every dtype, both pair layouts, shuffled
// pages with a partial last one: K within the dtype's rounding of the reference (which
// rotates in double by the double cos/sin; the device rotates in fp32 by the fp32 values
// the backend uploads), every element compared, spare pages still NaN; V byte-identical.
TEST_F(CudaOps, RopeKvRowsMatchesTheReferenceInEveryDtype) {
  const int64_t kv_heads = 3, rows = 77, first = 5, m = 60;
  const int32_t delta = -37;
  for (int64_t head_dim : {64, 128})
    for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16})
      for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
        const auto k = random_vec(static_cast<size_t>(kv_heads * rows * head_dim), 31);
        const auto v = random_vec(k.size(), 32);
        auto host = test::make_paged(k, v, kv_heads, rows, head_dim, rows, 4, 33, 2, dtype);
        auto d = upload_paged(dev, host);
        const RopeTable table = scaled_rope(style, head_dim);
        auto prepared = ref->prepare_rope(table);
        std::vector<float> cos_sin(static_cast<size_t>(head_dim));
        for (int64_t i = 0; i < head_dim / 2; ++i) {
          const double a = static_cast<double>(delta) * table.inv_freq[static_cast<size_t>(i)];
          cos_sin[static_cast<size_t>(2 * i)] = static_cast<float>(std::cos(a));
          cos_sin[static_cast<size_t>(2 * i + 1)] = static_cast<float>(std::sin(a));
        }
        auto dcs = dev.up(cos_sin);
        ref->rope_kv_rows(host.view, first, m, delta, *prepared);
        rope_kv_rows(d.view, first, m, dcs.as<float>(), style == RopeStyle::Interleaved, dev.stream.get());
        const auto gk = download<std::byte>(dev, d.k, host.k.size());
        const auto gv = download<std::byte>(dev, d.v, host.v.size());
        const std::string what = std::string(dtype_label(dtype)) + " head_dim " + std::to_string(head_dim) +
                                 " style " + std::to_string(static_cast<int>(style));
        EXPECT_TRUE(gv == host.v) << what << ": V untouched";
        const int64_t elements = static_cast<int64_t>(host.k.size()) / kv_dtype_bytes(dtype);
        std::vector<float> got(static_cast<size_t>(elements)), want(got.size());
        kv_to_fp32(dtype, gk.data(), got.data(), elements);
        kv_to_fp32(dtype, host.k.data(), want.data(), elements);
        // One unit in the dtype's last place of |want| (F32: a few fp32 roundings of the row).
        const double r = dtype == TensorType::F32 ? 1e-6 : dtype == TensorType::F16 ? 1e-3 : 8e-3;
        int64_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isnan(want[i])) {
            bad += std::isnan(got[i]) ? 0 : 1;
            continue;
          }
          if (!(std::fabs(got[i] - want[i]) <= r * (std::fabs(want[i]) + 4.0))) ++bad;
        }
        EXPECT_EQ(bad, 0) << what;
      }
}

// One thread per token in the reference's order with no fused multiply-add: every sum
// bit-identical to the reference's, K, V or both, every dtype, GQA-sized rows
// (4 KV heads of 80); a position outside the cache (-1, capacity) reads nothing and gets NaN.
TEST_F(CudaOps, KvDeviationIsBitIdenticalToTheReferenceAndNaNOutsideTheCache) {
  const int64_t kv_heads = 4, head_dim = 80, rows = 45;
  const std::vector<int32_t> pos = {44, 0, -1, 17, 45, 16, 3};
  const int64_t n = static_cast<int64_t>(pos.size()), width = kv_heads * head_dim;
  const auto dpos = upload(dev, pos);
  for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    const auto k = random_vec(static_cast<size_t>(kv_heads * rows * head_dim), 34);
    const auto v = random_vec(k.size(), 35);
    auto host = test::make_paged(k, v, kv_heads, rows, head_dim, rows, 3, 36, 2, dtype);
    auto d = upload_paged(dev, host);
    const auto fk = random_vec(static_cast<size_t>(n * width), 37), fv = random_vec(fk.size(), 38);
    auto dfk = dev.up(fk), dfv = dev.up(fv);
    for (KvDeviation which : {KvDeviation::K, KvDeviation::V, KvDeviation::KV}) {
      std::vector<double> want(static_cast<size_t>(n), 0.0);
      for (int64_t t = 0; t < n; ++t)  // the reference refuses a bad position: ask for the good ones
        if (pos[t] >= 0 && pos[t] < rows)
          ref->kv_deviation(host.view, &pos[t], fk.data() + t * width, fv.data() + t * width, 1, which, &want[t]);
      DeviceAllocation dout(static_cast<size_t>(n) * sizeof(double));
      kv_deviation(d.view, dpos.as<int32_t>(), dfk.as<float>(), dfv.as<float>(), n, which != KvDeviation::V,
                   which != KvDeviation::K, dout.as<double>(), dev.stream.get());
      const auto got = download<double>(dev, dout, static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) {
        if (pos[t] >= 0 && pos[t] < rows)
          EXPECT_EQ(std::memcmp(&got[t], &want[t], sizeof(double)), 0)
              << dtype_label(dtype) << " which " << static_cast<int>(which) << " t " << t << ": " << got[t]
              << " vs " << want[t];
        else
          EXPECT_TRUE(std::isnan(got[t])) << dtype_label(dtype) << " t " << t;
      }
    }
  }
}

// Rank counting gives the reference's order exactly: many equal scores (by lower
// index), -0 equal to +0, infinities, NaNs at the ends and scattered (below every
// number, among themselves by lower index); k = 0, 1, n / 2, n; odd sizes and one
// beyond a shared-memory tile.
TEST_F(CudaOps, TopKIsTheReferencesOrderWithTiesAndNaNs) {
  std::mt19937 rng(39);
  for (int64_t n : {1, 7, 257, 5003}) {
    std::vector<double> score(static_cast<size_t>(n));
    for (auto& s : score) s = static_cast<double>(static_cast<int>(rng() % 9) - 4);
    for (int64_t i = 0; i < n; i += 97) score[static_cast<size_t>(i)] = NAN;
    score[static_cast<size_t>(n - 1)] = NAN;
    if (n > 6) {
      score[2] = -0.0;
      score[4] = 0.0;
      score[5] = INFINITY;
      score[6] = -INFINITY;
    }
    const auto dscore = upload(dev, score);
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 2, n}) {
      std::vector<int32_t> want(static_cast<size_t>(k));
      ref->top_k(score.data(), n, k, want.data());
      DeviceAllocation dout(std::max<size_t>(1, want.size()) * sizeof(int32_t));
      top_k(dscore.as<double>(), n, k, dout.as<int32_t>(), dev.stream.get());
      EXPECT_EQ(download<int32_t>(dev, dout, want.size()), want) << "n " << n << " k " << k;
    }
  }
  EXPECT_THROW(top_k(nullptr, 5, 6, nullptr, dev.stream.get()), std::invalid_argument);
  EXPECT_THROW(top_k(nullptr, 5, -1, nullptr, dev.stream.get()), std::invalid_argument);
}

// Batched decode rows, each over its own paged cache (its own rows, shuffled pages, a
// partial last page, sometimes rows past the query's position that must be ignored):
// contexts from 1 key to 8192 (the split-K path at its most splits), lengths around the
// 32-key chunks and 64-key splits, capacities far past the length, GQA 3:1 and 4:1,
// head_dim 64, 80 and 128, every dtype, against the reference in double. Tolerances:
// 1e-5 of the largest output over the batch, and 1e-4 of each row's own largest (the
// long rows' averages over thousands of keys are small).
TEST_F(CudaOps, AttentionRowsMatchesTheReferenceShortAndLongContexts) {
  struct Shape { int64_t q_heads, kv_heads, head_dim; };
  // Short and long rows; then rows around the 32-key chunks and 64-key splits. Every
  // third row's capacity is 700 beyond its length (its splits follow the length).
  const std::vector<std::vector<int32_t>> batches = {{8191, 0, 300, 4100, 1}, {63, 64, 65, 255, 256, 257, 31, 32}};
  DeviceAllocation scratch;
  for (const std::vector<int32_t>& qpos : batches) {
    const int64_t n = static_cast<int64_t>(qpos.size());
    const auto dqpos = upload(dev, qpos);
    for (const Shape sh : {Shape{9, 3, 64}, Shape{8, 2, 128}, Shape{6, 2, 80}})
      for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
        std::vector<test::PagedKv> hosts;
        std::vector<DevicePaged> devs;
        hosts.reserve(static_cast<size_t>(n));
        devs.reserve(static_cast<size_t>(n));
        std::vector<KvView> views;
        std::vector<DevicePagedKv> dviews;
        int64_t max_keys = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t rows = qpos[i] + 1 + (i % 2 == 1 ? 5 : 0) + (i % 3 == 2 ? 700 : 0);
          max_keys = std::max(max_keys, rows);
          const auto k =
              random_vec(static_cast<size_t>(sh.kv_heads * rows * sh.head_dim), static_cast<uint32_t>(40 + i));
          const auto v = random_vec(k.size(), static_cast<uint32_t>(50 + i));
          hosts.push_back(test::make_paged(k, v, sh.kv_heads, rows, sh.head_dim, rows, 6, static_cast<uint32_t>(60 + i),
                                           2, dtype));
          devs.push_back(upload_paged(dev, hosts.back()));
          views.push_back(hosts.back().view);
          dviews.push_back(devs.back().view);
        }
        const auto q = random_vec(static_cast<size_t>(n * sh.q_heads * sh.head_dim), 70, 2.0f);
        const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
        std::vector<float> want(q.size());
        ref->attention_rows(q.data(), qpos.data(), views.data(), want.data(), n, sh.q_heads, scale, Precision::F32);
        auto dq = dev.up(q);
        const auto dviews_dev = upload(dev, dviews);
        DeviceAllocation dout(want.size() * sizeof(float));
        attention_rows(dq.as<float>(), dqpos.as<int32_t>(), dviews_dev.as<DevicePagedKv>(), dout.as<float>(), n,
                       sh.q_heads, sh.kv_heads, sh.head_dim, scale, max_keys, scratch, dev.stream.get());
        const auto got = dev.down(dout);
        const std::string what = std::string(dtype_label(dtype)) + " q_heads " + std::to_string(sh.q_heads) +
                                 " kv_heads " + std::to_string(sh.kv_heads) + " head_dim " +
                                 std::to_string(sh.head_dim);
        EXPECT_LT(rel_max_err(got, want), 1e-5) << what;
        const size_t per_row = static_cast<size_t>(sh.q_heads * sh.head_dim);
        for (int64_t i = 0; i < n; ++i) {
          const std::vector<float> g(got.begin() + i * per_row, got.begin() + (i + 1) * per_row);
          const std::vector<float> w(want.begin() + i * per_row, want.begin() + (i + 1) * per_row);
          EXPECT_LT(rel_max_err(g, w), 1e-4) << what << " row " << i << " (" << qpos[i] + 1 << " keys)";
        }
      }
  }
  EXPECT_THROW(attention_rows(nullptr, nullptr, nullptr, nullptr, 1, 6, 4, 64, 1.0f, 1, scratch, dev.stream.get()),
               std::invalid_argument);  // 6 query heads over 4 KV heads
  EXPECT_THROW(attention_rows(nullptr, nullptr, nullptr, nullptr, 1, 4, 4, 288, 1.0f, 1, scratch, dev.stream.get()),
               std::invalid_argument);  // head_dim > 256
}

// The decode GEMV: each row's sum in an order that does not depend on the row count, so
// row i of a kGemvMaxRows (64)-row product is bit-identical to row i alone, to rows 3..7
// as 5 rows, rows 0..32 as 33 (crossing the 32/64 row buckets) and rows 40..48 as 9 (the
// Backend's linear_exact_rows contract); with and without bias; in_features a multiple
// of 8 (16-byte loads) and not (the element path); 8200 features: enough blocks that
// each bucket's kernel takes several features per warp, the last warp's partly past the
// end; within bf16's rounding of the reference's exact product.
TEST_F(CudaOps, GemvRowsAreBitIdenticalWhateverTheRowCount) {
  const int64_t rows = kGemvMaxRows;
  DeviceAllocation scratch;  // x as bf16, shared by the calls as the backend shares it
  for (auto [out, in] : {std::pair<int64_t, int64_t>{70, 96}, {70, 100}, {70, 1000}, {8200, 96}}) {
    SCOPED_TRACE("out " + std::to_string(out));
    const auto wf = random_vec(static_cast<size_t>(out * in), 80);
    auto stored = dev.up(wf);
    const Bf16Weights w = weights_to_bf16(TensorType::F32, stored.get(), out, in, dev.stream.get());
    auto pr = ref->prepare(WeightView{TensorType::F32, wf.data(), out, in}, Precision::F32);
    const auto x = random_vec(static_cast<size_t>(rows * in), 81), bias = random_vec(static_cast<size_t>(out), 82);
    auto dx = dev.up(x), dbias = dev.up(bias);
    for (bool with_bias : {false, true}) {
      const float* b = with_bias ? dbias.as<float>() : nullptr;
      DeviceAllocation dall(static_cast<size_t>(rows * out) * sizeof(float));
      gemv_bf16(w, dx.as<float>(), dall.as<float>(), rows, b, scratch, dev.stream.get());
      const auto all = dev.down(dall);
      std::vector<float> want(all.size());
      ref->linear(*pr, x.data(), want.data(), rows, with_bias ? bias.data() : nullptr);
      EXPECT_LT(rel_max_err(all, want), 2e-2) << "in " << in;
      for (int64_t i = 0; i < rows; ++i) {
        DeviceAllocation done(static_cast<size_t>(out) * sizeof(float));
        gemv_bf16(w, dx.as<float>() + i * in, done.as<float>(), 1, b, scratch, dev.stream.get());
        const auto one = dev.down(done);
        EXPECT_EQ(std::memcmp(one.data(), all.data() + i * out, static_cast<size_t>(out) * sizeof(float)), 0)
            << "in " << in << " bias " << with_bias << " row " << i << " alone";
      }
      for (auto [first, count] : {std::pair<int64_t, int64_t>{3, 5}, {0, 33}, {40, 9}}) {
        DeviceAllocation dpart(static_cast<size_t>(count * out) * sizeof(float));
        gemv_bf16(w, dx.as<float>() + first * in, dpart.as<float>(), count, b, scratch, dev.stream.get());
        const auto part = dev.down(dpart);
        EXPECT_EQ(std::memcmp(part.data(), all.data() + first * out, part.size() * sizeof(float)), 0)
            << "in " << in << " bias " << with_bias << ": rows " << first << ".." << first + count - 1 << " as "
            << count << " rows";
      }
    }
    EXPECT_THROW(gemv_bf16(w, dx.as<float>(), nullptr, 0, nullptr, scratch, dev.stream.get()),
                 std::invalid_argument);
    EXPECT_THROW(gemv_bf16(w, dx.as<float>(), nullptr, rows + 1, nullptr, scratch, dev.stream.get()),
                 std::invalid_argument);
  }
}

// Positions outside [0, capacity) write nothing: the pools' bytes (spare pages NaN
// included) equal the reference's after storing only the rows inside, every dtype.
TEST_F(CudaOps, StoreKvSkipsPositionsOutsideTheCache) {
  const int64_t kv_heads = 2, head_dim = 64, rows = 40, width = kv_heads * head_dim;
  const std::vector<int32_t> pos = {-1, 7, 40, 39, 100000, -100000};
  const int64_t n = static_cast<int64_t>(pos.size());
  const auto dpos = upload(dev, pos);
  for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    const std::vector<float> zeros(static_cast<size_t>(kv_heads * rows * head_dim), 0.0f);
    auto host = test::make_paged(zeros, zeros, kv_heads, rows, head_dim, rows, 3, 41, 2, dtype);
    auto d = upload_paged(dev, host);
    const auto k = random_vec(static_cast<size_t>(n * width), 42), v = random_vec(k.size(), 43);
    for (int64_t t = 0; t < n; ++t)
      if (pos[t] >= 0 && pos[t] < rows)
        ref->store_kv(host.view, &pos[t], k.data() + t * width, v.data() + t * width, 1);
    auto dk = dev.up(k), dv = dev.up(v);
    store_kv(d.view, dpos.as<int32_t>(), dk.as<float>(), dv.as<float>(), n, dev.stream.get());
    EXPECT_TRUE(download<std::byte>(dev, d.k, host.k.size()) == host.k) << dtype_label(dtype);
    EXPECT_TRUE(download<std::byte>(dev, d.v, host.v.size()) == host.v) << dtype_label(dtype);
  }
}

}  // namespace
}  // namespace bs::kernels::cuda
