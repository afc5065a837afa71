#include "blend/blend_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Rows of `src` ([n, width]) at the given indices.
std::vector<float> gather_rows(const std::vector<float>& src, int64_t width, const std::vector<int64_t>& rows) {
  std::vector<float> out(rows.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data() + i * width, src.data() + rows[i] * width, width * sizeof(float));
  return out;
}

// The kept fraction of cached tokens after each check layer.
std::vector<float> keep_fractions(const BlendOptions& o) {
  const size_t k = o.check_layers.size();
  std::vector<float> f(k);
  if (!o.schedule.empty()) {
    if (o.schedule.size() + 1 != k)
      throw std::invalid_argument("blend schedule needs one fraction per check layer but the last");
    // Candidates only narrow: each kept fraction in [ratio, 1] and none above the one before.
    for (size_t i = 0; i + 1 < k; ++i) {
      const float v = o.schedule[i];
      if (!(v >= o.ratio && v <= 1.0f))
        throw std::invalid_argument("blend schedule value " + std::to_string(v) + " is outside [ratio, 1]");
      if (i > 0 && v > o.schedule[i - 1])
        throw std::invalid_argument("blend schedule must not increase (" + std::to_string(o.schedule[i - 1]) +
                                    " then " + std::to_string(v) + ")");
      f[i] = v;
    }
  } else {
    for (size_t i = 0; i + 1 < k; ++i)
      f[i] = o.ratio + (1.0f - o.ratio) * static_cast<float>(k - 1 - i) / static_cast<float>(k);
  }
  f[k - 1] = o.ratio;
  return f;
}

// The check layers sorted, without repeats, each in [1, n_layers - 1].
std::vector<int> sorted_check_layers(const BlendOptions& o, int n_layers) {
  std::vector<int> checks = o.check_layers;
  std::sort(checks.begin(), checks.end());
  checks.erase(std::unique(checks.begin(), checks.end()), checks.end());
  if (checks.empty()) throw std::invalid_argument("blend: no check layer");
  // At layer 0 a token's K/V depend on the token alone, so fresh and loaded agree:
  // deviation only shows from layer 1 on.
  if (checks.front() < 1 || checks.back() >= n_layers)
    throw std::invalid_argument("blend: check layers must be in [1, " + std::to_string(n_layers - 1) + "]");
  return checks;
}

// Squared distance of fresh and loaded K and/or V of the token at `pos`, summed over
// the KV heads. k, v: the token's fresh rows [kv_heads, head_dim]; the cache holds
// the loaded (position-repaired) KV of `layer`.
double deviation_of(const float* k, const float* v, int layer, int32_t pos, const KvCache& cache, Deviation d) {
  double dev = 0;
  const int64_t hd = cache.head_dim;
  for (int h = 0; h < cache.kv_heads; ++h) {
    const float* kf = k + h * hd;
    const float* vf = v + h * hd;
    const float* kl = cache.k_at(layer, h, pos);
    const float* vl = cache.v_at(layer, h, pos);
    for (int64_t i = 0; i < hd; ++i) {
      if (d != Deviation::V) dev += static_cast<double>(kf[i] - kl[i]) * (kf[i] - kl[i]);
      if (d != Deviation::K) dev += static_cast<double>(vf[i] - vl[i]) * (vf[i] - vl[i]);
    }
  }
  return dev;
}

}  // namespace

// What the selection works on: the cached chunk tokens split into candidates (scored
// at the check layers) and forced tokens (chunk-start sinks, always recomputed), and
// the budget's shape.
struct BlendSelection {
  std::vector<int32_t> candidates;    // positions, ascending
  std::vector<int32_t> forced;        // positions, ascending
  std::vector<int32_t> chunk_of;      // [chunks_end]: chunk index of a position, -1 outside chunks
  std::vector<int64_t> chunk_cached;  // per chunk: cached tokens (0 if it missed)
  std::vector<int64_t> chunk_forced;  // per chunk: forced tokens among them
  int64_t cached = 0;                 // all cached chunk tokens (candidates + forced)
  std::vector<float> keep;            // kept fraction of `cached` after each check layer
  std::vector<int> checks;            // check layers, ascending
};

