// The KV cache of one chunk of tokens, computed alone: K after RoPE at positions
// 0..m-1, V as is, for every layer. Keys never include a position, so one entry
// serves the chunk wherever it lands in a prompt.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <memory>
#include <vector>

#include "kernels/tensor_types.h"

namespace bs {

// K and V are stored in the dtype they were computed in (the KV cache's, F32, F16 or
// BF16: kernels/kv_view.h): the bytes a request's cache holds, copied unchanged. The
// dtype is part of the model fingerprint and so of the key: an entry is only ever
// asked for by a cache of its own dtype.
struct ChunkKv {
  std::vector<int32_t> tokens;
  int n_layers = 0, kv_heads = 0, head_dim = 0;
  kernels::TensorType dtype = kernels::TensorType::F32;
  // [n_layers, kv_heads, m, head_dim] elements of dtype: layer-major, so one layer is
  // one contiguous slice.
  std::vector<std::byte> k, v;
  // Set by a RAM tier whose backend page-locks its entries (MemoryKvStore's pinner,
  // kernels::Backend::pin_host), so a loader's DMA reads k and v in place; released with
  // the entry, before k and v are freed (declared after them). Opaque: nothing else
  // reads it.
  mutable std::shared_ptr<void> host_pin;

  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
  int64_t elem_bytes() const;
  // Elements (and bytes) in K, and in V, of one layer.
  int64_t layer_elements() const { return static_cast<int64_t>(kv_heads) * length() * head_dim; }
  int64_t layer_bytes() const { return layer_elements() * elem_bytes(); }
  const std::byte* k_layer(int l) const { return k.data() + l * layer_bytes(); }
  const std::byte* v_layer(int l) const { return v.data() + l * layer_bytes(); }
  std::byte* k_layer(int l) { return k.data() + l * layer_bytes(); }
  std::byte* v_layer(int l) { return v.data() + l * layer_bytes(); }
  // Sizes k and v for the shape, tokens and dtype.
  void allocate();
  // Whether k and v have the sizes the shape says.
  bool consistent() const;
  size_t bytes() const { return k.size() + v.size() + tokens.size() * sizeof(int32_t); }

  // As fp32 (exact), [n_layers, kv_heads, m, head_dim]: for tests and tools.
  std::vector<float> k_fp32() const;
  std::vector<float> v_fp32() const;
  // Sets K and V from fp32 values (rounded to dtype), sizing them first; each span
  // holds n_layers * layer_elements() values.
  void set_fp32(std::span<const float> k_values, std::span<const float> v_values);
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
// PrefixBlock: one block of a prompt's first tokens (automatic prefix caching), its K
// at its own positions; the key chains every token before it (make_prefix_block_key).
enum class KvKind : uint8_t { Chunk = 1, Prefix = 2, PrefixBlock = 3 };

// `prelude`: tokens the chunk was computed behind (then dropped); they shape its KV,
// so they are part of the key. Empty: the key of a chunk computed alone (unchanged).
ChunkKey make_chunk_key(uint64_t model_fingerprint, KvKind kind, std::span<const int32_t> tokens,
                        std::span<const int32_t> prelude = {});

// The key of block j of a prompt (automatic prefix caching, as vLLM's hashed blocks):
// XXH3-128 of (model fingerprint, PrefixBlock, the key of block j-1, the block's
// tokens); block 0 chains from the zero key. Two prompts' block j keys are equal only
// where their first (j+1) blocks are, so an entry found under it holds the KV of exactly
// these tokens at exactly these positions, whatever the prompt goes on with.
ChunkKey make_prefix_block_key(uint64_t model_fingerprint, const ChunkKey& previous, std::span<const int32_t> block);

// Rows [from, from + m) of every layer and head of `kv` as an entry of their own (their
// tokens, the same dtype and shape, K as it was: at the source's positions).
std::shared_ptr<ChunkKv> slice_rows(const ChunkKv& kv, int64_t from, int64_t m);

}  // namespace bs
