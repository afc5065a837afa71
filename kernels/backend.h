// The compute backend interface. Every op the model needs is one virtual here;
// the scalar reference (kernels/ref), the CPU backend (kernels/cpu: per-ISA kernel
// variants chosen at start-up, oneDNN GEMMs) fill it today, and tests run every op
// on every backend against the reference; a device backend (CUDA, not written yet)
// is meant to fill the same interface. Pointers are host pointers for CPU backends
// and would be device pointers for a device backend. The KV cache is paged: the
// attention ops read it through a KvView (kernels/kv_view.h). Shapes are given next to each
// parameter, row-major, innermost last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kv_view.h"
#include "kernels/tensor_types.h"

namespace bs::kernels {


// Arithmetic used by the large GEMMs (prefill). Decode-size products always read
// the stored (quantized) weights directly with fp32 accumulation.
enum class Precision { F32, BF16 };

// A weight matrix W: [out_features, in_features], each row stored contiguously in
// `type` (kernels/tensor_types.h; quantized blocks along in_features), as it comes from
// the model file. `data` must outlive the prepared weights.
struct WeightView {
  TensorType type = TensorType::F32;
  const void* data = nullptr;
  int64_t out_features = 0;
  int64_t in_features = 0;
};

// Backend-owned, prepared form of a weight matrix (packed copies, device buffers...).
struct PreparedWeights {
  virtual ~PreparedWeights() = default;
  WeightView view;
};

enum class RopeStyle {
  Interleaved,  // rotate pairs (x[2i], x[2i+1]); ggml "NORM" (Llama GGUFs, Q/K permuted at conversion)
  HalfSplit,    // rotate pairs (x[i], x[i+d/2]); ggml "NEOX" (Qwen2)
};

// Per-dimension-pair inverse frequencies, scaling already applied (linear,
// Llama-3 style frequency factors): angle(pos, i) = pos * inv_freq[i].
struct RopeTable {
  RopeStyle style = RopeStyle::Interleaved;
  int head_dim = 0;               // rotary dimensions == head_dim here
  std::vector<float> inv_freq;    // [head_dim / 2]
};

const char* precision_name(Precision p);  // "f32", "bf16"
class Backend;
// "auto" (the backend's fastest), "bf16" or "f32"; throws std::invalid_argument for other
// names and for a precision the backend does not support, naming the alternatives.
Precision choose_precision(std::string_view name, const Backend& backend);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Which code computes, e.g. "cpu/avx2" or "reference": printed by `--stats`, in every
  // benchmark's JSON, and part of the chunk-KV cache key (KV computed by one kernel
  // variant is never served as another's).
  virtual std::string kernel_id() const { return name(); }
  // Whether prepare/linear/attention run at `precision` here (CPU: bf16 only with
  // native bf16 dot products and a oneDNN bf16 matmul).
  virtual bool supports(Precision precision) const = 0;
  // Seconds spent so far on one-time set-up during ops (e.g. creating a GEMM
  // primitive for a new row count): benchmarks subtract it from timings that
  // should measure steady-state compute.
  virtual double setup_seconds() const { return 0.0; }
  // The fastest precision this backend supports.
  Precision default_precision() const { return supports(Precision::BF16) ? Precision::BF16 : Precision::F32; }
  // Up to this many rows, linear() computes every row bit-identically to a call with
  // that row alone (the same kernel and summation order whatever the row count), so
  // a batched decode step equals one-token forwards (Transformer::decode_step splits
  // larger batches). 1 is always true.
  virtual int64_t linear_exact_rows() const { return 1; }

  // Throws std::invalid_argument when !supports(precision).
  virtual std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision precision) = 0;

  // y = x · Wᵀ (+ bias)
  virtual void linear(const PreparedWeights& w,
                      const float* x,      // [n, in_features]
                      float* y,            // [n, out_features]
                      int64_t n,
                      const float* bias    // [out_features] or nullptr
                      ) = 0;

  // Rows of an embedding table, dequantized.
  virtual void embed(const WeightView& table,  // [vocab, dim]
                     const int32_t* ids,       // [n]
                     float* out,               // [n, dim]
                     int64_t n) = 0;

  virtual void rmsnorm(const float* x,       // [n, dim]
                       const float* weight,  // [dim]
                       float* out,           // [n, dim]
                       int64_t n, int64_t dim, float eps) = 0;

  // In-place rotary embedding of `heads` heads per row at the given positions.
  // Positions may be negative (a rotation by -p undoes one by p).
  virtual void rope(float* x,              // [n, heads, head_dim]
                    const int32_t* pos,    // [n]
                    int64_t n, int64_t heads, const RopeTable& table) = 0;

  // out = silu(gate) * up, with gate and up side by side in one row (the fused
  // gate/up projection's output).
  virtual void swiglu(const float* gate_up,  // [n, 2 * ff]: gate [ff] then up [ff]
                      float* out,            // [n, ff]
                      int64_t n, int64_t ff) = 0;

  // Causal-by-position multi-head attention with grouped KV heads. Query i
  // attends to every cached key j < n_kv with j <= qpos[i] (the cache is indexed
  // by prompt position; its rows are wherever `kv`'s page table puts them). Query
  // head h reads KV head h / (q_heads / kv.kv_heads). K/V elements are kv.dtype (F32,
  // F16 or BF16), each read as its exact fp32 value; scores and sums are fp32.
  virtual void attention(const float* q,       // [n, q_heads, kv.head_dim]
                         const int32_t* qpos,  // [n]
                         const KvView& kv,     // n_kv <= kv.capacity rows per KV head
                         float* out,           // [n, q_heads, kv.head_dim]
                         int64_t n, int64_t q_heads, int64_t n_kv, float scale,
                         Precision precision  // BF16: bf16 dot products, fp32 softmax/accumulation
                         ) = 0;

  // One decode query per row, each row a different sequence with its own cache: row i
  // (q_heads heads) attends to rows [0, qpos[i]] of kv[i]. Every row equals
  // attention() of that row alone with n_kv = qpos[i] + 1 (a batched decode step
  // relies on it); a backend overrides this to spread the rows' heads over its
  // threads at once. Every kv[i] has the same kv_heads and head_dim.
  virtual void attention_rows(const float* q,       // [n, q_heads, head_dim]
                              const int32_t* qpos,  // [n]
                              const KvView* kv,     // [n]
                              float* out,           // [n, q_heads, head_dim]
                              int64_t n, int64_t q_heads, float scale, Precision precision) {
    if (n == 0) return;
    const int64_t qd = q_heads * kv[0].head_dim;
    for (int64_t i = 0; i < n; ++i)
      attention(q + i * qd, qpos + i, kv[i], out + i * qd, 1, q_heads, int64_t{qpos[i]} + 1, scale, precision);
  }
};

std::unique_ptr<Backend> make_reference_backend();
// The CPU backend on the best kernel variant this CPU runs (BLENDSERVE_CPU_ISA caps it;
// kernels/cpu/isa.h). make_cpu_backend_for (kernels/cpu/cpu_backend.h) picks one.
std::unique_ptr<Backend> make_cpu_backend();
// Threads the CPU kernels run on (OpenMP).
int cpu_compute_threads();

}  // namespace bs::kernels