namespace {

// Recompute budget after a check layer: round(fraction * cached), at least
// min_tokens, at most everything cached.
int64_t budget(float fraction, int64_t cached, int min_tokens) {
  const int64_t t = std::llround(static_cast<double>(fraction) * static_cast<double>(cached));
  return std::clamp<int64_t>(std::max<int64_t>(t, min_tokens), 0, cached);
}

// Splits `total` over chunks in proportion to their sizes, exactly (largest
// remainder; ties to the earlier chunk).
std::vector<int64_t> apportion(int64_t total, const std::vector<int64_t>& sizes, int64_t sum) {
  std::vector<int64_t> out(sizes.size(), 0);
  if (sum <= 0) return out;
  std::vector<std::pair<double, size_t>> rem;
  int64_t given = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double exact = static_cast<double>(total) * static_cast<double>(sizes[i]) / static_cast<double>(sum);
    out[i] = static_cast<int64_t>(std::floor(exact));
    given += out[i];
    rem.emplace_back(exact - static_cast<double>(out[i]), i);
  }
  std::stable_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t j = 0; given < total && j < rem.size(); ++j, ++given) ++out[rem[j].second];
  return out;
}

}  // namespace

// Rows that go on after a check layer: every row that is not a candidate, and the
// candidates with the largest deviation within the budget (the forced tokens are
// part of it). Largest deviation first, ties by position so the choice is
// deterministic. Returns row indices ascending and how many candidates stayed.
static std::pair<std::vector<int64_t>, int64_t> keep_after_check(const BlendSelection& sel,
                                                                  const BlendOptions& opt, float fraction,
                                                                  const std::vector<int32_t>& pos,
                                                                  const std::vector<char>& candidate,
                                                                  const std::vector<double>& deviation) {
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<int64_t> kept;
  std::vector<std::pair<double, int64_t>> scored;  // (deviation, row)
  for (int64_t i = 0; i < n; ++i) {
    if (candidate[i]) scored.emplace_back(deviation[i], i);
    else kept.push_back(i);
  }
  const auto larger = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  const int64_t total = budget(fraction, sel.cached, opt.min_tokens);
  int64_t taken = 0;
  if (opt.quota == Quota::Global) {
    const int64_t forced = static_cast<int64_t>(sel.forced.size());
    const int64_t count = std::clamp<int64_t>(total - forced, 0, static_cast<int64_t>(scored.size()));
    std::partial_sort(scored.begin(), scored.begin() + count, scored.end(), larger);
    for (int64_t i = 0; i < count; ++i) kept.push_back(scored[i].second);
    taken = count;
  } else {
    const auto share = apportion(total, sel.chunk_cached, sel.cached);
    std::vector<std::vector<std::pair<double, int64_t>>> by_chunk(sel.chunk_cached.size());
    for (const auto& s : scored) by_chunk[sel.chunk_of[pos[s.second]]].push_back(s);
    for (size_t c = 0; c < by_chunk.size(); ++c) {
      auto& group = by_chunk[c];
      const int64_t count =
          std::clamp<int64_t>(share[c] - sel.chunk_forced[c], 0, static_cast<int64_t>(group.size()));
      std::partial_sort(group.begin(), group.begin() + count, group.end(), larger);
      for (int64_t i = 0; i < count; ++i) kept.push_back(group[i].second);
      taken += count;
    }
  }
  std::sort(kept.begin(), kept.end());
  return {std::move(kept), taken};
}

const char* mode_name(BlendMode m) {
  switch (m) {
    case BlendMode::Full: return "full";
    case BlendMode::Prefix: return "prefix";
    case BlendMode::Reuse: return "reuse";
    case BlendMode::Blend: return "blend";
  }
  return "?";
}

