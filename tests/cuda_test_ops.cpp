// Every CUDA op against the CPU reference backend on random inputs of awkward sizes
// (ggml's test-backend-ops habit), plus the RAII owners and the error messages. Label
// "cuda": without a GPU (or a driver) the binary prints why and exits 77, which CTest
// reports as skipped, never as passed. Not named test_* so the unit-test glob leaves it
// alone: it links the CUDA library and has its own main.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dequant.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/device_waits.h"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/gather_rows.cuh"
#include "kernels/cuda/gemv_bf16.cuh"
#include "kernels/cuda/index_check.cuh"
#include "kernels/cuda/kv_deviation.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/residual_add.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rope_kv_rows.cuh"
#include "kernels/cuda/split_qkv.cuh"
#include "kernels/cuda/store_kv.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/top_k.cuh"
#include "tests/paged_kv.h"
#include "tests/random_data.h"

namespace bs::kernels::cuda {
namespace {

using test::random_vec;
using test::rel_max_err;

// Host values on the device and back, on one stream.
struct OnDevice {
  CudaStream stream;
  DeviceAllocation up(const std::vector<float>& host) {
    DeviceAllocation d(host.size() * sizeof(float));
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

class CudaOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> ref = make_reference_backend();
  OnDevice dev;
};

TEST_F(CudaOps, RmsnormMatchesTheReference) {
  for (int64_t dim : {576, 17, 64, 1000, 4097}) {
    for (int64_t n : {1, 7, 33}) {
      auto x = random_vec(n * dim, 1), w = random_vec(dim, 2);
      std::vector<float> want(n * dim);
      ref->rmsnorm(x.data(), w.data(), want.data(), n, dim, 1e-5f);
      auto dx = dev.up(x), dw = dev.up(w);
      DeviceAllocation dout(want.size() * sizeof(float));
      rmsnorm(dx.as<float>(), dw.as<float>(), dout.as<float>(), n, dim, 1e-5f, dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dout), want), 1e-5) << "n " << n << " dim " << dim;
    }
  }
}

TEST_F(CudaOps, SwigluMatchesTheReference) {
  for (int64_t ff : {1536, 17, 1}) {
    for (int64_t n : {1, 5, 129}) {
      auto gu = random_vec(n * 2 * ff, 3);
      std::vector<float> want(n * ff);
      ref->swiglu(gu.data(), want.data(), n, ff);
      auto dgu = dev.up(gu);
      DeviceAllocation dout(want.size() * sizeof(float));
      swiglu(dgu.as<float>(), dout.as<float>(), n, ff, dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dout), want), 1e-5) << "n " << n << " ff " << ff;
    }
  }
}

TEST_F(CudaOps, ResidualAddIsBitIdenticalToTheReference) {
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{576} * 129 + 3}) {
    auto y = random_vec(count, 4), x = random_vec(count, 5);
    auto dy = dev.up(y), dx = dev.up(x);
    ref->add(y.data(), x.data(), count);
    residual_add(dy.as<float>(), dx.as<float>(), count, dev.stream.get());
    EXPECT_EQ(dev.down(dy), y) << "count " << count;
  }
}

