// The KV cache of one chunk of tokens, computed alone: K after RoPE at positions
// 0..m-1, V as is, for every layer. Keys never include a position, so one entry
// serves the chunk wherever it lands in a prompt.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace bs {

struct ChunkKv {
  std::vector<int32_t> tokens;
  int n_layers = 0, kv_heads = 0, head_dim = 0;
  // [n_layers, kv_heads, m, head_dim]: layer-major, so one layer is one contiguous slice.
  std::vector<float> k, v;

  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
  int64_t layer_stride() const { return static_cast<int64_t>(kv_heads) * length() * head_dim; }
  const float* k_layer(int l) const { return k.data() + l * layer_stride(); }
  const float* v_layer(int l) const { return v.data() + l * layer_stride(); }
  size_t bytes() const { return (k.size() + v.size()) * sizeof(float) + tokens.size() * sizeof(int32_t); }
};

// 128-bit content key: XXH3-128 of (model fingerprint, kind, token ids).
struct ChunkKey {
  uint64_t hi = 0, lo = 0;
  bool operator==(const ChunkKey&) const = default;
  std::string hex() const;
};
struct ChunkKeyHash {
  size_t operator()(const ChunkKey& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)); }
};

// Chunks and exact prefixes are different kinds of entries: a prefix's KV is only
// valid at position 0, a chunk's anywhere after repair.
enum class KvKind : uint8_t { Chunk = 1, Prefix = 2 };

// `prelude`: tokens the chunk was computed behind (then dropped); they shape its KV,
// so they are part of the key. Empty: the key of a chunk computed alone (unchanged).
ChunkKey make_chunk_key(uint64_t model_fingerprint, KvKind kind, std::span<const int32_t> tokens,
                        std::span<const int32_t> prelude = {});

}  // namespace bs
