#include "kernels/profiling_backend.h"

#include <chrono>

namespace bs::kernels {
namespace {

template <class F>
void timed(std::map<std::string, OpStats>& stats, const char* op, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  auto& s = stats[op];
  s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++s.calls;
}

}  // namespace

std::unique_ptr<PreparedWeights> ProfilingBackend::prepare(const WeightView& w, Precision p) {
  return inner_.prepare(w, p);
}
void ProfilingBackend::linear(const PreparedWeights& w, const float* x, float* y, int64_t n, const float* bias) {
  // The CPU backend's decode-size products (its GEMV path) are its exact rows.
  timed(stats_, n <= inner_.linear_exact_rows() ? "linear_gemv" : "linear_gemm",
        [&] { inner_.linear(w, x, y, n, bias); });
}
void ProfilingBackend::embed(const WeightView& table, const int32_t* ids, float* out, int64_t n) {
  timed(stats_, "embed", [&] { inner_.embed(table, ids, out, n); });
}
void ProfilingBackend::rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) {
  timed(stats_, "rmsnorm", [&] { inner_.rmsnorm(x, weight, out, n, dim, eps); });
}
void ProfilingBackend::rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const RopeTable& table) {
  timed(stats_, "rope", [&] { inner_.rope(x, pos, n, heads, table); });
}
void ProfilingBackend::swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) {
  timed(stats_, "swiglu", [&] { inner_.swiglu(gate_up, out, n, ff); });
}
void ProfilingBackend::attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n,
                                 int64_t q_heads, int64_t n_kv, float scale, Precision precision) {
  timed(stats_, "attention", [&] { inner_.attention(q, qpos, kv, out, n, q_heads, n_kv, scale, precision); });
}
void ProfilingBackend::attention_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n,
                                      int64_t q_heads, float scale, Precision precision) {
  timed(stats_, "attention", [&] { inner_.attention_rows(q, qpos, kv, out, n, q_heads, scale, precision); });
}

}  // namespace bs::kernels