TEST_F(CudaOps, SplitQkvAndGatherRowsAreBitIdenticalToTheReference) {
  struct Shape { int64_t n, q_dim, kv_dim; };
  for (auto sh : {Shape{1, 576, 192}, Shape{7, 64, 32}, Shape{130, 96, 1}}) {
    const int64_t width = sh.q_dim + 2 * sh.kv_dim;
    auto qkv = random_vec(sh.n * width, 6);
    std::vector<float> q(sh.n * sh.q_dim), k(sh.n * sh.kv_dim), v(sh.n * sh.kv_dim);
    ref->split_qkv(qkv.data(), q.data(), k.data(), v.data(), sh.n, sh.q_dim, sh.kv_dim);
    auto dqkv = dev.up(qkv);
    DeviceAllocation dq(q.size() * 4), dk(k.size() * 4), dv(v.size() * 4);
    split_qkv(dqkv.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), sh.n, sh.q_dim, sh.kv_dim,
              dev.stream.get());
    EXPECT_EQ(dev.down(dq), q);
    EXPECT_EQ(dev.down(dk), k);
    EXPECT_EQ(dev.down(dv), v);

    std::vector<int32_t> rows;  // out of order, repeated, the last row
    for (int64_t i = 0; i < sh.n; i += 3) rows.push_back(static_cast<int32_t>(sh.n - 1 - i));
    rows.push_back(0);
    rows.push_back(0);
    const int64_t m = static_cast<int64_t>(rows.size());
    std::vector<float> want(m * width);
    ref->gather_rows(qkv.data(), rows.data(), want.data(), m, width);
    DeviceAllocation drows(rows.size() * sizeof(int32_t)), dout(want.size() * 4);
    BS_CUDA_CHECK(cudaMemcpyAsync(drows.get(), rows.data(), drows.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
    gather_rows(dqkv.as<float>(), drows.as<int32_t>(), dout.as<float>(), m, width, dev.stream.get());
    EXPECT_EQ(dev.down(dout), want);
  }
}

// Every stored type the device decodes, from random bytes (all bit patterns: NaN and
// subnormal halves included), bit-exact to the CPU's dequantization. A NaN equals any
// NaN: arithmetic on one (Q4_1's q * d + m with m a NaN) gives the GPU's canonical NaN
// (0x7fffffff) where x86 keeps the operand's payload (seen on an H200: type 3, one row).
TEST_F(CudaOps, EmbedIsBitExactToTheCpuDequantization) {
  const int64_t vocab = 37, dim = 96, n = 9;
  std::mt19937 rng(7);
  std::vector<int32_t> ids = {36, 0, 5, 5, 17, 36, 1, 2, 30};
  for (TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                          TensorType::Q4_1}) {
    const int64_t row_bytes = type_row_bytes(type, dim);
    std::vector<uint8_t> table(static_cast<size_t>(vocab * row_bytes));
    for (auto& b : table) b = static_cast<uint8_t>(rng());
    if (type == TensorType::F32)  // finite floats (a NaN's payload is not what this tests)
      for (int64_t i = 0; i < vocab * dim; ++i) {
        const float f = static_cast<float>(static_cast<int32_t>(rng())) * 1e-6f;
        std::memcpy(&table[i * 4], &f, 4);
      }
    std::vector<float> want(n * dim);
    for (int64_t t = 0; t < n; ++t) dequantize_row(type, &table[ids[t] * row_bytes], &want[t * dim], dim);
    DeviceAllocation dtable(table.size()), dids(ids.size() * sizeof(int32_t)), dout(want.size() * 4);
    BS_CUDA_CHECK(cudaMemcpyAsync(dtable.get(), table.data(), table.size(), cudaMemcpyHostToDevice, dev.stream.get()));
    BS_CUDA_CHECK(cudaMemcpyAsync(dids.get(), ids.data(), dids.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
    embed(type, dtable.get(), dids.as<int32_t>(), dout.as<float>(), n, dim, vocab, dev.stream.get());
    const auto got = dev.down(dout);
    int64_t differ = 0, nans = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        ++nans;
        differ += !std::isnan(got[i]);
      } else {
        differ += std::memcmp(&got[i], &want[i], 4) != 0;
      }
    }
    EXPECT_EQ(differ, 0) << "type " << static_cast<int>(type) << ": " << differ << " of " << want.size()
                         << " elements differ (" << nans << " NaN in the CPU's)";
  }
  EXPECT_THROW(embed(TensorType::Q4_0, nullptr, nullptr, nullptr, 1, 48, vocab, dev.stream.get()),
               std::invalid_argument);
}

