#include "model/transformer.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace bs {

KvCache Transformer::make_cache(int64_t capacity) const {
  const auto& c = model_.config();
  return KvCache(c.n_layers, c.n_kv_heads, c.head_dim, capacity);
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
  std::vector<float> xn(static_cast<size_t>(n * dim));
  std::vector<float> qkv(static_cast<size_t>(n * qkv_w));
  be.rmsnorm(hidden, L.attn_norm.data(), xn.data(), n, dim, c.rms_eps);
  be.linear(*L.wqkv, xn.data(), qkv.data(), n, L.qkv_bias.empty() ? nullptr : L.qkv_bias.data());
  for (int64_t t = 0; t < n; ++t) {
    const float* row = qkv.data() + t * qkv_w;
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
    for (int h = 0; h < c.n_kv_heads; ++h) {
      std::memcpy(cache.k_at(layer, h, pos[t]), k + t * kvd + h * hd, hd * sizeof(float));
      std::memcpy(cache.v_at(layer, h, pos[t]), v + t * kvd + h * hd, hd * sizeof(float));
    }
  }
}

void Transformer::attend_and_mlp(int layer, float* hidden, const float* q, const int32_t* pos, int64_t n,
                                 const KvCache& cache, int64_t n_kv) const {
  const auto& c = model_.config();
  const auto& L = model_.layer(layer);
  auto& be = model_.backend();
  const int64_t dim = c.dim, qd = c.q_dim(), hd = c.head_dim;
  std::vector<float> attn(static_cast<size_t>(n * qd));
  be.attention(q, pos, cache.k_layer(layer), cache.v_layer(layer), attn.data(), n, c.n_heads, c.n_kv_heads, hd, n_kv,
               cache.capacity, 1.0f / std::sqrt(static_cast<float>(hd)));
  std::vector<float> proj(static_cast<size_t>(n * dim));
  be.linear(*L.wo, attn.data(), proj.data(), n, nullptr);
  for (int64_t i = 0; i < n * dim; ++i) hidden[i] += proj[i];

  std::vector<float> xn(static_cast<size_t>(n * dim));
  be.rmsnorm(hidden, L.ffn_norm.data(), xn.data(), n, dim, c.rms_eps);
  std::vector<float> gate_up(static_cast<size_t>(n * 2 * c.ff)), act(static_cast<size_t>(n * c.ff));
  be.linear(*L.w_gate_up, xn.data(), gate_up.data(), n, nullptr);
  be.swiglu(gate_up.data(), act.data(), n, c.ff);
  be.linear(*L.w_down, act.data(), proj.data(), n, nullptr);
  for (int64_t i = 0; i < n * dim; ++i) hidden[i] += proj[i];
}

void Transformer::run_layer(int layer, float* hidden, const int32_t* pos, int64_t n, KvCache& cache,
                            int64_t n_kv) const {
  const auto& c = model_.config();
  std::vector<float> q(static_cast<size_t>(n * c.q_dim())), k(static_cast<size_t>(n * c.kv_dim())),
      v(static_cast<size_t>(n * c.kv_dim()));
  project_qkv(layer, hidden, pos, n, q.data(), k.data(), v.data());
  store_kv(layer, pos, n, k.data(), v.data(), cache);
  attend_and_mlp(layer, hidden, q.data(), pos, n, cache, n_kv);
}

void Transformer::logits(const float* hidden, int64_t n, float* out) const {
  const auto& c = model_.config();
  std::vector<float> xn(static_cast<size_t>(n * c.dim));
  model_.backend().rmsnorm(hidden, model_.output_norm().data(), xn.data(), n, c.dim, c.rms_eps);
  model_.backend().linear(model_.output(), xn.data(), out, n, nullptr);
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

}  // namespace bs
