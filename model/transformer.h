// The Llama forward pass over a KvCache, on any backend. Layers are exposed one
// at a time so the blend pipeline can run them on a subset of tokens and look at
// the fresh K/V before they are written.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace bs {

// Called after a layer computed the fresh K (after RoPE) and V of its tokens and
// before they are written into the cache; may inspect or edit them.
struct LayerHook {
  virtual ~LayerHook() = default;
  virtual void on_fresh_kv(int layer,
                           const int32_t* pos,  // [n]
                           float* k,            // [n, kv_heads, head_dim]
                           float* v,            // [n, kv_heads, head_dim]
                           int64_t n) = 0;
};

class Transformer {
 public:
  explicit Transformer(const LlamaModel& model) : model_(model) {}

  KvCache make_cache(int64_t capacity) const;

  // Token embeddings: [n, dim]
  void embed(std::span<const int32_t> tokens, float* hidden) const;

  // One layer for n tokens at the given positions: writes their K/V into the cache
  // at those positions, attends causally by position over cache rows [0, n_kv),
  // and updates hidden in place (residual stream).
  void run_layer(int layer,
                 float* hidden,        // [n, dim]
                 const int32_t* pos,   // [n]
                 int64_t n, KvCache& cache, int64_t n_kv, LayerHook* hook = nullptr) const;

  // Final norm + LM head for n rows: [n, vocab]
  void logits(const float* hidden, int64_t n, float* out) const;

  // Full forward of tokens at positions cache.length ... cache.length + n - 1;
  // extends cache.length. Returns logits of the last token, or of every token
  // when all_logits ([n, vocab]).
  std::vector<float> forward(std::span<const int32_t> tokens, KvCache& cache, bool all_logits = false) const;

  const LlamaModel& model() const { return model_; }

 private:
  const LlamaModel& model_;
};

}  // namespace bs