// Ids out of range read nothing: their rows are NaN, the others right, and the check
// kernel flags the first op that saw one (the backend's report at its next wait).
TEST_F(CudaOps, OutOfRangeIdsReadNothingAndAreFlagged) {
  const int64_t vocab = 10, dim = 64;
  const auto table = random_vec(static_cast<size_t>(vocab * dim), 8);
  const std::vector<int32_t> ids = {3, -1, 10, 9};
  auto dtable = dev.up(table);
  DeviceAllocation dids(ids.size() * sizeof(int32_t)), dout(ids.size() * dim * 4), flag(sizeof(int32_t));
  BS_CUDA_CHECK(cudaMemcpyAsync(dids.get(), ids.data(), dids.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
  BS_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int32_t), dev.stream.get()));
  flag_out_of_range(dids.as<int32_t>(), 4, vocab, 5, flag.as<int32_t>(), dev.stream.get());
  flag_out_of_range(dids.as<int32_t>(), 4, vocab, 6, flag.as<int32_t>(), dev.stream.get());  // the first stays
  embed(TensorType::F32, dtable.get(), dids.as<int32_t>(), dout.as<float>(), 4, dim, vocab, dev.stream.get());
  const auto got = dev.down(dout);
  int32_t code = 0;
  BS_CUDA_CHECK(cudaMemcpy(&code, flag.get(), sizeof code, cudaMemcpyDeviceToHost));
  EXPECT_EQ(code, 5);
  for (int64_t c = 0; c < dim; ++c) {
    EXPECT_EQ(got[static_cast<size_t>(c)], table[static_cast<size_t>(3 * dim + c)]);
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(dim + c)]));
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(2 * dim + c)]));
    EXPECT_EQ(got[static_cast<size_t>(3 * dim + c)], table[static_cast<size_t>(9 * dim + c)]);
  }
  const std::vector<int32_t> fine = {0, 9};
  BS_CUDA_CHECK(cudaMemcpyAsync(dids.get(), fine.data(), 8, cudaMemcpyHostToDevice, dev.stream.get()));
  BS_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int32_t), dev.stream.get()));
  flag_out_of_range(dids.as<int32_t>(), 2, vocab, 5, flag.as<int32_t>(), dev.stream.get());
  dev.stream.synchronize();
  BS_CUDA_CHECK(cudaMemcpy(&code, flag.get(), sizeof code, cudaMemcpyDeviceToHost));
  EXPECT_EQ(code, 0);
}

// Both pair layouts, negative and large positions (delta-RoPE moves chunks backwards;
// contexts reach thousands), scaled inverse frequencies: the device rotation with the
// (cos, sin) rows the backend computes in double, against the reference's double math.
TEST_F(CudaOps, RopeMatchesTheReferenceBothStylesAnyPosition) {
  const int64_t heads = 3, head_dim = 64, half = head_dim / 2;
  const std::vector<int32_t> pos = {0, 1, -7, 8191, -3000, 511, 12, 4096};
  const int64_t n = static_cast<int64_t>(pos.size());
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::HalfSplit}) {
    RopeTable table;
    table.style = style;
    table.head_dim = static_cast<int>(head_dim);
    for (int64_t i = 0; i < half; ++i)
      table.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / head_dim) * (i < half / 2 ? 1.0 : 0.125)));
    auto prepared = ref->prepare_rope(table);
    std::vector<float> cos_sin(n * half * 2);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(pos[t]) * table.inv_freq[i];
        cos_sin[(t * half + i) * 2] = static_cast<float>(std::cos(a));
        cos_sin[(t * half + i) * 2 + 1] = static_cast<float>(std::sin(a));
      }
    auto x = random_vec(n * heads * head_dim, 8);
    auto dx = dev.up(x), dcs = dev.up(cos_sin);
    ref->rope(x.data(), pos.data(), n, heads, *prepared);
    rope(dx.as<float>(), dcs.as<float>(), n, heads, head_dim, style == RopeStyle::Interleaved, dev.stream.get());
    EXPECT_LT(rel_max_err(dev.down(dx), x), 1e-5) << "style " << static_cast<int>(style);
  }
}

