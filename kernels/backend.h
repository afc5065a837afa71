// The compute backend interface. Every op the model needs is one virtual here;
// the scalar reference (kernels/ref), the AVX-512/oneDNN CPU backend (kernels/cpu)
// and the CUDA backend fill it, and tests run every op on every backend against
// the reference. Pointers are host pointers for CPU backends and device pointers
// for device backends. Shapes are given next to each parameter, row-major,
// innermost last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bs::kernels {

// Storage type of a weight matrix as it comes from the model file.
enum class WeightType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, BF16 = 30 };

// Arithmetic used by the large GEMMs (prefill). Decode-size products always read
// the stored (quantized) weights directly with fp32 accumulation.
enum class Precision { F32, BF16 };

// A weight matrix W: [out_features, in_features], each row stored contiguously in
// `type` (quantized blocks along in_features). `data` must outlive the prepared weights.
struct WeightView {
  WeightType type = WeightType::F32;
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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

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
  // by prompt position). Query head h reads KV head h / (q_heads / kv_heads).
  virtual void attention(const float* q,       // [n, q_heads, head_dim]
                         const int32_t* qpos,  // [n]
                         const float* k,       // [kv_heads, kv_stride, head_dim]
                         const float* v,       // [kv_heads, kv_stride, head_dim]
                         float* out,           // [n, q_heads, head_dim]
                         int64_t n, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                         int64_t n_kv, int64_t kv_stride, float scale,
                         Precision precision  // BF16: bf16 dot products, fp32 softmax/accumulation
                         ) = 0;
};

std::unique_ptr<Backend> make_reference_backend();
std::unique_ptr<Backend> make_cpu_backend();
// Threads the CPU kernels run on (OpenMP).
int cpu_compute_threads();

}  // namespace bs::kernels