const char* deviation_name(Deviation d) {
  switch (d) {
    case Deviation::K: return "k";
    case Deviation::V: return "v";
    case Deviation::KV: return "kv";
  }
  return "?";
}
Deviation parse_deviation(const std::string& s) {
  if (s == "k") return Deviation::K;
  if (s == "v") return Deviation::V;
  if (s == "kv") return Deviation::KV;
  throw std::invalid_argument("unknown deviation '" + s + "' (k, v, kv)");
}
const char* quota_name(Quota q) { return q == Quota::Global ? "global" : "per-chunk"; }
Quota parse_quota(const std::string& s) {
  if (s == "global") return Quota::Global;
  if (s == "per-chunk") return Quota::PerChunk;
  throw std::invalid_argument("unknown quota '" + s + "' (global, per-chunk)");
}
const char* filtering_name(Filtering f) { return f == Filtering::SinglePass ? "single-pass" : "two-pass"; }
Filtering parse_filtering(const std::string& s) {
  if (s == "single-pass") return Filtering::SinglePass;
  if (s == "two-pass") return Filtering::TwoPass;
  throw std::invalid_argument("unknown filtering '" + s + "' (single-pass, two-pass)");
}

BlendMode parse_mode(const std::string& s) {
  if (s == "full") return BlendMode::Full;
  if (s == "prefix") return BlendMode::Prefix;
  if (s == "reuse") return BlendMode::Reuse;
  if (s == "blend") return BlendMode::Blend;
  throw std::invalid_argument("unknown mode '" + s + "' (full, prefix, reuse, blend)");
}

std::vector<double> planned_rows_per_layer(const BlendOptions& o, int n_layers, int64_t other, int64_t cached) {
  std::vector<double> rows(static_cast<size_t>(std::max(n_layers, 0)), static_cast<double>(other));
  if (o.mode != BlendMode::Blend || cached <= 0 || o.ratio <= 0.0f) return rows;
  // The minimum recompute (min_tokens) is ignored: a few rows.
  const double c = static_cast<double>(cached);
  if (o.ratio >= 1.0f || o.filtering == Filtering::TwoPass) {
    for (auto& r : rows) r += c * std::min(1.0, static_cast<double>(o.ratio));
    return rows;
  }
  BlendOptions sorted = o;
  sorted.check_layers = sorted_check_layers(o, n_layers);
  const std::vector<float> keep = keep_fractions(sorted);
  // A check layer runs attention and MLP for the rows it keeps.
  size_t next = 0;
  double fraction = 1.0;
  for (int l = 0; l < n_layers; ++l) {
    if (next < sorted.check_layers.size() && l == sorted.check_layers[next]) fraction = keep[next++];
    rows[static_cast<size_t>(l)] += c * fraction;
  }
  return rows;
}

ChunkKey BlendEngine::chunk_key(std::span<const int32_t> tokens) const {
  return make_chunk_key(tf_.model().fingerprint(), KvKind::Chunk, tokens, chunk_prelude_);
}
ChunkKey BlendEngine::prefix_key(std::span<const int32_t> tokens) const {
  return make_chunk_key(tf_.model().fingerprint(), KvKind::Prefix, tokens);
}

void copy_chunk_layer(const float* k, const float* v, int64_t m, int layer, int64_t offset, KvCache& cache) {
  if (offset < 0 || offset + m > cache.capacity) throw std::out_of_range("copy_chunk_layer: chunk outside the cache");
  const int64_t hd = cache.head_dim;
  for (int h = 0; h < cache.kv_heads; ++h) {
    const int64_t src = static_cast<int64_t>(h) * m * hd;
    std::memcpy(cache.k_at(layer, h, offset), k + src, m * hd * sizeof(float));
    std::memcpy(cache.v_at(layer, h, offset), v + src, m * hd * sizeof(float));
  }
}

void rotate_chunk_layer(int layer, int64_t offset, int64_t m, KvCache& cache, kernels::Backend& backend,
                        const kernels::RopeTable& rope) {
  if (offset == 0 || m == 0) return;
  const std::vector<int32_t> delta(static_cast<size_t>(m), static_cast<int32_t>(offset));
  for (int h = 0; h < cache.kv_heads; ++h) backend.rope(cache.k_at(layer, h, offset), delta.data(), m, 1, rope);
}