// A host paged cache (pages shuffled in the pool, spare pages NaN, a final partial
// page) copied to the device with its page table.
struct DevicePaged {
  DeviceAllocation k, v, pages;
  DevicePagedKv view;
};
DevicePaged upload_paged(OnDevice& dev, const test::PagedKv& host) {
  DevicePaged d{DeviceAllocation(host.k.size()), DeviceAllocation(host.v.size()),
                DeviceAllocation(host.pages.size() * sizeof(int32_t)), {}};
  auto s = dev.stream.get();
  BS_CUDA_CHECK(cudaMemcpyAsync(d.k.get(), host.k.data(), host.k.size(), cudaMemcpyHostToDevice, s));
  BS_CUDA_CHECK(cudaMemcpyAsync(d.v.get(), host.v.data(), host.v.size(), cudaMemcpyHostToDevice, s));
  BS_CUDA_CHECK(cudaMemcpyAsync(d.pages.get(), host.pages.data(), d.pages.bytes(), cudaMemcpyHostToDevice, s));
  KvView on_device = host.view;
  on_device.k = d.k.get();
  on_device.v = d.v.get();
  d.view = device_view(on_device, d.pages.as<int32_t>());
  return d;
}

// Prefill (every row), the blend's selected rows (a subset, out of order), and decode
// (one row at the end), over each KV dtype with GQA, against the reference.
TEST_F(CudaOps, PagedAttentionMatchesTheReference) {
  const int64_t kv_heads = 3, q_heads = 9, head_dim = 64, rows = 150;
  auto k = random_vec(kv_heads * rows * head_dim, 11), v = random_vec(kv_heads * rows * head_dim, 12);
  for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    auto host = test::make_paged(k, v, kv_heads, rows, head_dim, rows, 5, 13, 3, dtype);
    auto d = upload_paged(dev, host);
    std::vector<std::vector<int32_t>> cases = {{}, {149, 3, 77, 0, 31, 32}, {149}};
    for (int32_t p = 0; p < rows; ++p) cases[0].push_back(p);
    for (const auto& qpos : cases) {
      const int64_t n = static_cast<int64_t>(qpos.size());
      auto q = random_vec(n * q_heads * head_dim, 14);
      std::vector<float> want(q.size());
      ref->attention(q.data(), qpos.data(), host.view, want.data(), n, q_heads, rows, 0.125f, Precision::F32);
      auto dq = dev.up(q);
      DeviceAllocation dpos(qpos.size() * sizeof(int32_t)), dout(want.size() * 4);
      BS_CUDA_CHECK(cudaMemcpyAsync(dpos.get(), qpos.data(), dpos.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
      attention(dq.as<float>(), dpos.as<int32_t>(), d.view, dout.as<float>(), n, q_heads, rows, 0.125f,
                dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dout), want), 1e-4) << "dtype " << static_cast<int>(dtype) << " n " << n;
    }
  }
}

