// Prefill-size products through oneDNN's matmul: weights are dequantized once to
// bf16 (or f32) and reordered into the blocked layout oneDNN's brgemm kernels
// want; activations are converted to bf16 per call. Primitives are cached per
// row count, since creating one costs far more than running a small one.
//
// Safe to call from several threads at once (concurrent requests): the engine and
// the cached primitives are shared (primitives are immutable once created), while
// each thread executes on its own dnnl::stream and gives every execution a
// scratchpad of its own (scratchpad_mode::user, from a per-thread buffer), so
// nothing mutable inside oneDNN is shared, whether or not the library was built
// with DNNL_ENABLE_CONCURRENT_EXEC.
#include "kernels/cpu/gemm_onednn.h"

#include <atomic>
#include <chrono>
#include <compare>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/dequant.h"

namespace bs::kernels::cpu {
namespace {

using dnnl::memory;

// The engine is shared by all threads; a stream is not thread-safe, so each
// thread has its own, bound to that engine.
// BLENDSERVE_CPU_ISA caps oneDNN as well as our kernels: a run capped to AVX2 on an
// AVX-512 machine must not get AVX-512 GEMMs. Applied once, before oneDNN's first
// use; an explicit ONEDNN_MAX_CPU_ISA wins.
void cap_onednn_isa() {
  const CpuIsa selected = selected_cpu_isa();
  if (selected >= detect_cpu_isa() || std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr) return;
  const dnnl::cpu_isa cap = selected == CpuIsa::Scalar   ? dnnl::cpu_isa::sse41
                            : selected == CpuIsa::Avx2   ? dnnl::cpu_isa::avx2
                                                         : dnnl::cpu_isa::avx512_core;
  try {
    dnnl::set_max_cpu_isa(cap);
  } catch (const dnnl::error&) {
    // oneDNN already dispatched: nothing to cap any more (only in odd embeddings).
  }
}

dnnl::engine& engine() {
  static const bool capped = (cap_onednn_isa(), true);
  (void)capped;
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(engine());
  return stream;
}

// This thread's scratchpad: grows to the largest any primitive asked for, and is
// used by one execution at a time (each waits for its stream before returning).
// Adds it to `args` where the primitive needs one.
void add_scratchpad(const dnnl::memory::desc& desc, std::unordered_map<int, dnnl::memory>& args) {
  if (desc.get_size() == 0) return;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Free> buf;
  thread_local size_t capacity = 0;
  constexpr size_t kAlign = 4096;
  const size_t need = desc.get_size();
  if (need > capacity) {
    const size_t size = (need + kAlign - 1) / kAlign * kAlign;
    buf.reset(std::aligned_alloc(kAlign, size));
    if (!buf) {
      capacity = 0;
      throw std::bad_alloc();
    }
    capacity = size;
  }
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(desc, engine(), buf.get()));
}

// Every primitive here takes its scratchpad from the caller, per execution.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Matmul primitives by (rows, in, out, precision): every layer has the same shapes,
// so one primitive serves all of them.
struct PrimitiveKey {
  int64_t rows, in, out;
  int precision;
  auto operator<=>(const PrimitiveKey&) const = default;
};
struct CachedMatmul {
  dnnl::matmul prim;
  memory::desc scratchpad;  // what one execution needs (size 0: none)
};
std::mutex primitive_mu;
std::atomic<int64_t> creation_ns{0};  // time spent creating primitives (under primitive_mu)
std::map<PrimitiveKey, CachedMatmul> primitive_cache;

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
  auto& eng = engine();
  DnnlWeightsPtr out(new DnnlWeights);
  out->precision = precision;
  out->in = w.in_features;
  out->out = w.out_features;
  const auto type = w.type;
  const int64_t row_bytes = type_row_bytes(type, w.in_features);
  const auto* base = static_cast<const uint8_t*>(w.data);
  // Plain weights as oneDNN's [K, N] with strides {1, K}: our rows are output features.
  memory::desc plain_desc({w.in_features, w.out_features}, dt(precision), memory::dims{1, w.in_features});
  memory plain(plain_desc, eng);
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
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_desc, any_w, dst_desc), eng);
  out->packed_desc = pd.weights_desc();
  out->packed = memory(out->packed_desc, eng);
  const dnnl::reorder::primitive_desc rpd(plain, out->packed, user_scratchpad());
  std::unordered_map<int, memory> args{{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, out->packed}};
  add_scratchpad(rpd.scratchpad_desc(), args);
  auto& stream = thread_stream();
  dnnl::reorder(rpd).execute(stream, args);
  stream.wait();
  return out;
}

double onednn_primitive_creation_seconds() { return creation_ns.load() * 1e-9; }

bool onednn_bf16_matmul_available() {
  static const bool available = [] {
    try {
      memory::desc a({64, 64}, memory::data_type::bf16, memory::format_tag::ab);
      memory::desc b({64, 64}, memory::data_type::bf16, memory::format_tag::any);
      memory::desc c({64, 64}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

void gemm(const DnnlWeights& w, const CpuKernels& kernels, const float* x, float* y, int64_t n) {
  auto& eng = engine();
  const auto sdt = dt(w.precision);
  memory::desc src_desc({n, w.in}, sdt, memory::format_tag::ab);
  memory::desc dst_desc({n, w.out}, memory::data_type::f32, memory::format_tag::ab);
  CachedMatmul mm;  // copies share the immutable primitive
  {
    std::lock_guard<std::mutex> lock(primitive_mu);
    const PrimitiveKey key{n, w.in, w.out, static_cast<int>(w.precision)};
    auto it = primitive_cache.find(key);
    if (it == primitive_cache.end()) {
      const auto t0 = std::chrono::steady_clock::now();
      if (primitive_cache.size() > 4096) primitive_cache.clear();  // bound memory over many prompt lengths
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_desc, w.packed_desc, dst_desc),
                                            user_scratchpad(), eng);
      it = primitive_cache.emplace(key, CachedMatmul{dnnl::matmul(pd), pd.scratchpad_desc()}).first;
      creation_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    }
    mm = it->second;
  }
  std::vector<uint16_t> xb;
  void* src_data = const_cast<float*>(x);
  if (w.precision == Precision::BF16) {
    xb.resize(static_cast<size_t>(n * w.in));
    kernels.to_bf16(x, xb.data(), n * w.in);
    src_data = xb.data();
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_desc, eng, src_data)},
                                       {DNNL_ARG_WEIGHTS, w.packed},
                                       {DNNL_ARG_DST, memory(dst_desc, eng, y)}};
  add_scratchpad(mm.scratchpad, args);
  auto& stream = thread_stream();
  mm.prim.execute(stream, args);
  stream.wait();
}

}  // namespace bs::kernels::cpu