void place_chunk_kv(const ChunkKv& chunk, int64_t offset, KvCache& cache, kernels::Backend& backend,
                    const kernels::RopeTable& rope) {
  const int64_t m = chunk.length();
  if (offset < 0 || offset + m > cache.capacity) throw std::out_of_range("place_chunk_kv: chunk outside the cache");
  for (int l = 0; l < chunk.n_layers; ++l) {
    copy_chunk_layer(chunk.k_layer(l), chunk.v_layer(l), m, l, offset, cache);
    rotate_chunk_layer(l, offset, m, cache, backend, rope);
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
  auto cache = tf_.make_cache(n);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> hidden(static_cast<size_t>(n * c.dim));
  tf_.embed(all, hidden.data());
  for (int l = 0; l < c.n_layers; ++l) {
    if (between_layers) between_layers(l);
    tf_.run_layer(l, hidden.data(), pos.data(), n, cache, n);
  }
  auto kv = std::make_shared<ChunkKv>();
  kv->tokens.assign(tokens.begin(), tokens.end());
  kv->n_layers = c.n_layers;
  kv->kv_heads = c.n_kv_heads;
  kv->head_dim = c.head_dim;
  kv->k.resize(static_cast<size_t>(c.n_layers) * kv->layer_stride());
  kv->v.resize(kv->k.size());
  const std::vector<int32_t> back(static_cast<size_t>(m), static_cast<int32_t>(-p));
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const int64_t dst = l * kv->layer_stride() + static_cast<int64_t>(h) * m * c.head_dim;
      std::memcpy(kv->k.data() + dst, cache.k_at(l, h, p), m * c.head_dim * sizeof(float));
      std::memcpy(kv->v.data() + dst, cache.v_at(l, h, p), m * c.head_dim * sizeof(float));
      // R(i) = R(-p)·R(p + i): the stored convention (positions 0..m-1).
      if (p > 0) tf_.model().backend().rope(kv->k.data() + dst, back.data(), m, 1, tf_.model().rope());
    }
  return kv;
}

void BlendEngine::warm(const RagPrompt& prompt) const {
  if (!prompt.prefix.empty()) {
    const auto key = prefix_key(prompt.prefix);
    if (!store_.contains(key)) store_.put(key, compute_prefix_kv(prompt.prefix));
  }
  for (const auto& chunk : prompt.chunks) {
    if (chunk.empty()) continue;  // nothing to store; the others still are
    const auto key = chunk_key(chunk);
    if (!store_.contains(key)) store_.put(key, compute_chunk_kv(chunk));
  }
}