// Rows stored on the device land where the CPU puts them, rounded the same way (finite
// values: bit-exact), K only when V is null.
TEST_F(CudaOps, StoreKvWritesTheCpusBytes) {
  const int64_t kv_heads = 3, head_dim = 64, rows = 70, n = 5;
  const std::vector<int32_t> pos = {69, 0, 33, 32, 5};
  for (TensorType dtype : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    std::vector<float> zeros(kv_heads * rows * head_dim, 0.0f);
    auto host = test::make_paged(zeros, zeros, kv_heads, rows, head_dim, rows, 4, 15, 2, dtype);
    auto d = upload_paged(dev, host);
    auto kr = random_vec(n * kv_heads * head_dim, 16), vr = random_vec(n * kv_heads * head_dim, 17);
    ref->store_kv(host.view, pos.data(), kr.data(), nullptr, 3);  // K only for the first 3
    ref->store_kv(host.view, pos.data() + 3, kr.data() + 3 * kv_heads * head_dim,
                  vr.data() + 3 * kv_heads * head_dim, 2);
    auto dk = dev.up(kr), dv = dev.up(vr);
    DeviceAllocation dpos(pos.size() * sizeof(int32_t));
    BS_CUDA_CHECK(cudaMemcpyAsync(dpos.get(), pos.data(), dpos.bytes(), cudaMemcpyHostToDevice, dev.stream.get()));
    store_kv(d.view, dpos.as<int32_t>(), dk.as<float>(), nullptr, 3, dev.stream.get());
    store_kv(d.view, dpos.as<int32_t>() + 3, dk.as<float>() + 3 * kv_heads * head_dim,
             dv.as<float>() + 3 * kv_heads * head_dim, 2, dev.stream.get());
    std::vector<std::byte> gk(host.k.size()), gv(host.v.size());
    BS_CUDA_CHECK(cudaMemcpyAsync(gk.data(), d.k.get(), gk.size(), cudaMemcpyDeviceToHost, dev.stream.get()));
    BS_CUDA_CHECK(cudaMemcpyAsync(gv.data(), d.v.get(), gv.size(), cudaMemcpyDeviceToHost, dev.stream.get()));
    dev.stream.synchronize();
    EXPECT_TRUE(gk == host.k) << "dtype " << static_cast<int>(dtype);
    EXPECT_TRUE(gv == host.v) << "dtype " << static_cast<int>(dtype);
  }
}

// Weights of every stored type dequantized to bf16 on the device, then cuBLAS in bf16
// with fp32 accumulation, against the reference's exact product: within bf16's rounding
// of weights and activations (the CPU's bf16 GEMM bound, 2e-2 relative), bias added.
TEST_F(CudaOps, LinearFromEveryStoredTypeMatchesTheReferenceWithinBf16) {
  const int64_t out = 70, in = 96;
  std::mt19937 rng(9);
  CublasHandle cublas(dev.stream.get());
  DeviceAllocation scratch;
  for (TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                          TensorType::Q4_1}) {
    const int64_t row_bytes = type_row_bytes(type, in);
    std::vector<uint8_t> raw(static_cast<size_t>(out * row_bytes));
    const auto wf = random_vec(out * in, 10);
    if (type == TensorType::F32) {
      std::memcpy(raw.data(), wf.data(), raw.size());
    } else if (type == TensorType::F16 || type == TensorType::BF16) {
      for (int64_t i = 0; i < out * in; ++i) {
        const uint16_t h = type == TensorType::F16 ? fp32_to_fp16(wf[i]) : fp32_to_bf16(wf[i]);
        std::memcpy(&raw[i * 2], &h, 2);
      }
    } else {  // random quants under sane scales
      const int64_t bbytes = type == TensorType::Q8_0 ? 34 : type == TensorType::Q4_0 ? 18 : 20;
      for (auto& b : raw) b = static_cast<uint8_t>(rng());
      for (int64_t blk = 0; blk < out * in / 32; ++blk) {
        const uint16_t d = fp32_to_fp16(0.01f + 0.001f * static_cast<float>(blk % 7));
        const uint16_t m = fp32_to_fp16(-0.05f);
        std::memcpy(&raw[blk * bbytes], &d, 2);
        if (type == TensorType::Q4_1) std::memcpy(&raw[blk * bbytes + 2], &m, 2);
      }
    }
    WeightView view{type, raw.data(), out, in};
    auto pr = ref->prepare(view, Precision::F32);
    DeviceAllocation stored(raw.size());
    BS_CUDA_CHECK(cudaMemcpyAsync(stored.get(), raw.data(), raw.size(), cudaMemcpyHostToDevice, dev.stream.get()));
    const Bf16Weights w = weights_to_bf16(type, stored.get(), out, in, dev.stream.get());
    for (int64_t n : {1, 8, 129}) {
      auto x = random_vec(n * in, 11);
      auto bias = random_vec(out, 12);
      std::vector<float> want(n * out);
      ref->linear(*pr, x.data(), want.data(), n, bias.data());
      auto dx = dev.up(x), dbias = dev.up(bias);
      DeviceAllocation dy(want.size() * 4);
      linear(cublas, w, dx.as<float>(), dy.as<float>(), n, dbias.as<float>(), scratch, dev.stream.get());
      EXPECT_LT(rel_max_err(dev.down(dy), want), 2e-2) << "type " << static_cast<int>(type) << " n " << n;
    }
  }
}

