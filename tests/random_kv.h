// Chunk KV of random bytes for the storage tests (the remote tier, its TLS,
// replication), and the key those tests store it under.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>

#include "storage/chunk_kv.h"

namespace bs::testing {

// `m` random tokens and random K/V bytes of the shape (layers, kv heads, head dim).
inline std::shared_ptr<ChunkKv> random_kv(std::mt19937& rng, int layers, int heads, int m, int head_dim,
                                          kernels::TensorType dtype = kernels::TensorType::F16) {
  auto kv = std::make_shared<ChunkKv>();
  kv->n_layers = layers, kv->kv_heads = heads, kv->head_dim = head_dim;
  kv->dtype = dtype;
  for (int i = 0; i < m; ++i) kv->tokens.push_back(static_cast<int32_t>(rng() % 150000));
  kv->allocate();
  for (size_t i = 0; i < kv->k.size(); ++i) {
    kv->k[i] = static_cast<std::byte>(rng());
    kv->v[i] = static_cast<std::byte>(rng());
  }
  return kv;
}

inline ChunkKey key_of(const ChunkKv& kv) { return make_chunk_key(11, KvKind::Chunk, kv.tokens); }

}  // namespace bs::testing