std::vector<int32_t> BlendEngine::select_two_pass(const std::vector<int32_t>& prompt_tokens, const BlendSelection& sel,
                                                  const std::vector<int32_t>& computed, int64_t chunks_end,
                                                  const BlendOptions& opt, KvCache& cache, BlendStats& st,
                                                  const std::function<void(int)>& ready) const {
  const auto& c = tf_.model().config();
  const std::vector<int>& checks = sel.checks;
  const int last = checks.back();

  // Scratch: the layers the selection pass writes are restored afterwards, so the
  // final pass sees loaded KV for every token it does not recompute. Each layer is
  // saved once it has arrived (and its positions are repaired).
  const int64_t layer_floats = static_cast<int64_t>(c.n_kv_heads) * cache.capacity * c.head_dim;
  std::vector<float> saved_k(static_cast<size_t>((last + 1) * layer_floats));
  std::vector<float> saved_v(saved_k.size());

  // Rows: every candidate and every position before chunks_end computed anyway, in
  // position order.
  std::vector<int32_t> pos(sel.candidates);
  pos.insert(pos.end(), computed.begin(), computed.end());
  std::sort(pos.begin(), pos.end());
  std::vector<char> is_candidate(static_cast<size_t>(chunks_end), 0);
  for (int32_t p : sel.candidates) is_candidate[p] = 1;
  int64_t n = static_cast<int64_t>(pos.size());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = prompt_tokens[pos[i]];
  std::vector<float> hidden(static_cast<size_t>(n * c.dim));
  tf_.embed(ids, hidden.data());

  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<int32_t> selected;
  size_t check_index = 0;
  for (int l = 0; l <= last; ++l) {
    ready(l);
    std::copy_n(cache.k_layer(l), layer_floats, saved_k.begin() + l * layer_floats);
    std::copy_n(cache.v_layer(l), layer_floats, saved_v.begin() + l * layer_floats);
    if (l != checks[check_index]) {
      tf_.run_layer(l, hidden.data(), pos.data(), n, cache, chunks_end);
      continue;
    }
    std::vector<float> q(static_cast<size_t>(n * qd)), k(static_cast<size_t>(n * kvd)), v(static_cast<size_t>(n * kvd));
    tf_.project_qkv(l, hidden.data(), pos.data(), n, q.data(), k.data(), v.data());
    std::vector<char> candidate(static_cast<size_t>(n));
    std::vector<double> dev(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      candidate[i] = is_candidate[pos[i]];
      if (candidate[i]) dev[i] = deviation_of(k.data() + i * kvd, v.data() + i * kvd, l, pos[i], cache, opt.deviation);
    }
    auto [keep_rows, taken] = keep_after_check(sel, opt, sel.keep[check_index], pos, candidate, dev);
    st.candidates_per_check.push_back(taken + static_cast<int64_t>(sel.forced.size()));
    if (l == last) {
      for (int64_t i : keep_rows)
        if (candidate[i]) selected.push_back(pos[i]);
      break;
    }
    tf_.store_kv(l, pos.data(), n, k.data(), v.data(), cache);
    hidden = gather_rows(hidden, c.dim, keep_rows);
    q = gather_rows(q, qd, keep_rows);
    std::vector<int32_t> kept_pos(keep_rows.size());
    for (size_t i = 0; i < keep_rows.size(); ++i) kept_pos[i] = pos[keep_rows[i]];
    pos = std::move(kept_pos);
    n = static_cast<int64_t>(pos.size());
    tf_.attend_and_mlp(l, hidden.data(), q.data(), pos.data(), n, cache, chunks_end);
    ++check_index;
  }
  std::copy(saved_k.begin(), saved_k.end(), cache.k.begin());
  std::copy(saved_v.begin(), saved_v.end(), cache.v.begin());
  return selected;
}

void BlendEngine::validate(const RagPrompt& prompt, const BlendOptions& opt, int64_t extra_capacity,
                           int64_t logit_rows) const {
  const auto& c = tf_.model().config();
  const int64_t N = prompt.size();
  const int64_t S = static_cast<int64_t>(prompt.suffix.size());
  if (N == 0) throw std::invalid_argument("blend: empty prompt");
  if (logit_rows < 1 || logit_rows > N) throw std::invalid_argument("blend: logit_rows out of range");
  if (opt.mode != BlendMode::Full && logit_rows > S)
    throw std::invalid_argument("blend: logits are only available for suffix tokens");
  if (opt.mode != BlendMode::Full && S == 0) throw std::invalid_argument("blend: the suffix is empty");
  if (extra_capacity < 0 || N + extra_capacity > c.context_length)
    throw std::length_error("prompt of " + std::to_string(N) + " tokens (+" + std::to_string(extra_capacity) +
                            " to generate) exceeds the model context of " + std::to_string(c.context_length));
  if (!(opt.ratio >= 0.0f && opt.ratio <= 1.0f)) throw std::invalid_argument("blend: ratio must be in [0, 1]");
  if (opt.min_tokens < 0) throw std::invalid_argument("blend: min_tokens must be >= 0");
  if (opt.sink_tokens < 0) throw std::invalid_argument("blend: sink_tokens must be >= 0");
  if (opt.mode == BlendMode::Blend) {
    if (opt.check_layers.empty()) throw std::invalid_argument("blend: no check layer");
    for (int l : opt.check_layers)
      if (l < 1 || l >= c.n_layers)
        throw std::invalid_argument("blend: check layers must be in [1, " + std::to_string(c.n_layers - 1) + "]");
    BlendOptions sorted = opt;
    std::sort(sorted.check_layers.begin(), sorted.check_layers.end());
    sorted.check_layers.erase(std::unique(sorted.check_layers.begin(), sorted.check_layers.end()),
                              sorted.check_layers.end());
    keep_fractions(sorted);  // throws on a bad schedule
  }
}

