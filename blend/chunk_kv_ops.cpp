// A chunk's KV and a request's cache: the keys a chunk and a prefix are stored under,
// a chunk computed alone or behind a prefix, placed into a request's cache with its
// positions repaired (copy_chunk_layer, rotate_chunk_layer, place_chunk_kv), taken
// back out of a request's cache (chunk_in_context), and gathered from the
// tensor-parallel ranks' heads (blend/blend_engine.h declares each).
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "blend/blend_engine.h"
#include "blend/engine_buffers.h"
#include "kernels/dequant.h"
#include "kernels/kv_view.h"

namespace bs {
using namespace blend_detail;
namespace {

// An entry for `tokens` in the model's KV shape and `dtype`, K and V allocated.
std::shared_ptr<ChunkKv> allocated_chunk(std::span<const int32_t> tokens, const LlamaConfig& c,
                                         kernels::TensorType dtype) {
  auto kv = std::make_shared<ChunkKv>();
  kv->tokens.assign(tokens.begin(), tokens.end());
  kv->n_layers = c.n_layers;
  kv->kv_heads = c.n_kv_heads;
  kv->head_dim = c.head_dim;
  kv->dtype = dtype;
  kv->allocate();
  return kv;
}

}  // namespace

ChunkKey BlendEngine::chunk_key(std::span<const int32_t> tokens) const {
  return make_chunk_key(tf_.model().fingerprint(), KvKind::Chunk, tokens, chunk_prelude_);
}
ChunkKey BlendEngine::prefix_key(std::span<const int32_t> tokens) const {
  return make_chunk_key(tf_.model().fingerprint(), KvKind::Prefix, tokens);
}
std::vector<ChunkKey> BlendEngine::prefix_block_keys(std::span<const int32_t> tokens, int64_t block,
                                                     int64_t end) const {
  std::vector<ChunkKey> keys;
  if (block <= 0) return keys;
  end = std::clamp<int64_t>(end, 0, static_cast<int64_t>(tokens.size()));
  ChunkKey previous{};
  for (int64_t at = 0; at < end; at += block) {
    const int64_t m = std::min(block, end - at);
    previous = make_prefix_block_key(tf_.model().fingerprint(), previous, tokens.subspan(at, m));
    keys.push_back(previous);
  }
  return keys;
}

void copy_chunk_layer(const std::byte* k, const std::byte* v, kernels::TensorType dtype, int64_t m, int layer,
                      int64_t offset, KvCache& cache, int first_head, kernels::Stream* stream) {
  if (offset < 0 || offset + m > cache.capacity) throw std::out_of_range("copy_chunk_layer: chunk outside the cache");
  if (first_head < 0) throw std::out_of_range("copy_chunk_layer: negative first head");
  const int64_t hd = cache.head_dim;
  const int64_t head_bytes = m * hd * kernels::kv_dtype_bytes(dtype);
  k += first_head * head_bytes;  // this rank's heads: a contiguous run of the layer
  v += first_head * head_bytes;
  if (dtype == cache.dtype()) {  // this rank's heads, [kv_heads, m, hd]: one block
    cache.write_block_raw(layer, offset, m, k, v, stream);
    return;
  }
  // Not reached through keys (the dtype is part of them); a chunk of another dtype is
  // still placed correctly: widened, then rounded to the cache's.
  std::vector<float> kf(static_cast<size_t>(m * hd)), vf(kf.size());
  for (int h = 0; h < cache.kv_heads; ++h) {
    kernels::kv_to_fp32(dtype, k + h * head_bytes, kf.data(), m * hd);
    kernels::kv_to_fp32(dtype, v + h * head_bytes, vf.data(), m * hd);
    cache.write_rows(layer, h, offset, m, kf.data(), vf.data());
  }
}

void rotate_chunk_layer(int layer, int64_t offset, int64_t m, KvCache& cache, const LlamaModel& model) {
  if (offset == 0 || m == 0) return;
  // K through fp32 (a half-precision cache is rounded once more after the rotation,
  // as K computed at that position would be); V is untouched. The layer's own table
  // (a local layer's base differs).
  model.backend().rope_kv_rows(cache.view(layer), offset, m, static_cast<int32_t>(offset), model.rope(layer));
}

void place_chunk_kv(const ChunkKv& chunk, int64_t offset, KvCache& cache, const LlamaModel& model) {
  const int64_t m = chunk.length();
  if (offset < 0 || offset + m > cache.capacity) throw std::out_of_range("place_chunk_kv: chunk outside the cache");
  for (int l = 0; l < chunk.n_layers; ++l) {
    copy_chunk_layer(chunk.k_layer(l), chunk.v_layer(l), chunk.dtype, m, l, offset, cache);
    rotate_chunk_layer(l, offset, m, cache, model);
  }
}

std::shared_ptr<const ChunkKv> BlendEngine::compute_chunk_kv(std::span<const int32_t> tokens,
                                                             const LayerWait& between_layers) const {
  return compute_kv_behind(chunk_prelude_, tokens, between_layers);
}

std::shared_ptr<const ChunkKv> BlendEngine::compute_prefix_kv(std::span<const int32_t> tokens,
                                                              const LayerWait& between_layers) const {
  return compute_kv_behind({}, tokens, between_layers);
}

std::shared_ptr<ChunkKv> BlendEngine::chunk_in_context(const KvCache& cache, int64_t offset,
                                                       std::span<const int32_t> tokens) const {
  const auto& c = tf_.model().config();
  auto& be = tf_.model().backend();
  const int64_t m = static_cast<int64_t>(tokens.size());
  if (tf_.comm()) throw std::logic_error("chunk_in_context: a tensor-parallel rank's cache holds only its KV heads");
  if (!be.host_accessible()) throw std::logic_error("chunk_in_context: the cache is device memory");
  if (m == 0 || offset < 0 || offset + m > cache.length)
    throw std::out_of_range("chunk_in_context: rows [" + std::to_string(offset) + ", " + std::to_string(offset + m) +
                            ") outside the cache's " + std::to_string(cache.length));
  auto kv = allocated_chunk(tokens, c, cache.dtype());
  const int64_t head_bytes = m * c.head_dim * kv->elem_bytes();
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h)
      cache.read_rows_raw(l, h, offset, m, kv->k_layer(l) + h * head_bytes, kv->v_layer(l) + h * head_bytes);
    // R(i) = R(-offset)·R(offset + i), on the copy ([kv_heads, m, head_dim]: one page).
    if (offset > 0)
      be.rope_kv_rows(kernels::KvView::contiguous(kv->k_layer(l), kv->v_layer(l), c.n_kv_heads, m, c.head_dim,
                                                  kv->dtype),
                      0, m, static_cast<int32_t>(-offset), tf_.model().rope(l));
  }
  return kv;
}

