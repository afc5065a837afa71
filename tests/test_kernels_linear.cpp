// The products of every CPU kernel variant against the scalar reference: every stored
// type, fused parts, rows alone or batched, batch-invariant prefill, and the int8 and
// int16 activation products with their scalar forms. A variant this CPU cannot execute
// is skipped (and shows as "Not Run" in ctest), never passed.
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


INSTANTIATE_TEST_SUITE_P(Isa, BackendOps, ::testing::ValuesIn(cpu::kAllIsas),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) { return cpu::isa_name(info.param); });

}  // namespace
}  // namespace bs::kernels
