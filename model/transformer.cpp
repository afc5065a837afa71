#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace bs {
namespace {

// Per-thread scratch buffers that only grow: a prefill's activations are tens of
// MB per layer, and zero-filling fresh vectors for every op costs more than the
// element-wise ops themselves. Each slot is used by one op at a time.
enum Slot { kXn, kQkv, kAttn, kProj, kGateUp, kAct, kQ, kK, kV, kSlots };
float* scratch(Slot slot, int64_t count) {
  thread_local std::vector<std::unique_ptr<float[]>> bufs(kSlots);
  thread_local std::vector<int64_t> sizes(kSlots, 0);
  if (sizes[slot] < count) {
    bufs[slot].reset(new float[static_cast<size_t>(count)]);
    sizes[slot] = count;
  }
  return bufs[slot].get();
}

}  // namespace

KvCache Transformer::make_cache(int64_t capacity) const {
  const auto& c = model_.config();
  return KvCache(c.n_layers, c.n_kv_heads, c.head_dim, capacity, model_.kv_dtype());
}

void Transformer::embed(std::span<const int32_t> tokens, float* hidden) const {
  model_.backend().embed(model_.token_embedding(), tokens.data(), hidden, static_cast<int64_t>(tokens.size()));
}

void Transformer::project_qkv(int layer, const float* hidden, const int32_t* pos, int64_t n, float* q, float* k,
                              float* v) const {
  const auto& c = model_.config();
  const auto& L = model_.layer(layer);
  auto& be = model_.backend();
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t qkv_w = qd + 2 * kvd;
  float* xn = scratch(kXn, n * dim);
  float* qkv = scratch(kQkv, n * qkv_w);
  be.rmsnorm(hidden, L.attn_norm.data(), xn, n, dim, c.rms_eps);
  be.linear(*L.wqkv, xn, qkv, n, L.qkv_bias.empty() ? nullptr : L.qkv_bias.data());
  for (int64_t t = 0; t < n; ++t) {
    const float* row = qkv + t * qkv_w;
    std::memcpy(q + t * qd, row, qd * sizeof(float));
    std::memcpy(k + t * kvd, row + qd, kvd * sizeof(float));
    std::memcpy(v + t * kvd, row + qd + kvd, kvd * sizeof(float));
  }
  be.rope(q, pos, n, c.n_heads, model_.rope());
  be.rope(k, pos, n, c.n_kv_heads, model_.rope());
}

void Transformer::store_kv(int layer, const int32_t* pos, int64_t n, const float* k, const float* v,
                           KvCache& cache) const {
  const auto& c = model_.config();
  const int64_t kvd = c.kv_dim(), hd = c.head_dim;
  for (int64_t t = 0; t < n; ++t) {
    if (pos[t] < 0 || pos[t] >= cache.capacity) throw std::out_of_range("store_kv: position outside the KV cache");
    for (int h = 0; h < c.n_kv_heads; ++h)
      cache.write_rows(layer, h, pos[t], 1, k + t * kvd + h * hd, v + t * kvd + h * hd);
  }
}

void Transformer::attend_and_mlp(int layer, float* hidden, const float* q, const int32_t* pos, int64_t n,
                                 const KvCache& cache, int64_t n_kv) const {
  const auto& c = model_.config();
  auto& be = model_.backend();
  const int64_t qd = c.q_dim(), hd = c.head_dim;
  float* attn = scratch(kAttn, n * qd);
  be.attention(q, pos, cache.view(layer), attn, n, c.n_heads, n_kv, 1.0f / std::sqrt(static_cast<float>(hd)),
               model_.precision());
  project_and_mlp(layer, hidden, attn, n);
}

void Transformer::project_and_mlp(int layer, float* hidden, const float* attn, int64_t n) const {
  const auto& c = model_.config();
  const auto& L = model_.layer(layer);
  auto& be = model_.backend();
  const int64_t dim = c.dim;
  float* proj = scratch(kProj, n * dim);
  be.linear(*L.wo, attn, proj, n, nullptr);
  for (int64_t i = 0; i < n * dim; ++i) hidden[i] += proj[i];

  float* xn = scratch(kXn, n * dim);
  be.rmsnorm(hidden, L.ffn_norm.data(), xn, n, dim, c.rms_eps);
  float* gate_up = scratch(kGateUp, n * 2 * c.ff);
  float* act = scratch(kAct, n * c.ff);
  be.linear(*L.w_gate_up, xn, gate_up, n, nullptr);
  be.swiglu(gate_up, act, n, c.ff);
  be.linear(*L.w_down, act, proj, n, nullptr);
  for (int64_t i = 0; i < n * dim; ++i) hidden[i] += proj[i];
}

