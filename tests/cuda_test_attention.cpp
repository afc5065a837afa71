// The fused prefill attention (kernels/cuda/attention_flash.cuh) against the CPU
// reference backend's attention in fp32/double: every KV dtype, head_dim 64 and 128,
// GQA groups of 3 and 4, over paged caches (pages shuffled in the pool, spare pages and
// the rows past the cache NaN). Q, K, V and P go through bf16, so the bound is bf16's
// (2e-2 relative, as the cuBLAS attention path in cuda_test_backend.cpp). The output is
// poisoned with NaN before each call: a row the kernel leaves unwritten fails. Label
// "cuda": without a GPU (or a driver) the binary prints why and exits 77, which CTest
// reports as skipped. Its own main; not named test_* (the unit-test glob leaves it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_gemm.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/linear.cuh"
#include "kernels/kv_view.h"
#include "tests/paged_kv.h"
#include "tests/random_data.h"

namespace bs::kernels::cuda {
namespace {

using test::random_vec;
using test::rel_max_err;

constexpr double kBf16Tolerance = 2e-2;  // bf16 inputs to both products, as cuda_test_backend's GEMM path

// Host values on the device and back, on one stream.
struct OnDevice {
  CudaStream stream;
  template <typename T>
  DeviceAllocation up(const std::vector<T>& host) {
    DeviceAllocation d(host.size() * sizeof(T));
    BS_CUDA_CHECK(cudaMemcpyAsync(d.get(), host.data(), d.bytes(), cudaMemcpyHostToDevice, stream.get()));
    return d;
  }
  std::vector<float> down(const DeviceAllocation& d) {
    std::vector<float> host(d.bytes() / sizeof(float));
    BS_CUDA_CHECK(cudaMemcpyAsync(host.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost, stream.get()));
    stream.synchronize();
    return host;
  }
};

// A host paged cache copied to the device with its page table (as cuda_test_ops.cpp's
// upload_paged). `shift` bytes of offset put the pools at an address that is not
// 16-byte aligned (the kernel's element-by-element path) when it is not a multiple of 16.
struct DevicePaged {
  DeviceAllocation k, v, pages;
  DevicePagedKv view;
};
DevicePaged upload_paged(OnDevice& dev, const test::PagedKv& host, size_t shift = 0) {
  DevicePaged d{DeviceAllocation(host.k.size() + shift), DeviceAllocation(host.v.size() + shift),
                DeviceAllocation(host.pages.size() * sizeof(int32_t)), {}};
  auto s = dev.stream.get();
  auto* k = static_cast<std::byte*>(d.k.get()) + shift;
  auto* v = static_cast<std::byte*>(d.v.get()) + shift;
  BS_CUDA_CHECK(cudaMemcpyAsync(k, host.k.data(), host.k.size(), cudaMemcpyHostToDevice, s));
  BS_CUDA_CHECK(cudaMemcpyAsync(v, host.v.data(), host.v.size(), cudaMemcpyHostToDevice, s));
  BS_CUDA_CHECK(cudaMemcpyAsync(d.pages.get(), host.pages.data(), d.pages.bytes(), cudaMemcpyHostToDevice, s));
  KvView on_device = host.view;
  on_device.k = k;
  on_device.v = v;
  d.view = device_view(on_device, d.pages.as<int32_t>());
  return d;
}

std::vector<int32_t> positions(int32_t first, int32_t count) {
  std::vector<int32_t> p(static_cast<size_t>(count));
  std::iota(p.begin(), p.end(), first);
  return p;
}

class CudaAttention : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> ref = make_reference_backend();
  OnDevice dev;

  // A cache of `rows` keys per KV head (pages of 32 positions, the last one partial)
  // in `dtype`, on the host and on the device.
  struct Cache {
    test::PagedKv host;
    DevicePaged dev;
  };
  Cache cache(int64_t kv_heads, int64_t head_dim, int64_t rows, TensorType dtype, uint32_t seed, size_t shift = 0) {
    const auto k = random_vec(static_cast<size_t>(kv_heads * rows * head_dim), seed);
    const auto v = random_vec(k.size(), seed + 1);
    Cache c{test::make_paged(k, v, kv_heads, rows, head_dim, rows, 5, seed + 2, 3, dtype), {}};
    c.dev = upload_paged(dev, c.host, shift);
    return c;
  }