BlendPrefill BlendEngine::prefill(const RagPrompt& prompt, const BlendOptions& opt, int64_t extra_capacity,
                                  int64_t logit_rows, const LayerWait& between_layers) const {
  const auto t_start = clock_type::now();
  validate(prompt, opt, extra_capacity, logit_rows);
  const auto& c = tf_.model().config();
  const int64_t N = prompt.size();
  const int64_t P = static_cast<int64_t>(prompt.prefix.size());
  KvCache cache = tf_.make_cache(N + extra_capacity);
  PrefillPlan plan;
  plan.chunk_loaded.assign(prompt.chunks.size(), 0);
  bool prefix_hit = false;
  if (opt.mode != BlendMode::Full) {
    // Exact prefix: KV valid as stored, no recompute. A miss is computed alone and
    // stored here (a prefix at position 0 is the same in every prompt).
    if (P > 0) {
      const auto key = prefix_key(prompt.prefix);
      auto kv = store_.get(key);
      if (kv && kv->tokens == prompt.prefix && kv->n_layers == c.n_layers) {
        prefix_hit = true;
      } else {
        kv = compute_prefix_kv(prompt.prefix);
        store_.put(key, kv);
      }
      for (int l = 0; l < c.n_layers; ++l) copy_chunk_layer(kv->k_layer(l), kv->v_layer(l), P, l, 0, cache);
      plan.prefix_loaded = true;
    }
    if (opt.mode != BlendMode::Prefix)
      for (size_t i = 0; i < prompt.chunks.size(); ++i) {
        const auto& chunk = prompt.chunks[i];
        auto kv = store_.get(chunk_key(chunk));
        // A hash collision or a stale entry must never be used as this chunk's KV.
        if (!kv || kv->tokens != chunk || kv->n_layers != c.n_layers || kv->kv_heads != c.n_kv_heads ||
            kv->head_dim != c.head_dim)
          continue;
        const int64_t off = prompt.chunk_offset(i);
        for (int l = 0; l < c.n_layers; ++l)
          copy_chunk_layer(kv->k_layer(l), kv->v_layer(l), kv->length(), l, off, cache);
        plan.chunk_loaded[i] = 1;
      }
  }
  const double load = since(t_start);
  const LayerWait none = [](int) {};
  BlendPrefill r = prefill_planned(prompt, plan, cache, opt, between_layers ? between_layers : none, logit_rows, t_start);
  r.stats.prefix_hit = prefix_hit;
  r.stats.load_seconds += load;
  r.stats.total_seconds = since(t_start);
  return r;
}

