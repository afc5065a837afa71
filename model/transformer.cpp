#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

namespace bs {
namespace {

// The backend workspace slots the forward pass uses (kernels/workspace.h). Each is
// used by one op at a time; nothing of them lives beyond one Transformer call.
enum Slot { kXn, kQkv, kAttn, kProj, kGateUp, kAct, kQ, kK, kV, kIds, kPos, kHidden, kLogits, kGathered, kSlotCount };
static_assert(kSlotCount <= Transformer::kWorkspaceSlots);

}  // namespace

Transformer::Transformer(const LlamaModel& model, kernels::Communicator* comm,
                         std::chrono::milliseconds collective_timeout, Solo solo)
    : model_(model), solo_(solo), collective_timeout_(collective_timeout) {
  set_communicator(comm);
}

void Transformer::sync_for_collective() const {
  auto& be = model_.backend();
  if (!be.host_accessible()) be.synchronize();
}

void Transformer::set_communicator(kernels::Communicator* comm) {
  const TpShard shard = model_.shard();
  const int size = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  if (size != shard.size || rank != shard.rank)
    throw std::invalid_argument("Transformer: a communicator of rank " + std::to_string(rank) + " of " +
                                std::to_string(size) + " for the model shard of rank " + std::to_string(shard.rank) +
                                " of " + std::to_string(shard.size));
  comm_ = size == 1 ? nullptr : comm;
  reduce_ = size == 1 && solo_ == Solo::Skip ? nullptr : comm;
}

void Transformer::all_reduce(float* buf, int64_t count) const {
  if (!reduce_) return;
  const auto t0 = std::chrono::steady_clock::now();
  sync_for_collective();
  reduce_->all_reduce_sum(buf, count, collective_timeout_);
  ++collective_stats_.calls;
  collective_stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

KvCache Transformer::make_cache(int64_t capacity) const {
  const auto& c = model_.config();
  return KvCache(model_.backend(), c.n_layers, c.n_kv_heads, c.head_dim, capacity, model_.kv_dtype());
}

void Transformer::embed(std::span<const int32_t> tokens, float* hidden) const {
  auto& be = model_.backend();
  const int64_t n = static_cast<int64_t>(tokens.size());
  int32_t* ids = be.workspace().get<int32_t>(kIds, n);
  be.copy_to_backend(ids, tokens.data(), n * static_cast<int64_t>(sizeof(int32_t)));
  be.embed(model_.token_embedding(), ids, hidden, n);
  scale_embeddings(hidden, n);
}

void Transformer::scale_embeddings(float* hidden, int64_t n) const {
  const auto& c = model_.config();
  if (c.embed_scale) model_.backend().scale(hidden, n * c.dim, std::sqrt(static_cast<float>(c.dim)));
}

kernels::KvView Transformer::attention_view(const KvCache& cache, int layer) const {
  kernels::KvView view = cache.view(layer);
  view.window = model_.window(layer);
  return view;
}

void Transformer::project_qkv(int layer, const float* hidden, const int32_t* pos, int64_t n, float* q, float* k,
                              float* v) const {
  const auto& c = model_.config();
  const auto& L = model_.layer(layer);
  auto& be = model_.backend();
  auto& ws = be.workspace();
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim();
  float* xn = ws.get<float>(kXn, n * dim);
  float* qkv = ws.get<float>(kQkv, n * (qd + 2 * kvd));
  be.rmsnorm(hidden, L.attn_norm.as<float>(), xn, n, dim, c.rms_eps);
  be.linear(*L.wqkv, xn, qkv, n, L.qkv_bias ? L.qkv_bias.as<float>() : nullptr);
  if (c.qk_norm) {
    // Qwen3: each head's q and k RMS-normalized (one [head_dim] weight for all heads)
    // before RoPE. The split goes through scratch (slots free until attention), the
    // norms write q and k.
    float* raw_q = ws.get<float>(kGateUp, n * qd);
    float* raw_k = ws.get<float>(kAct, n * kvd);
    be.split_qkv(qkv, raw_q, raw_k, v, n, qd, kvd);
    be.rmsnorm(raw_q, L.attn_q_norm.as<float>(), q, n * c.n_heads, c.head_dim, c.rms_eps);
    be.rmsnorm(raw_k, L.attn_k_norm.as<float>(), k, n * c.n_kv_heads, c.head_dim, c.rms_eps);
  } else {
    be.split_qkv(qkv, q, k, v, n, qd, kvd);
  }
  be.rope(q, pos, n, c.n_heads, model_.rope(layer));
  be.rope(k, pos, n, c.n_kv_heads, model_.rope(layer));
}

void Transformer::store_kv(int layer, const int32_t* pos, int64_t n, const float* k, const float* v,
                           KvCache& cache) const {
  model_.backend().store_kv(cache.view(layer), pos, k, v, n);
}

void Transformer::attend_and_mlp(int layer, float* hidden, const float* q, const int32_t* pos, int64_t n,
                                 const KvCache& cache, int64_t n_kv) const {
  const auto& c = model_.config();
  auto& be = model_.backend();
  const int64_t qd = c.q_dim();
  float* attn = be.workspace().get<float>(kAttn, n * qd);
  be.attention(q, pos, attention_view(cache, layer), attn, n, c.n_heads, n_kv, c.attn_scale, model_.precision());
  project_and_mlp(layer, hidden, attn, n);
}

void Transformer::project_and_mlp(int layer, float* hidden, const float* attn, int64_t n) const {
  const auto& c = model_.config();
  const auto& L = model_.layer(layer);
  auto& be = model_.backend();
  auto& ws = be.workspace();
  const int64_t dim = c.dim;
  float* proj = ws.get<float>(kProj, n * dim);
  float* xn = ws.get<float>(kXn, n * dim);
  be.linear(*L.wo, attn, proj, n, nullptr);
  all_reduce(proj, n * dim);  // the ranks' heads' shares of the output projection
  if (c.post_norms) {  // Gemma 3: the whole sum normalized, then added
    be.rmsnorm(proj, L.post_attn_norm.as<float>(), xn, n, dim, c.rms_eps);
    be.add(hidden, xn, n * dim);
  } else {
    be.add(hidden, proj, n * dim);
  }

  be.rmsnorm(hidden, L.ffn_norm.as<float>(), xn, n, dim, c.rms_eps);
  float* gate_up = ws.get<float>(kGateUp, n * 2 * c.ff);
  float* act = ws.get<float>(kAct, n * c.ff);
  be.linear(*L.w_gate_up, xn, gate_up, n, nullptr);
  if (c.ffn_activation == FfnActivation::GeluTanh)
    be.geglu(gate_up, act, n, c.ff);
  else
    be.swiglu(gate_up, act, n, c.ff);
  be.linear(*L.w_down, act, proj, n, nullptr);
  all_reduce(proj, n * dim);  // the ranks' feed-forward shares
  if (c.post_norms) {
    be.rmsnorm(proj, L.post_ffw_norm.as<float>(), xn, n, dim, c.rms_eps);
    be.add(hidden, xn, n * dim);
  } else {
    be.add(hidden, proj, n * dim);
  }
}

void Transformer::run_layer(int layer, float* hidden, const int32_t* pos, int64_t n, KvCache& cache,
                            int64_t n_kv) const {
  const auto& c = model_.config();
  auto& ws = model_.backend().workspace();
  float* q = ws.get<float>(kQ, n * c.q_dim());
  float* k = ws.get<float>(kK, n * c.kv_dim());
  float* v = ws.get<float>(kV, n * c.kv_dim());
  project_qkv(layer, hidden, pos, n, q, k, v);
  store_kv(layer, pos, n, k, v, cache);
  attend_and_mlp(layer, hidden, q, pos, n, cache, n_kv);
}

void Transformer::logits(const float* hidden, int64_t n, float* out) const {
  const auto& c = model_.config();
  auto& be = model_.backend();
  auto& ws = be.workspace();
  float* xn = ws.get<float>(kXn, n * c.dim);
  const int64_t rows = model_.output_rows();  // the vocabulary, or this rank's share of it
  float* logits = ws.get<float>(kLogits, n * rows);
  be.rmsnorm(hidden, model_.output_norm(), xn, n, c.dim, c.rms_eps);
  be.linear(model_.output(), xn, logits, n, nullptr);
  if (rows == c.vocab) {
    be.copy_to_host(out, logits, n * c.vocab * static_cast<int64_t>(sizeof(float)));
    return;
  }
  // Rank r computed vocabulary rows [r * rows, (r + 1) * rows) of every position:
  // gathered as [ranks, n, rows], then placed as [n, vocab].
  const int size = comm_->size();
  float* gathered = ws.get<float>(kGathered, size * n * rows);
  const auto t0 = std::chrono::steady_clock::now();
  sync_for_collective();
  comm_->all_gather(logits, gathered, n * rows, collective_timeout_);
  ++collective_stats_.calls;
  collective_stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> all(static_cast<size_t>(size * n * rows));
  be.copy_to_host(all.data(), gathered, size * n * rows * static_cast<int64_t>(sizeof(float)));
  for (int r = 0; r < size; ++r)
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(all.data() + (int64_t{r} * n + i) * rows, rows, out + i * c.vocab + int64_t{r} * rows);
}

std::vector<float> Transformer::forward(std::span<const int32_t> tokens, KvCache& cache, bool all_logits) const {
  const auto& c = model_.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw std::invalid_argument("forward: no tokens");
  if (cache.length + n > cache.capacity) throw std::length_error("forward: KV cache capacity exceeded");
  auto& be = model_.backend();
  auto& ws = be.workspace();
  std::vector<int32_t> host_pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) host_pos[t] = static_cast<int32_t>(cache.length + t);
  int32_t* pos = ws.get<int32_t>(kPos, n);
  be.copy_to_backend(pos, host_pos.data(), n * static_cast<int64_t>(sizeof(int32_t)));
  float* hidden = ws.get<float>(kHidden, n * c.dim);
  embed(tokens, hidden);
  const int64_t n_kv = cache.length + n;
  for (int l = 0; l < c.n_layers; ++l) run_layer(l, hidden, pos, n, cache, n_kv);
  cache.length = n_kv;
  const int64_t rows = all_logits ? n : 1;
  std::vector<float> out(static_cast<size_t>(rows * c.vocab));
  logits(hidden + (n - rows) * c.dim, rows, out.data());
  return out;
}

void Transformer::check_decode(std::span<const int32_t> tokens, std::span<KvCache* const> caches) const {
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
}

std::vector<float> Transformer::decode_step(std::span<const int32_t> tokens, std::span<KvCache* const> caches) const {
  check_decode(tokens, caches);
  const auto& c = model_.config();
  const int64_t B = static_cast<int64_t>(tokens.size());
  std::vector<float> out(static_cast<size_t>(B * c.vocab));
  const int64_t part = std::max<int64_t>(1, model_.backend().linear_exact_rows());
  for (int64_t b0 = 0; b0 < B; b0 += part) {
    const int64_t m = std::min(part, B - b0);
    decode_rows(tokens.subspan(b0, m), caches.subspan(b0, m), out.data() + b0 * c.vocab);
  }
  return out;
}

std::vector<int32_t> Transformer::decode_step_sampled(std::span<const int32_t> tokens,
                                                      std::span<KvCache* const> caches,
                                                      std::span<const kernels::SampleRow> rows) const {
  if (model_.output_rows() != model_.config().vocab)
    throw std::logic_error("decode_step_sampled: the vocabulary is split across tensor-parallel ranks");
  if (rows.size() != tokens.size())
    throw std::invalid_argument("decode_step_sampled: " + std::to_string(rows.size()) + " sampling rows for " +
                                std::to_string(tokens.size()) + " tokens");
  check_decode(tokens, caches);
  const int64_t B = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> out(static_cast<size_t>(B));
  const int64_t part = std::max<int64_t>(1, model_.backend().linear_exact_rows());
  for (int64_t b0 = 0; b0 < B; b0 += part) {
    const int64_t m = std::min(part, B - b0);
    decode_rows(tokens.subspan(b0, m), caches.subspan(b0, m), nullptr, rows.data() + b0, out.data() + b0);
  }
  return out;
}

void Transformer::decode_rows(std::span<const int32_t> tokens, std::span<KvCache* const> caches, float* logits_out,
                              const kernels::SampleRow* rows, int32_t* picked) const {
  const auto& c = model_.config();
  auto& be = model_.backend();
  auto& ws = be.workspace();
  const int64_t B = static_cast<int64_t>(tokens.size());
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  // The step's inputs first (positions, ids, every layer's views): a device backend may
  // replay the ops below from a graph (Backend::decode_step), which copies nothing.
  std::vector<int32_t> host_pos(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) host_pos[b] = static_cast<int32_t>(caches[b]->length);
  int32_t* pos = ws.get<int32_t>(kPos, B);
  be.copy_to_backend(pos, host_pos.data(), B * static_cast<int64_t>(sizeof(int32_t)));
  int32_t* ids = ws.get<int32_t>(kIds, B);
  be.copy_to_backend(ids, tokens.data(), B * static_cast<int64_t>(sizeof(int32_t)));
  std::vector<kernels::KvView> views(static_cast<size_t>(c.n_layers * B));
  for (int l = 0; l < c.n_layers; ++l)  // each with its layer's window (local layers)
    for (int64_t b = 0; b < B; ++b) views[static_cast<size_t>(l * B + b)] = attention_view(*caches[b], l);
  float* hidden = ws.get<float>(kHidden, B * c.dim);
  float* device_logits = rows ? ws.get<float>(kLogits, B * c.vocab) : nullptr;
  const float scale = c.attn_scale;
  auto body = [&] {
    be.embed(model_.token_embedding(), ids, hidden, B);
    scale_embeddings(hidden, B);
    for (int l = 0; l < c.n_layers; ++l) {
      float* q = ws.get<float>(kQ, B * qd);
      float* k = ws.get<float>(kK, B * kvd);
      float* v = ws.get<float>(kV, B * kvd);
      project_qkv(l, hidden, pos, B, q, k, v);  // RoPE per row at its own position
      float* attn = ws.get<float>(kAttn, B * qd);
      const kernels::KvView* layer_views = views.data() + l * B;
      be.store_kv_rows(layer_views, pos, k, v, B);  // each row into its own cache
      // Each row over its own cache, all rows in one call (= attention() of each alone).
      be.attention_rows(q, pos, layer_views, attn, B, c.n_heads, scale, model_.precision());
      project_and_mlp(l, hidden, attn, B);
    }
    if (!rows) return;
    // The logits stay on the backend; the pick happens there.
    float* xn = ws.get<float>(kXn, B * c.dim);
    be.rmsnorm(hidden, model_.output_norm(), xn, B, c.dim, c.rms_eps);
    be.linear(model_.output(), xn, device_logits, B, nullptr);
  };
  if (reduce_)
    body();  // the ranks' collectives are host calls: nothing to replay
  else
    be.decode_step(views.data(), c.n_layers, B, body);
  for (int64_t b = 0; b < B; ++b) caches[b]->length = host_pos[b] + 1;
  if (!rows) {
    logits(hidden, B, logits_out);
    return;
  }
  be.sample_rows(device_logits, B, c.vocab, rows, picked);
}

}  // namespace bs