void Transformer::run_layer(int layer, float* hidden, const int32_t* pos, int64_t n, KvCache& cache,
                            int64_t n_kv) const {
  const auto& c = model_.config();
  float* q = scratch(kQ, n * c.q_dim());
  float* k = scratch(kK, n * c.kv_dim());
  float* v = scratch(kV, n * c.kv_dim());
  project_qkv(layer, hidden, pos, n, q, k, v);
  store_kv(layer, pos, n, k, v, cache);
  attend_and_mlp(layer, hidden, q, pos, n, cache, n_kv);
}

void Transformer::logits(const float* hidden, int64_t n, float* out) const {
  const auto& c = model_.config();
  float* xn = scratch(kXn, n * c.dim);
  model_.backend().rmsnorm(hidden, model_.output_norm().data(), xn, n, c.dim, c.rms_eps);
  model_.backend().linear(model_.output(), xn, out, n, nullptr);
}

std::vector<float> Transformer::forward(std::span<const int32_t> tokens, KvCache& cache, bool all_logits) const {
  const auto& c = model_.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw std::invalid_argument("forward: no tokens");
  if (cache.length + n > cache.capacity) throw std::length_error("forward: KV cache capacity exceeded");
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(cache.length + t);
  std::vector<float> hidden(static_cast<size_t>(n * c.dim));
  embed(tokens, hidden.data());
  const int64_t n_kv = cache.length + n;
  for (int l = 0; l < c.n_layers; ++l) run_layer(l, hidden.data(), pos.data(), n, cache, n_kv);
  cache.length = n_kv;
  const int64_t rows = all_logits ? n : 1;
  std::vector<float> out(static_cast<size_t>(rows * c.vocab));
  logits(hidden.data() + (n - rows) * c.dim, rows, out.data());
  return out;
}

std::vector<float> Transformer::decode_step(std::span<const int32_t> tokens, std::span<KvCache* const> caches) const {
  const auto& c = model_.config();
  const int64_t B = static_cast<int64_t>(tokens.size());
  if (B == 0) throw std::invalid_argument("decode_step: no tokens");
  if (static_cast<int64_t>(caches.size()) != B)
    throw std::invalid_argument("decode_step: " + std::to_string(B) + " tokens for " + std::to_string(caches.size()) +
                                " caches");
  // Every check before any cache is touched: a refused step changes nothing.
  for (int64_t b = 0; b < B; ++b) {
    const KvCache* cache = caches[b];
    if (!cache) throw std::invalid_argument("decode_step: no cache");
    if (cache->n_layers != c.n_layers || cache->kv_heads != c.n_kv_heads || cache->head_dim != c.head_dim)
      throw std::invalid_argument("decode_step: a cache does not fit the model");
    if (cache->length + 1 > cache->capacity) throw std::length_error("decode_step: KV cache capacity exceeded");
    if (tokens[b] < 0 || tokens[b] >= c.vocab) throw std::out_of_range("decode_step: token id out of range");
  }
  std::vector<KvCache*> sorted(caches.begin(), caches.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::invalid_argument("decode_step: a cache is given twice");

  std::vector<float> out(static_cast<size_t>(B * c.vocab));
  const int64_t part = std::max<int64_t>(1, model_.backend().linear_exact_rows());
  for (int64_t b0 = 0; b0 < B; b0 += part) {
    const int64_t m = std::min(part, B - b0);
    decode_rows(tokens.subspan(b0, m), caches.subspan(b0, m), out.data() + b0 * c.vocab);
  }
  return out;
}

void Transformer::decode_rows(std::span<const int32_t> tokens, std::span<KvCache* const> caches,
                              float* logits_out) const {
  const auto& c = model_.config();
  auto& be = model_.backend();
  const int64_t B = static_cast<int64_t>(tokens.size());
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim;
  std::vector<int32_t> pos(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) pos[b] = static_cast<int32_t>(caches[b]->length);
  std::vector<float> hidden(static_cast<size_t>(B * c.dim));
  embed(tokens, hidden.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<kernels::KvView> views(static_cast<size_t>(B));
  for (int l = 0; l < c.n_layers; ++l) {
    float* q = scratch(kQ, B * qd);
    float* k = scratch(kK, B * kvd);
    float* v = scratch(kV, B * kvd);
    project_qkv(l, hidden.data(), pos.data(), B, q, k, v);  // RoPE per row at its own position
    float* attn = scratch(kAttn, B * qd);
    for (int64_t b = 0; b < B; ++b) {
      KvCache& cache = *caches[b];
      store_kv(l, &pos[b], 1, k + b * kvd, v + b * kvd, cache);
      views[b] = cache.view(l);
    }
    // Each row over its own cache, all rows in one call (= attention() of each alone).
    be.attention_rows(q, pos.data(), views.data(), attn, B, c.n_heads, scale, model_.precision());
    project_and_mlp(l, hidden.data(), attn, B);
  }
  for (int64_t b = 0; b < B; ++b) caches[b]->length = pos[b] + 1;
  logits(hidden.data(), B, logits_out);
}

}  // namespace bs
