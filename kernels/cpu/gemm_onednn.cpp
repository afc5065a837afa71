// Prefill-size products through oneDNN's matmul, the weights read from their stored
// rows on every call (gemm_onednn.h says why). Primitives are cached per shape, since
// creating one costs far more than running a small one.
//
// Safe to call from several threads at once (concurrent requests): the engine and
// the cached primitives are shared (primitives are immutable once created), while
// each thread executes on its own dnnl::stream, gives every execution a scratchpad of
// its own (scratchpad_mode::user, from a per-thread buffer) and dequantizes into its
// own chunk buffer, so nothing mutable is shared, whether or not oneDNN was built with
// DNNL_ENABLE_CONCURRENT_EXEC.
#include "kernels/cpu/gemm_onednn.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <compare>
#include <cstdlib>
#include <cstring>
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

// A 4096-aligned buffer (oneDNN's loads), grown to the largest asked, contents undefined.
class AlignedScratch {
 public:
  void* at_least(size_t bytes) {
    if (bytes > capacity_) {
      const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
      data_.reset(std::aligned_alloc(kAlign, size));
      if (!data_) {
        capacity_ = 0;
        throw std::bad_alloc();
      }
      capacity_ = size;
    }
    return data_.get();
  }

 private:
  static constexpr size_t kAlign = 4096;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
  size_t capacity_ = 0;
};

// This thread's buffers: the scratchpad (used by one execution at a time: each waits
// for its stream before returning) and gemm_stored's chunk buffers (thread_buffer).
// release_gemm_thread_buffers frees them.
enum class Buffer { Plain, Packed, Dense, kCount };
struct ThreadBuffers {
  AlignedScratch scratchpad;
  AlignedScratch chunk[static_cast<int>(Buffer::kCount)];
};
thread_local ThreadBuffers thread_buffers;

// Adds this thread's scratchpad to `args` where the primitive needs one.
void add_scratchpad(const dnnl::memory::desc& desc, std::unordered_map<int, dnnl::memory>& args) {
  if (desc.get_size() == 0) return;
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(desc, engine(), thread_buffers.scratchpad.at_least(desc.get_size())));
}

// Every primitive here takes its scratchpad from the caller, per execution.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A chunk of `cols` weight rows [cols, in] is oneDNN's [in, cols] with strides {1, in}
// ("plain"); before its product it is reordered into the blocked layout oneDNN's brgemm
// kernels want ("packed"), chosen once per shape for kLayoutRows activation rows (the
// layout does not depend on the row count, so one reorder serves every prompt length).
// Given a strided output (the columns of a fused product) oneDNN 2.6 leaves brgemm for
// its slower gemm:jit (ONEDNN_VERBOSE), hence a dense output copied into place. The
// reorders take ~5% of a 512-token prefill of SmolLM2; against the packed copy once
// kept at load, a 512-token prefill runs at 0.87-0.95x, a 3072-token one at 1.02-1.17x
// (tools/bench/results/streamed_gemm_*).
constexpr int64_t kLayoutRows = 512;

memory::data_type dt(Precision p) { return p == Precision::BF16 ? memory::data_type::bf16 : memory::data_type::f32; }

struct LayoutKey {
  int64_t in, cols;
  int precision;
  auto operator<=>(const LayoutKey&) const = default;
};
struct ChunkLayout {
  memory::desc plain, packed;
  dnnl::reorder reorder;
  memory::desc reorder_scratchpad;
};
struct MatmulKey {
  int64_t rows, in, cols;
  int precision;
  auto operator<=>(const MatmulKey&) const = default;
};
struct CachedMatmul {
  dnnl::matmul prim;
  memory::desc src, dst;
  memory::desc scratchpad;  // what one execution needs (size 0: none)
};
std::mutex primitive_mu;
std::atomic<int64_t> creation_ns{0};  // time spent creating primitives (under primitive_mu)
std::map<LayoutKey, ChunkLayout> layout_cache;
std::map<MatmulKey, CachedMatmul> matmul_cache;

// Adds the time since t0 to creation_ns.
void count_creation(std::chrono::steady_clock::time_point t0) {
  creation_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

ChunkLayout layout_for(const LayoutKey& key) {
  std::lock_guard<std::mutex> lock(primitive_mu);
  auto it = layout_cache.find(key);
  if (it == layout_cache.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    auto& eng = engine();
    const auto type = dt(static_cast<Precision>(key.precision));
    memory::desc plain({key.in, key.cols}, type, memory::dims{1, key.in});
    memory::desc src({kLayoutRows, key.in}, type, memory::format_tag::ab);
    memory::desc any_w({key.in, key.cols}, type, memory::format_tag::any);
    memory::desc dst({kLayoutRows, key.cols}, memory::data_type::f32, memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, any_w, dst), eng);
    const memory::desc packed = pd.weights_desc();
    const dnnl::reorder::primitive_desc rpd(eng, plain, eng, packed, user_scratchpad());
    it = layout_cache.emplace(key, ChunkLayout{plain, packed, dnnl::reorder(rpd), rpd.scratchpad_desc()}).first;
    count_creation(t0);
  }
  return it->second;  // copies share the immutable primitive
}