std::shared_ptr<const ChunkKv> BlendEngine::compute_kv_behind(std::span<const int32_t> before,
                                                              std::span<const int32_t> tokens,
                                                              const LayerWait& between_layers) const {
  const auto& c = tf_.model().config();
  const int64_t m = static_cast<int64_t>(tokens.size());
  const int64_t p = static_cast<int64_t>(before.size());
  if (m == 0) throw std::invalid_argument("compute_chunk_kv: empty chunk");
  if (p + m > c.context_length)
    throw std::length_error("compute_chunk_kv: " + std::to_string(p) + " + " + std::to_string(m) +
                            " tokens exceed the model context of " + std::to_string(c.context_length));
  std::vector<int32_t> all(before.begin(), before.end());
  all.insert(all.end(), tokens.begin(), tokens.end());
  const int64_t n = p + m;
  auto& be = tf_.model().backend();
  auto cache = tf_.make_cache(n);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  kernels::DeviceBuffer pos_dev, hidden = be.alloc(n * c.dim * static_cast<int64_t>(sizeof(float)));
  upload_ints(be, pos, pos_dev);
  tf_.embed(all, hidden.as<float>());
  for (int l = 0; l < c.n_layers; ++l) {
    if (between_layers) between_layers(l);
    tf_.run_layer(l, hidden.as<float>(), pos_dev.as<int32_t>(), n, cache, n);
  }
  auto kv = allocated_chunk(tokens, c, cache.dtype());
  const int64_t head_elems = m * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    // R(i) = R(-p)·R(p + i): the stored convention (positions 0..m-1), rotated in this
    // private cache before the rows are copied out.
    if (p > 0) be.rope_kv_rows(cache.view(l), p, m, static_cast<int32_t>(-p), tf_.model().rope(l));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const int64_t dst = static_cast<int64_t>(h) * head_elems * kv->elem_bytes();
      cache.read_rows_raw(l, h, p, m, kv->k_layer(l) + dst, kv->v_layer(l) + dst);
    }
  }
  if (!tf_.comm()) return kv;
  return gather_chunk_heads(*kv);
}

std::shared_ptr<const ChunkKv> BlendEngine::gather_chunk_heads(const ChunkKv& mine) const {
  // Rank r holds KV heads [r * h, (r + 1) * h) of every layer; a layer of the stored
  // chunk is head-major, so each rank's heads are one contiguous run of it. The ranks
  // gather [K layer 0, V layer 0, K layer 1, ...] and every rank places every run:
  // the tiers keep one format whatever the degree.
  auto& comm = *tf_.comm();
  const int size = comm.size();
  const int64_t run = mine.layer_bytes(), per_rank = 2 * int64_t{mine.n_layers} * run;
  auto& be = tf_.model().backend();
  kernels::DeviceBuffer local = be.alloc(per_rank), all = be.alloc(per_rank * size);
  for (int l = 0; l < mine.n_layers; ++l) {
    be.copy_to_backend(local.as<std::byte>() + (2 * l) * run, mine.k_layer(l), run);
    be.copy_to_backend(local.as<std::byte>() + (2 * l + 1) * run, mine.v_layer(l), run);
  }
  tf_.sync_for_collective();
  comm.all_gather_bytes(local.as<std::byte>(), all.as<std::byte>(), per_rank, tf_.collective_timeout());
  auto kv = std::make_shared<ChunkKv>();
  kv->tokens = mine.tokens;
  kv->n_layers = mine.n_layers;
  kv->kv_heads = mine.kv_heads * size;
  kv->head_dim = mine.head_dim;
  kv->dtype = mine.dtype;
  kv->allocate();
  for (int r = 0; r < size; ++r) {
    const std::byte* src = all.as<std::byte>() + r * per_rank;
    for (int l = 0; l < mine.n_layers; ++l) {
      be.copy_to_host(kv->k_layer(l) + r * run, src + (2 * l) * run, run);
      be.copy_to_host(kv->v_layer(l) + r * run, src + (2 * l + 1) * run, run);
    }
  }
  return kv;
}

}  // namespace bs