  // attention_flash of random queries at `qpos` over the first n_kv keys of `c`
  // against the reference: within bf16's bound, every element written and finite, rows
  // with no key exactly zero.
  void expect_matches(const Cache& c, int64_t q_heads, const std::vector<int32_t>& qpos, int64_t n_kv,
                      uint32_t seed, const std::string& what) {
    const int64_t n = static_cast<int64_t>(qpos.size()), hd = c.host.view.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const auto q = random_vec(static_cast<size_t>(n * q_heads * hd), seed);
    std::vector<float> want(q.size());
    ref->attention(q.data(), qpos.data(), c.host.view, want.data(), n, q_heads, n_kv, scale, Precision::F32);
    auto dq = dev.up(q), dpos = dev.up(qpos);
    DeviceAllocation dout(want.size() * sizeof(float));
    BS_CUDA_CHECK(cudaMemsetAsync(dout.get(), 0xFF, dout.bytes(), dev.stream.get()));  // NaN
    attention_flash(dq.as<float>(), dpos.as<int32_t>(), c.dev.view, dout.as<float>(), n, q_heads, n_kv, scale,
                    dev.stream.get());
    const auto got = dev.down(dout);
    // rel_max_err skips NaN (std::max keeps the first operand): count them apart.
    int64_t not_finite = 0, nonzero_keyless = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < q_heads * hd; ++e) {
        const float x = got[static_cast<size_t>(t * q_heads * hd + e)];
        if (!std::isfinite(x)) ++not_finite;
        if ((qpos[static_cast<size_t>(t)] < 0 || n_kv == 0) && x != 0.0f) ++nonzero_keyless;
      }
    const std::string where = what + " (" + kv_dtype_name(c.host.view.dtype) + ", head_dim " + std::to_string(hd) +
                              ", " + std::to_string(q_heads) + "/" + std::to_string(c.host.view.kv_heads) +
                              " heads, " + std::to_string(n) + " rows, n_kv " + std::to_string(n_kv) + ")";
    EXPECT_EQ(not_finite, 0) << where;
    EXPECT_EQ(nonzero_keyless, 0) << where;
    EXPECT_LT(rel_max_err(got, want), kBf16Tolerance) << where;
  }
};

constexpr TensorType kDtypes[] = {TensorType::F32, TensorType::F16, TensorType::BF16};

struct Heads {
  int64_t q_heads, kv_heads, head_dim;
};
// SmolLM2 (groups of 3, head_dim 64) and the Llama 3 8B shape (groups of 4, 128), small.
constexpr Heads kShapes[] = {{9, 3, 64}, {8, 2, 128}};

// Every row of a 150- and a 300-key prompt (neither a multiple of 64), the blend's
// selected rows (out of order), one row, rows without a key, and n_kv below the rows'
// positions (cut by n_kv).
TEST_F(CudaAttention, PrefillAndSelectedRowsMatchTheReference) {
  uint32_t seed = 100;
  for (const TensorType dtype : kDtypes)
    for (const Heads& s : kShapes) {
      const auto c150 = cache(s.kv_heads, s.head_dim, 150, dtype, seed += 10);
      expect_matches(c150, s.q_heads, positions(0, 150), 150, ++seed, "every row of 150");
      expect_matches(c150, s.q_heads, {149, 3, 77, 0, 31, 32}, 150, ++seed, "selected rows");
      expect_matches(c150, s.q_heads, {149}, 150, ++seed, "one row");
      expect_matches(c150, s.q_heads, {-1, 5, -1, 149, 64, -7}, 150, ++seed, "rows without a key");
      expect_matches(c150, s.q_heads, positions(0, 150), 100, ++seed, "every row of 150 cut at n_kv 100");
      expect_matches(c150, s.q_heads, {149, 3, 77, 0, 31, 32, 96, 97}, 97, ++seed, "selected rows cut at n_kv 97");
      expect_matches(c150, s.q_heads, {5, 9}, 0, ++seed, "no cached key");
      const auto c300 = cache(s.kv_heads, s.head_dim, 300, dtype, seed += 10);
      expect_matches(c300, s.q_heads, positions(0, 300), 300, ++seed, "every row of 300");
      expect_matches(c300, s.q_heads, {299, 150, 0, 63, 64, 65, 128, 200, 1}, 300, ++seed, "selected rows of 300");
    }
}