BlendPrefill BlendEngine::prefill_planned(const RagPrompt& prompt, const PrefillPlan& plan, KvCache& cache,
                                          const BlendOptions& opt, const LayerWait& wait, int64_t logit_rows,
                                          clock_type::time_point epoch) const {
  const auto t_start = clock_type::now();
  validate(prompt, opt, 0, logit_rows);
  const auto& c = tf_.model().config();
  auto& backend = tf_.model().backend();
  const int64_t N = prompt.size();
  const int64_t P = static_cast<int64_t>(prompt.prefix.size());
  const int64_t S = static_cast<int64_t>(prompt.suffix.size());
  if (cache.capacity < N || cache.n_layers != c.n_layers || cache.kv_heads != c.n_kv_heads ||
      cache.head_dim != c.head_dim)
    throw std::invalid_argument("blend: the cache does not fit the prompt or the model");
  if (plan.chunk_loaded.size() != prompt.chunks.size())
    throw std::invalid_argument("blend: the plan has " + std::to_string(plan.chunk_loaded.size()) +
                                " chunk entries for " + std::to_string(prompt.chunks.size()) + " chunks");
  auto rel = [&](clock_type::time_point t) { return std::chrono::duration<double>(t - epoch).count(); };

  BlendPrefill r;
  auto& st = r.stats;
  st.prompt_tokens = N;
  st.prefix_tokens = P;
  st.suffix_tokens = S;
  st.chunks = static_cast<int>(prompt.chunks.size());
  st.chunk_tokens = N - P - S;
  st.layers.resize(static_cast<size_t>(c.n_layers));
  const std::vector<int32_t> all = prompt.concatenated();

  // Layer l is usable once the loaders delivered it and its chunks' positions are
  // repaired; each layer is waited for and repaired exactly once.
  struct Placed {
    int64_t offset, length;
  };
  std::vector<Placed> repair;  // delivered chunks whose K needs delta-RoPE
  std::vector<char> is_ready(static_cast<size_t>(c.n_layers), 0);
  auto ready = [&](int l) {
    if (is_ready[l]) return;
    auto& lt = st.layers[l];
    const auto t0 = clock_type::now();
    lt.wait_begin = rel(t0);
    wait(l);
    const auto t1 = clock_type::now();
    st.wait_seconds += std::chrono::duration<double>(t1 - t0).count();
    for (const auto& p : repair) rotate_chunk_layer(l, p.offset, p.length, cache, backend, tf_.model().rope());
    lt.ready = rel(clock_type::now());
    is_ready[l] = 1;
  };

  // Positions computed through every layer; candidates (single pass) narrow at the
  // check layers.
  std::vector<int32_t> active, candidates;
  BlendSelection sel;
  const bool reuse_chunks = opt.mode == BlendMode::Reuse || opt.mode == BlendMode::Blend;
  if (opt.mode == BlendMode::Full) {
    active.resize(static_cast<size_t>(N));
    std::iota(active.begin(), active.end(), 0);
  } else {
    st.prefix_hit = plan.prefix_loaded;
    if (!plan.prefix_loaded)
      for (int64_t p = 0; p < P; ++p) active.push_back(static_cast<int32_t>(p));
    std::vector<int32_t> cached;  // positions whose KV came from the store
    sel.chunk_of.assign(static_cast<size_t>(N - S), -1);
    sel.chunk_cached.assign(prompt.chunks.size(), 0);
    sel.chunk_forced.assign(prompt.chunks.size(), 0);
    for (size_t i = 0; i < prompt.chunks.size(); ++i) {
      const int64_t off = prompt.chunk_offset(i);
      const int64_t m = static_cast<int64_t>(prompt.chunks[i].size());
      for (int64_t j = 0; j < m; ++j) sel.chunk_of[off + j] = static_cast<int32_t>(i);
      if (reuse_chunks && plan.chunk_loaded[i]) {
        repair.push_back({off, m});
        ++st.chunks_hit;
        sel.chunk_cached[i] = m;
        sel.chunk_forced[i] = std::min<int64_t>(opt.sink_tokens, m);
        for (int64_t j = 0; j < m; ++j) {
          cached.push_back(static_cast<int32_t>(off + j));
          (j < sel.chunk_forced[i] ? sel.forced : sel.candidates).push_back(static_cast<int32_t>(off + j));
        }
      } else {
        for (int64_t j = 0; j < m; ++j) active.push_back(static_cast<int32_t>(off + j));
      }
    }
    st.cached_tokens = static_cast<int64_t>(cached.size());
    sel.cached = st.cached_tokens;

    if (opt.mode == BlendMode::Blend && !cached.empty()) {
      const auto t_sel = clock_type::now();
      std::vector<int32_t> selected;
      if (opt.ratio >= 1.0f) {
        selected = cached;
      } else if (opt.ratio > 0.0f) {
        sel.checks = sorted_check_layers(opt, c.n_layers);
        BlendOptions sorted = opt;
        sorted.check_layers = sel.checks;
        sel.keep = keep_fractions(sorted);
        selected = sel.forced;
        if (opt.filtering == Filtering::TwoPass) {
          std::vector<int32_t> computed(active);
          computed.insert(computed.end(), sel.forced.begin(), sel.forced.end());
          const auto chosen = select_two_pass(all, sel, computed, N - S, opt, cache, st, ready);
          selected.insert(selected.end(), chosen.begin(), chosen.end());
        } else {
          candidates = std::move(sel.candidates);  // narrowed in the pass below
        }
      }
      active.insert(active.end(), selected.begin(), selected.end());
      std::sort(selected.begin(), selected.end());
      r.recomputed_positions = std::move(selected);
      st.select_seconds = since(t_sel);
    }
    for (int64_t p = N - S; p < N; ++p) active.push_back(static_cast<int32_t>(p));
    std::sort(active.begin(), active.end());
  }

  // The pass over every layer: the active tokens and the candidates still in the
  // running, over the fused cache. At a check layer (single pass) every row's fresh
  // K/V is stored and only the candidates with the largest deviation go on.
  const auto t_comp = clock_type::now();
  std::vector<int32_t> rows(active);
  rows.insert(rows.end(), candidates.begin(), candidates.end());
  std::sort(rows.begin(), rows.end());
  std::vector<char> candidate(rows.size(), 0);
  {
    size_t j = 0;
    for (size_t i = 0; i < rows.size() && j < candidates.size(); ++i)
      if (rows[i] == candidates[j]) candidate[i] = 1, ++j;
  }
  int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = all[rows[i]];
  std::vector<float> hidden(static_cast<size_t>(n * c.dim));
  tf_.embed(ids, hidden.data());
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  size_t check_index = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    ready(l);
    st.layers[l].compute_begin = rel(clock_type::now());
    if (candidates.empty() || l != sel.checks[check_index]) {
      tf_.run_layer(l, hidden.data(), rows.data(), n, cache, N);
      st.row_layers += n;
    } else {
      std::vector<float> q(static_cast<size_t>(n * qd)), k(static_cast<size_t>(n * kvd)),
          v(static_cast<size_t>(n * kvd));
      tf_.project_qkv(l, hidden.data(), rows.data(), n, q.data(), k.data(), v.data());
      std::vector<double> dev(static_cast<size_t>(n), 0.0);
      for (int64_t i = 0; i < n; ++i)
        if (candidate[i]) dev[i] = deviation_of(k.data() + i * kvd, v.data() + i * kvd, l, rows[i], cache, opt.deviation);
      auto [keep_rows, taken] = keep_after_check(sel, opt, sel.keep[check_index], rows, candidate, dev);
      st.candidates_per_check.push_back(taken + static_cast<int64_t>(sel.forced.size()));
      // Fresh K/V of every row computed here stay: the dropped candidates' loaded KV
      // is replaced by the better value at this layer.
      tf_.store_kv(l, rows.data(), n, k.data(), v.data(), cache);
      hidden = gather_rows(hidden, c.dim, keep_rows);
      q = gather_rows(q, qd, keep_rows);
      std::vector<int32_t> kept(keep_rows.size());
      std::vector<char> kept_candidate(keep_rows.size());
      for (size_t i = 0; i < keep_rows.size(); ++i) {
        kept[i] = rows[keep_rows[i]];
        kept_candidate[i] = candidate[keep_rows[i]];
      }
      rows = std::move(kept);
      candidate = std::move(kept_candidate);
      n = static_cast<int64_t>(rows.size());
      tf_.attend_and_mlp(l, hidden.data(), q.data(), rows.data(), n, cache, N);
      st.row_layers += n;
      if (++check_index == sel.checks.size()) {
        // The survivors are the recomputed tokens; from here on they are active.
        for (int64_t i = 0; i < n; ++i)
          if (candidate[i]) r.recomputed_positions.push_back(rows[i]);
        std::sort(r.recomputed_positions.begin(), r.recomputed_positions.end());
        std::fill(candidate.begin(), candidate.end(), 0);
        candidates.clear();
        st.select_seconds += since(t_comp);
      }
    }
    st.layers[l].compute_end = rel(clock_type::now());
  }
  st.recomputed_tokens = static_cast<int64_t>(r.recomputed_positions.size());
  r.logits.resize(static_cast<size_t>(logit_rows * c.vocab));
  tf_.logits(hidden.data() + (n - logit_rows) * c.dim, logit_rows, r.logits.data());
  cache.length = N;
  r.cache = std::move(cache);
  st.computed_tokens = n;
  st.compute_seconds = since(t_comp);
  st.total_seconds = since(t_start);
  return r;
}

}  // namespace bs
