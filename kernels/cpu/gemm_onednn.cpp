// Prefill-size products through oneDNN's matmul: weights are dequantized once to
// bf16 (or f32) and reordered into the blocked layout oneDNN's brgemm kernels
// want; activations are converted to bf16 per call. Primitives are cached per
// row count, since creating one costs far more than running a small one.
#include "kernels/cpu/gemm_onednn.h"

#include <compare>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <vector>

#include "kernels/dequant.h"

namespace bs::kernels::cpu {
namespace {

using dnnl::memory;

struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

DnnlContext& context() {
  static DnnlContext ctx;
  return ctx;
}

// Matmul primitives by (rows, in, out, precision): every layer has the same shapes,
// so one primitive serves all of them.
struct PrimitiveKey {
  int64_t rows, in, out;
  int precision;
  auto operator<=>(const PrimitiveKey&) const = default;
};
std::mutex primitive_mu;
std::map<PrimitiveKey, dnnl::matmul> primitive_cache;

// Reference row count used to pick the packed weight layout.
constexpr int64_t kLayoutRows = 512;

memory::data_type dt(Precision p) { return p == Precision::BF16 ? memory::data_type::bf16 : memory::data_type::f32; }

}  // namespace

struct DnnlWeights {
  Precision precision;
  int64_t in = 0, out = 0;
  memory::desc packed_desc;
  memory packed;
};

void destroy(DnnlWeights* w) { delete w; }

DnnlWeightsPtr pack_for_gemm(const WeightView& w, Precision precision) {
  auto& ctx = context();
  DnnlWeightsPtr out(new DnnlWeights);
  out->precision = precision;
  out->in = w.in_features;
  out->out = w.out_features;
  const auto type = w.type;
  const int64_t row_bytes = type_row_bytes(type, w.in_features);
  const auto* base = static_cast<const uint8_t*>(w.data);
  // Plain weights as oneDNN's [K, N] with strides {1, K}: our rows are output features.
  memory::desc plain_desc({w.in_features, w.out_features}, dt(precision), memory::dims{1, w.in_features});
  memory plain(plain_desc, ctx.engine);
  if (precision == Precision::BF16) {
    auto* dst = static_cast<uint16_t*>(plain.get_data_handle());
    for (int64_t r = 0; r < w.out_features; ++r)
      dequantize_row_to_bf16(type, base + r * row_bytes, dst + r * w.in_features, w.in_features);
  } else {
    auto* dst = static_cast<float*>(plain.get_data_handle());
    for (int64_t r = 0; r < w.out_features; ++r)
      dequantize_row(type, base + r * row_bytes, dst + r * w.in_features, w.in_features);
  }
  memory::desc src_desc({kLayoutRows, w.in_features}, dt(precision), memory::format_tag::ab);
  memory::desc any_w({w.in_features, w.out_features}, dt(precision), memory::format_tag::any);
  memory::desc dst_desc({kLayoutRows, w.out_features}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_desc, any_w, dst_desc), ctx.engine);
  out->packed_desc = pd.weights_desc();
  out->packed = memory(out->packed_desc, ctx.engine);
  dnnl::reorder(plain, out->packed).execute(ctx.stream, plain, out->packed);
  ctx.stream.wait();
  return out;
}

bool onednn_bf16_matmul_available() {
  static const bool available = [] {
    try {
      auto& ctx = context();
      memory::desc a({64, 64}, memory::data_type::bf16, memory::format_tag::ab);
      memory::desc b({64, 64}, memory::data_type::bf16, memory::format_tag::any);
      memory::desc c({64, 64}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), ctx.engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

void gemm(const DnnlWeights& w, const CpuKernels& kernels, const float* x, float* y, int64_t n) {
  auto& ctx = context();
  const auto sdt = dt(w.precision);
  memory::desc src_desc({n, w.in}, sdt, memory::format_tag::ab);
  memory::desc dst_desc({n, w.out}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul prim;
  {
    std::lock_guard<std::mutex> lock(primitive_mu);
    const PrimitiveKey key{n, w.in, w.out, static_cast<int>(w.precision)};
    auto it = primitive_cache.find(key);
    if (it == primitive_cache.end()) {
      if (primitive_cache.size() > 4096) primitive_cache.clear();  // bound memory over many prompt lengths
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_desc, w.packed_desc, dst_desc), ctx.engine);
      it = primitive_cache.emplace(key, dnnl::matmul(pd)).first;
    }
    prim = it->second;
  }
  memory dst(dst_desc, ctx.engine, y);
  if (w.precision == Precision::BF16) {
    std::vector<uint16_t> xb(static_cast<size_t>(n * w.in));
    kernels.to_bf16(x, xb.data(), n * w.in);
    memory src(src_desc, ctx.engine, xb.data());
    prim.execute(ctx.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w.packed}, {DNNL_ARG_DST, dst}});
  } else {
    memory src(src_desc, ctx.engine, const_cast<float*>(x));
    prim.execute(ctx.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w.packed}, {DNNL_ARG_DST, dst}});
  }
  ctx.stream.wait();
}

}  // namespace bs::kernels::cpu