// The Llama 3 8B head counts (32 query heads over 8 KV heads): a few rows.
TEST_F(CudaAttention, WideGroupsOfFewRowsMatchTheReference) {
  uint32_t seed = 300;
  for (const TensorType dtype : kDtypes) {
    const auto c = cache(8, 128, 150, dtype, seed += 10);
    expect_matches(c, 32, {149, 3, 77, 0, 31, 32}, 150, ++seed, "selected rows");
    expect_matches(c, 32, {149}, 150, ++seed, "one row");
    expect_matches(c, 32, {-1, 100}, 150, ++seed, "a row without a key");
    expect_matches(c, 32, positions(0, 20), 150, ++seed, "the first 20 rows");
  }
}

// A long prefill continuing a cached prompt: rows at positions 1000..1999 over 2000
// cached keys (many key tiles per block, the online softmax's rescaling).
TEST_F(CudaAttention, LongPrefillOverACachedPrefixMatchesTheReference) {
  uint32_t seed = 400;
  for (const TensorType dtype : kDtypes)
    for (const Heads& s : kShapes) {
      const auto c = cache(s.kv_heads, s.head_dim, 2000, dtype, seed += 10);
      expect_matches(c, s.q_heads, positions(1000, 1000), 2000, ++seed, "1000 rows after 1000 cached keys");
    }
}

// Pools at an address that is not 16-byte aligned: the element-by-element loads.
TEST_F(CudaAttention, UnalignedPoolsMatchTheReference) {
  uint32_t seed = 500;
  for (const TensorType dtype : kDtypes)
    for (const Heads& s : kShapes) {
      const auto c = cache(s.kv_heads, s.head_dim, 150, dtype, seed += 10,
                           static_cast<size_t>(kv_dtype_bytes(dtype)));
      expect_matches(c, s.q_heads, positions(0, 150), 150, ++seed, "every row of 150, unaligned pools");
      expect_matches(c, s.q_heads, {149, 3, 77, 0, 31, 32}, 150, ++seed, "selected rows, unaligned pools");
    }
}