CachedMatmul matmul_for(const MatmulKey& key, const memory::desc& packed) {
  std::lock_guard<std::mutex> lock(primitive_mu);
  auto it = matmul_cache.find(key);
  if (it == matmul_cache.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    if (matmul_cache.size() > 4096) matmul_cache.clear();  // bound memory over many prompt lengths
    const auto type = dt(static_cast<Precision>(key.precision));
    memory::desc src({key.rows, key.in}, type, memory::format_tag::ab);
    memory::desc dst({key.rows, key.cols}, memory::data_type::f32, memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, packed, dst), user_scratchpad(), engine());
    it = matmul_cache.emplace(key, CachedMatmul{dnnl::matmul(pd), src, dst, pd.scratchpad_desc()}).first;
    count_creation(t0);
  }
  return it->second;
}

// Bytes of dequantized weights per chunk: large enough that each matmul call has work
// for every thread, small enough to stay in the caches between its dequantization and
// its product.
constexpr int64_t kChunkBytes = int64_t{4} << 20;

// One of this thread's chunk buffers, at least `bytes` long.
void* thread_buffer(Buffer which, int64_t bytes) {
  return thread_buffers.chunk[static_cast<int>(which)].at_least(static_cast<size_t>(bytes));
}

void execute(const dnnl::primitive& prim, const memory::desc& scratchpad, std::unordered_map<int, memory> args) {
  add_scratchpad(scratchpad, args);
  auto& stream = thread_stream();
  prim.execute(stream, args);
  stream.wait();
}

}  // namespace

void release_gemm_thread_buffers() { thread_buffers = ThreadBuffers{}; }

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

void gemm_stored(const CpuKernels& kernels, const std::vector<WeightView>& parts, Precision precision, const void* x,
                 float* y, int64_t n) {
  if (n <= 0 || parts.empty()) return;
  const int64_t in = parts[0].in_features;
  int64_t out = 0;
  for (const auto& p : parts) out += p.out_features;
  if (out <= 0) return;
  auto& eng = engine();
  const int prec = static_cast<int>(precision);
  const bool bf16 = precision == Precision::BF16;
  const auto stored = bf16 ? TensorType::BF16 : TensorType::F32;
  // One part stored at the GEMM's precision is reordered straight from the file.
  const bool in_place = parts.size() == 1 && parts[0].type == stored;
  const int64_t elt = bf16 ? 2 : 4;
  int64_t chunk = std::max<int64_t>(64, kChunkBytes / (in * elt) / 64 * 64);
  if (chunk >= out) chunk = out;
  // Row r of the concatenation: its part's stored row.
  auto stored_row = [&](int64_t r, TensorType* type) {
    for (const auto& p : parts) {
      if (r < p.out_features) {
        *type = p.type;
        return static_cast<const uint8_t*>(p.data) + r * type_row_bytes(p.type, in);
      }
      r -= p.out_features;
    }
    return static_cast<const uint8_t*>(nullptr);  // unreachable: r < out
  };
  for (int64_t r0 = 0; r0 < out; r0 += chunk) {
    const int64_t rows = std::min(chunk, out - r0);
    const ChunkLayout layout = layout_for({in, rows, prec});
    const CachedMatmul mm = matmul_for({n, in, rows, prec}, layout.packed);
    TensorType type0 = stored;
    void* plain = const_cast<uint8_t*>(stored_row(r0, &type0));
    if (!in_place) {
      plain = thread_buffer(Buffer::Plain, rows * in * elt);
#pragma omp parallel for schedule(static) if (rows * in >= (1 << 15))
      for (int64_t r = 0; r < rows; ++r) {
        TensorType type = stored;
        const uint8_t* src = stored_row(r0 + r, &type);
        void* row = static_cast<uint8_t*>(plain) + r * in * elt;
        if (type == stored) std::memcpy(row, src, static_cast<size_t>(in * elt));
        else if (kernels.dequantize_row(type, src, row, in, bf16)) continue;
        else if (bf16) dequantize_row_to_bf16(type, src, static_cast<uint16_t*>(row), in);
        else dequantize_row(type, src, static_cast<float*>(row), in);
      }
    }
    void* packed = thread_buffer(Buffer::Packed, static_cast<int64_t>(layout.packed.get_size()));
    execute(layout.reorder, layout.reorder_scratchpad,
            {{DNNL_ARG_FROM, memory(layout.plain, eng, plain)}, {DNNL_ARG_TO, memory(layout.packed, eng, packed)}});
    // The product straight into y when one chunk is the whole output, else into a
    // dense buffer copied into its columns.
    const bool whole = rows == out;
    float* dst = whole ? y : static_cast<float*>(thread_buffer(Buffer::Dense, n * rows * 4));
    execute(mm.prim, mm.scratchpad,
            {{DNNL_ARG_SRC, memory(mm.src, eng, const_cast<void*>(x))},
             {DNNL_ARG_WEIGHTS, memory(layout.packed, eng, packed)},
             {DNNL_ARG_DST, memory(mm.dst, eng, dst)}});
    if (!whole) {
#pragma omp parallel for schedule(static) if (n * rows >= (1 << 15))
      for (int64_t t = 0; t < n; ++t) std::copy_n(dst + t * rows, rows, y + t * out + r0);
    }
  }
}

}  // namespace bs::kernels::cpu
