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
std::unique_ptr<PreparedWeights> ProfilingBackend::prepare_fused(const std::vector<WeightView>& parts, Precision p) {
  return inner_.prepare_fused(parts, p);
}
std::unique_ptr<PreparedWeights> ProfilingBackend::prepare_embedding(const WeightView& table) {
  return inner_.prepare_embedding(table);
}
std::unique_ptr<PreparedRope> ProfilingBackend::prepare_rope(const RopeTable& table) {
  return inner_.prepare_rope(table);
}
void ProfilingBackend::linear(const PreparedWeights& w, const float* x, float* y, int64_t n, const float* bias) {
  // The CPU backend's decode-size products (its GEMV path) are its exact rows.
  timed(stats_, n <= inner_.linear_exact_rows() ? "linear_gemv" : "linear_gemm",
        [&] { inner_.linear(w, x, y, n, bias); });
}
void ProfilingBackend::embed(const PreparedWeights& table, const int32_t* ids, float* out, int64_t n) {
  timed(stats_, "embed", [&] { inner_.embed(table, ids, out, n); });
}
void ProfilingBackend::rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) {
  timed(stats_, "rmsnorm", [&] { inner_.rmsnorm(x, weight, out, n, dim, eps); });
}
void ProfilingBackend::rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& rope) {
  timed(stats_, "rope", [&] { inner_.rope(x, pos, n, heads, rope); });
}
void ProfilingBackend::add(float* y, const float* x, int64_t count) {
  timed(stats_, "add", [&] { inner_.add(y, x, count); });
}
void ProfilingBackend::split_qkv(const float* qkv, float* q, float* k, float* v, int64_t n, int64_t q_dim,
                                 int64_t kv_dim) {
  timed(stats_, "split_qkv", [&] { inner_.split_qkv(qkv, q, k, v, n, q_dim, kv_dim); });
}
void ProfilingBackend::gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t width) {
  timed(stats_, "gather_rows", [&] { inner_.gather_rows(src, rows, dst, n, width); });
}
void ProfilingBackend::store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) {
  timed(stats_, "store_kv", [&] { inner_.store_kv(kv, pos, k, v, n); });
}
void ProfilingBackend::store_kv_rows(const KvView* kv, const int32_t* pos, const float* k, const float* v,
                                     int64_t n) {
  timed(stats_, "store_kv", [&] { inner_.store_kv_rows(kv, pos, k, v, n); });
}
void ProfilingBackend::kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                                    KvDeviation which, double* out) {
  timed(stats_, "kv_deviation", [&] { inner_.kv_deviation(kv, pos, k, v, n, which, out); });
}
void ProfilingBackend::attention_mass(const float* q, const int32_t* qpos, const KvView& kv, int64_t n,
                                      int64_t q_heads, int64_t n_kv, float scale, double* out) {
  timed(stats_, "attention_mass", [&] { inner_.attention_mass(q, qpos, kv, n, q_heads, n_kv, scale, out); });
}
void ProfilingBackend::top_k(const double* score, int64_t n, int64_t k, int32_t* out) {
  timed(stats_, "top_k", [&] { inner_.top_k(score, n, k, out); });
}
void ProfilingBackend::rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta,
                                    const PreparedRope& rope) {
  timed(stats_, "rope_kv_rows", [&] { inner_.rope_kv_rows(kv, first, m, delta, rope); });
}
void ProfilingBackend::swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) {
  timed(stats_, "swiglu", [&] { inner_.swiglu(gate_up, out, n, ff); });
}
void ProfilingBackend::geglu(const float* gate_up, float* out, int64_t n, int64_t ff) {
  timed(stats_, "geglu", [&] { inner_.geglu(gate_up, out, n, ff); });
}
void ProfilingBackend::scale(float* x, int64_t count, float s) {
  timed(stats_, "scale", [&] { inner_.scale(x, count, s); });
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
