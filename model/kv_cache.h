// Per-sequence KV cache, indexed by prompt position.
#pragma once

#include <cstdint>
#include <vector>

namespace bs {

struct KvCache {
  int n_layers = 0, kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;
  int64_t length = 0;  // positions [0, length) hold valid K/V
  // [n_layers, kv_heads, capacity, head_dim]; K is stored after RoPE.
  std::vector<float> k, v;

  KvCache() = default;
  KvCache(int layers, int kv_heads_, int head_dim_, int64_t capacity_)
      : n_layers(layers), kv_heads(kv_heads_), head_dim(head_dim_), capacity(capacity_),
        k(static_cast<size_t>(layers) * kv_heads_ * capacity_ * head_dim_),
        v(static_cast<size_t>(layers) * kv_heads_ * capacity_ * head_dim_) {}

  float* k_layer(int l) { return k.data() + static_cast<int64_t>(l) * kv_heads * capacity * head_dim; }
  float* v_layer(int l) { return v.data() + static_cast<int64_t>(l) * kv_heads * capacity * head_dim; }
  const float* k_layer(int l) const { return k.data() + static_cast<int64_t>(l) * kv_heads * capacity * head_dim; }
  const float* v_layer(int l) const { return v.data() + static_cast<int64_t>(l) * kv_heads * capacity * head_dim; }
  // Row of one position of one head in layer l.
  float* k_at(int l, int h, int64_t pos) { return k_layer(l) + (h * capacity + pos) * head_dim; }
  float* v_at(int l, int h, int64_t pos) { return v_layer(l) + (h * capacity + pos) * head_dim; }
};

}  // namespace bs