// ---- the decode and blend ops, one by one (the backend-level checks are in
// tests/cuda_test_backend.cpp) ----

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

TEST(CudaResources, EventsOrderStreamsAndErrorsNameTheCall) {
  CudaStream a, b;
  CudaEvent done;
  const std::vector<float> ones(1 << 20, 1.0f);
  DeviceAllocation x(ones.size() * sizeof(float)), y(ones.size() * sizeof(float));
  BS_CUDA_CHECK(cudaMemcpyAsync(x.get(), ones.data(), x.bytes(), cudaMemcpyHostToDevice, a.get()));
  BS_CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.bytes(), a.get()));
  done.record(a.get());
  done.wait_on(b.get());  // b's add sees a's copies
  residual_add(y.as<float>(), x.as<float>(), static_cast<int64_t>(ones.size()), b.get());
  std::vector<float> back(ones.size());
  BS_CUDA_CHECK(cudaMemcpyAsync(back.data(), y.get(), y.bytes(), cudaMemcpyDeviceToHost, b.get()));
  b.synchronize();
  EXPECT_EQ(back, ones);
  DeviceAllocation moved = std::move(x);
  EXPECT_EQ(x.get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
  try {
    DeviceAllocation huge(size_t{1} << 62);
    FAIL() << "allocating 4 EiB succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device 0"), std::string::npos) << e.what();
  }
}

// The backend's bounded host waits (device_waits.h): a stream kept busy past the limit
// (a host function that sleeps, enqueued on it) is given up on with DeviceLost naming
// the wait and the limit; every later wait then throws at once, even on finished work.
TEST(CudaResources, AWaitPastTheLimitMarksTheDeviceLost) {
  CudaStream busy, idle;
  CudaEvent idle_done;
  DeviceWaits waits(0, "test GPU", std::chrono::milliseconds(100));
  idle_done.record(idle.get());
  waits.for_event(idle_done.get(), "idle work");  // finished work: returns
  EXPECT_FALSE(waits.lost());
  BS_CUDA_CHECK(cudaLaunchHostFunc(
      busy.get(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); }, nullptr));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    waits.for_stream(busy.get(), "a stuck step");
    FAIL() << "a wait on a stream busy for 1.5 s returned within a 100 ms limit";
  } catch (const DeviceLost& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a stuck step did not finish within 0.1 s"), std::string::npos) << what;
    EXPECT_NE(what.find("device.wait_timeout"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1400));
  EXPECT_TRUE(waits.lost());
  EXPECT_THROW(waits.for_event(idle_done.get(), "idle work"), DeviceLost);
  busy.synchronize();  // the host function ends; nothing left running at teardown
}

}  // namespace
}  // namespace bs::kernels::cuda

int main(int argc, char** argv) {
  const int devices = bs::kernels::cuda::device_count();
  if (devices == 0) {
    std::printf("no CUDA device (or no driver): the CUDA op tests are skipped\n");
    return 77;
  }
  for (int d = 0; d < devices; ++d)
    std::printf("CUDA device %d: %s\n", d, bs::kernels::cuda::device_description(d).c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
