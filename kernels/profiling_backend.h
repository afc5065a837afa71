// A Backend decorator that times every op it forwards (wall-clock per call), so a
// benchmark can say where prefill and decode time goes. Its own buffers and workspaces
// are host memory (the base class's): it wraps the CPU backends, whose ops read host
// memory.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace bs::kernels {

struct OpStats {
  double seconds = 0;
  int64_t calls = 0;
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name() + "+profile"; }
  std::string kernel_id() const override { return inner_.kernel_id(); }
  double setup_seconds() const override { return inner_.setup_seconds(); }
  bool supports(Precision p) const override { return inner_.supports(p); }
  int64_t linear_exact_rows() const override { return inner_.linear_exact_rows(); }
  bool batch_invariant() const override { return inner_.batch_invariant(); }
  bool sliding_window_attention() const override { return inner_.sliding_window_attention(); }
  // Its own workspaces and the inner backend's.
  void release_scratch() override {
    inner_.release_scratch();
    Backend::release_scratch();
  }
  const std::map<std::string, OpStats>& stats() const { return stats_; }
  void reset() { stats_.clear(); }

  std::unique_ptr<PreparedWeights> prepare(const WeightView& w, Precision p) override;
  std::unique_ptr<PreparedWeights> prepare_fused(const std::vector<WeightView>& parts, Precision p) override;
  std::unique_ptr<PreparedWeights> prepare_embedding(const WeightView& table) override;
  std::unique_ptr<PreparedRope> prepare_rope(const RopeTable& table) override;
  void linear(const PreparedWeights& w, const float* x, float* y, int64_t n, const float* bias) override;
  void embed(const PreparedWeights& table, const int32_t* ids, float* out, int64_t n) override;
  void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) override;
  void rope(float* x, const int32_t* pos, int64_t n, int64_t heads, const PreparedRope& rope) override;
  void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) override;
  void geglu(const float* gate_up, float* out, int64_t n, int64_t ff) override;
  void scale(float* x, int64_t count, float s) override;
  void add(float* y, const float* x, int64_t count) override;
  void split_qkv(const float* qkv, float* q, float* k, float* v, int64_t n, int64_t q_dim, int64_t kv_dim) override;
  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t width) override;
  void store_kv(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n) override;
  void store_kv_rows(const KvView* kv, const int32_t* pos, const float* k, const float* v, int64_t n) override;
  void kv_deviation(const KvView& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
                    KvDeviation which, double* out) override;
  void attention_mass(const float* q, const int32_t* qpos, const KvView& kv, int64_t n, int64_t q_heads,
                      int64_t n_kv, float scale, double* out) override;
  void top_k(const double* score, int64_t n, int64_t k, int32_t* out) override;
  void rope_kv_rows(const KvView& kv, int64_t first, int64_t m, int32_t delta, const PreparedRope& rope) override;
  void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                 int64_t n_kv, float scale, Precision precision) override;
  void attention_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n, int64_t q_heads,
                      float scale, Precision precision) override;

 private:
  Backend& inner_;
  std::map<std::string, OpStats> stats_;
};

}  // namespace bs::kernels