// Sizes too large for the CPU reference: attention_flash against attention_gemm (both
// bf16 products; they differ by where they round), and both timed, printed for the
// backend's choice between them (not asserted). F16 KV, the runtime's default.
TEST_F(CudaAttention, AgreesWithTheGemmPathAtLargeSizesAndPrintsTimings) {
  struct Case {
    Heads heads;
    int64_t n_kv;
    std::vector<int32_t> qpos;
    const char* what;
  };
  std::vector<int32_t> every_4th_of_8192;  // a blend's selected rows: spread over a long prompt
  for (int32_t p = 3; p < 8192; p += 4) every_4th_of_8192.push_back(p);
  const std::vector<Case> cases = {
      {{32, 8, 128}, 256, positions(0, 256), "prefill 256"},
      {{32, 8, 128}, 2048, positions(0, 2048), "prefill 2048"},
      {{32, 8, 128}, 8192, positions(0, 8192), "prefill 8192"},
      {{32, 8, 128}, 8192, every_4th_of_8192, "2048 selected rows of 8192"},
      {{32, 8, 128}, 8192, positions(8192 - 64, 64), "last 64 rows of 8192"},
      {{32, 8, 128}, 8192, positions(8192 - 256, 256), "last 256 rows of 8192"},
      {{9, 3, 64}, 4096, positions(0, 4096), "prefill 4096, 9/3 heads of 64"},
  };
  CublasHandle cublas(dev.stream.get());
  AttentionGemmScratch scratch;
  uint32_t seed = 600;
  for (const Case& c : cases) {
    const Heads& h = c.heads;
    const auto kvc = cache(h.kv_heads, h.head_dim, c.n_kv, TensorType::F16, seed += 10);
    const int64_t n = static_cast<int64_t>(c.qpos.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(h.head_dim));
    const auto q = random_vec(static_cast<size_t>(n * h.q_heads * h.head_dim), ++seed);
    auto dq = dev.up(q), dpos = dev.up(c.qpos);
    DeviceAllocation flash_out(q.size() * sizeof(float)), gemm_out(q.size() * sizeof(float));
    BS_CUDA_CHECK(cudaMemsetAsync(flash_out.get(), 0xFF, flash_out.bytes(), dev.stream.get()));
    auto flash = [&] {
      attention_flash(dq.as<float>(), dpos.as<int32_t>(), kvc.dev.view, flash_out.as<float>(), n, h.q_heads, c.n_kv,
                      scale, dev.stream.get());
    };
    auto gemm = [&] {
      attention_gemm(cublas, dq.as<float>(), dpos.as<int32_t>(), kvc.dev.view, gemm_out.as<float>(), n, h.q_heads,
                     c.n_kv, scale, scratch, dev.stream.get());
    };
    // Milliseconds per call, the mean of 5 after one warm-up call.
    auto time = [&](const auto& call) {
      call();
      CudaEvent start(true), stop(true);
      start.record(dev.stream.get());
      for (int i = 0; i < 5; ++i) call();
      stop.record(dev.stream.get());
      stop.synchronize();
      float ms = 0.0f;
      BS_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
      return ms / 5.0f;
    };
    const float flash_ms = time(flash), gemm_ms = time(gemm);
    const auto got = dev.down(flash_out), want = dev.down(gemm_out);
    int64_t not_finite = 0;
    for (const float x : got) not_finite += std::isfinite(x) ? 0 : 1;
    EXPECT_EQ(not_finite, 0) << c.what;
    EXPECT_LT(rel_max_err(got, want), kBf16Tolerance) << c.what;
    std::printf("attention %-34s q %2lld/%lld heads of %3lld, %5lld rows, n_kv %5lld: flash %8.3f ms, gemm %8.3f ms\n",
                c.what, static_cast<long long>(h.q_heads), static_cast<long long>(h.kv_heads),
                static_cast<long long>(h.head_dim), static_cast<long long>(n), static_cast<long long>(c.n_kv),
                flash_ms, gemm_ms);
  }
}

TEST_F(CudaAttention, SupportsHeadDims64And128AndRejectsBadShapes) {
  EXPECT_TRUE(attention_flash_supports(64));
  EXPECT_TRUE(attention_flash_supports(128));
  EXPECT_FALSE(attention_flash_supports(80));
  EXPECT_FALSE(attention_flash_supports(256));
  DevicePagedKv kv;  // never read: the shape is checked first
  kv.kv_heads = 3;
  kv.head_dim = 64;
  EXPECT_THROW(attention_flash(nullptr, nullptr, kv, nullptr, 1, 10, 1, 1.0f, dev.stream.get()),
               std::invalid_argument);
  kv.head_dim = 80;
  EXPECT_THROW(attention_flash(nullptr, nullptr, kv, nullptr, 1, 9, 1, 1.0f, dev.stream.get()),
               std::invalid_argument);
}

}  // namespace
}  // namespace bs::kernels::cuda

int main(int argc, char** argv) {
  const int devices = bs::kernels::cuda::device_count();
  if (devices == 0) {
    std::printf("no CUDA device (or no driver): the CUDA attention tests are skipped\n");
    return 77;
  }
  for (int d = 0; d < devices; ++d)
    std::printf("CUDA device %d: %s\n", d, bs::kernels::cuda::device_description(d).c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
