// Per-sequence KV cache, indexed by prompt position.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace bs {

// Allocator that leaves new floats uninitialized: a cache is hundreds of MB and
// every row is written before it is read (attention reads positions < n_kv only,
// all of which were computed or loaded), so zero-filling it is pure cost.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using CacheBuffer = std::vector<float, DefaultInitAllocator<float>>;

struct KvCache {
  int n_layers = 0, kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;
  int64_t length = 0;  // positions [0, length) hold valid K/V
  // [n_layers, kv_heads, capacity, head_dim]; K is stored after RoPE.
  CacheBuffer k, v;

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
  const float* k_at(int l, int h, int64_t pos) const { return k_layer(l) + (h * capacity + pos) * head_dim; }
  const float* v_at(int l, int h, int64_t pos) const { return v_layer(l) + (h * capacity + pos) * head_dim; }
};

}  // namespace bs
