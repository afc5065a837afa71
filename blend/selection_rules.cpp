#include "blend/selection_rules.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "blend/engine_buffers.h"
#include "kernels/kv_view.h"

namespace bs::blend_detail {
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

std::pair<const double*, std::vector<int32_t>> score_candidates(const Transformer& tf, int layer,
                                                                 const std::vector<int32_t>& pos,
                                                                 const std::vector<char>& candidate, const float* k,
                                                                 const float* v, const KvCache& cache,
                                                                 Deviation which) {
  auto& be = tf.model().backend();
  auto& ws = be.workspace();
  const int64_t kvd = tf.model().config().kv_dim();
  std::vector<int32_t> rows, rows_pos;
  for (size_t i = 0; i < pos.size(); ++i)
    if (candidate[i]) {
      rows.push_back(static_cast<int32_t>(i));
      rows_pos.push_back(pos[i]);
    }
  const int64_t m = static_cast<int64_t>(rows.size());
  double* dev = ws.get<double>(kDeviation, m);
  if (m == 0) return {dev, std::move(rows)};
  const int32_t* rows_dev = upload_ints(be, rows, kCandRows);
  const int32_t* pos_dev = upload_ints(be, rows_pos, kCandPos);
  float* ck = ws.get<float>(kCandK, m * kvd);
  float* cv = ws.get<float>(kCandV, m * kvd);
  be.gather_rows(k, rows_dev, ck, m, kvd);
  be.gather_rows(v, rows_dev, cv, m, kvd);
  be.kv_deviation(cache.view(layer), pos_dev, ck, cv, m, which, dev);
  // Tensor parallel: each rank scored its own KV heads; the sum over ranks is the
  // deviation over every head (in rank order: the same doubles on every rank).
  if (auto* comm = tf.comm()) {
    tf.sync_for_collective();
    comm->all_reduce_sum(dev, m, tf.collective_timeout());
  }
  return {dev, std::move(rows)};
}

const double* query_aware_scores(const Transformer& tf, int layer, Selection rule, const float* q,
                                 const int32_t* rows_dev, int64_t n, int64_t suffix_rows, int64_t tail_rows,
                                 int64_t n_kv, const std::vector<int32_t>& pos, const std::vector<int32_t>& cand_rows,
                                 const double* deviation, const KvCache& cache) {
  auto& be = tf.model().backend();
  auto& ws = be.workspace();
  const auto& c = tf.model().config();
  const int64_t m = static_cast<int64_t>(cand_rows.size());
  const int64_t qr = std::min(suffix_rows - tail_rows, kQueryRows);
  const int64_t first = n - tail_rows - qr;
  double* mass = ws.get<double>(kMass, n_kv);
  be.attention_mass(q + first * c.q_dim(), rows_dev + first, tf.attention_view(cache, layer), qr, c.n_heads, n_kv,
                    c.attn_scale, mass);
  if (auto* comm = tf.comm()) {
    tf.sync_for_collective();
    comm->all_reduce_sum(mass, n_kv, tf.collective_timeout());
  }
  std::vector<double> weight(static_cast<size_t>(n_kv)), score(static_cast<size_t>(m));
  be.copy_to_host(weight.data(), mass, n_kv * static_cast<int64_t>(sizeof(double)));
  if (rule == Selection::Impact)
    be.copy_to_host(score.data(), deviation, m * static_cast<int64_t>(sizeof(double)));
  for (int64_t i = 0; i < m; ++i) {
    const double w = weight[static_cast<size_t>(pos[static_cast<size_t>(cand_rows[static_cast<size_t>(i)])])];
    score[static_cast<size_t>(i)] = rule == Selection::Impact ? w * std::sqrt(score[static_cast<size_t>(i)]) : w;
  }
  double* out = ws.get<double>(kScore, m);
  be.copy_to_backend(out, score.data(), m * static_cast<int64_t>(sizeof(double)));
  return out;
}

std::pair<std::vector<int32_t>, int64_t> keep_after_check(kernels::Backend& be, const BlendSelection& sel,
                                                           const BlendOptions& opt, float fraction,
                                                           const std::vector<int32_t>& pos,
                                                           const std::vector<char>& candidate,
                                                           const double* deviation,
                                                           const std::vector<int32_t>& cand_rows) {
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<int32_t> kept;
  for (int64_t i = 0; i < n; ++i)
    if (!candidate[i]) kept.push_back(static_cast<int32_t>(i));
  int32_t* top_dev = be.workspace().get<int32_t>(kTopK, static_cast<int64_t>(cand_rows.size()));
  std::vector<int32_t> top;
  // The `count` largest of candidates [begin, begin + size) join `kept`.
  auto take = [&](int64_t begin, int64_t size, int64_t count) {
    if (count <= 0) return;
    be.top_k(deviation + begin, size, count, top_dev);
    top.resize(static_cast<size_t>(count));
    be.copy_to_host(top.data(), top_dev, count * static_cast<int64_t>(sizeof(int32_t)));
    for (int32_t j : top) kept.push_back(cand_rows[static_cast<size_t>(begin + j)]);
  };
  const int64_t total = budget(fraction, sel.cached, opt.min_tokens);
  const int64_t scored = static_cast<int64_t>(cand_rows.size());
  int64_t taken = 0;
  if (opt.quota == Quota::Global) {
    const int64_t forced = static_cast<int64_t>(sel.forced.size());
    taken = std::clamp<int64_t>(total - forced, 0, scored);
    take(0, scored, taken);
  } else {
    // A chunk's candidates are consecutive among them (positions ascend, chunks are
    // runs of positions): each chunk takes its share from its own run.
    const auto share = apportion(total, sel.chunk_cached, sel.cached);
    for (int64_t begin = 0; begin < scored;) {
      const int32_t chunk = sel.chunk_of[pos[cand_rows[begin]]];
      int64_t end = begin;
      while (end < scored && sel.chunk_of[pos[cand_rows[end]]] == chunk) ++end;
      const int64_t count = std::clamp<int64_t>(share[chunk] - sel.chunk_forced[chunk], 0, end - begin);
      take(begin, end - begin, count);
      taken += count;
      begin = end;
    }
  }
  std::sort(kept.begin(), kept.end());
  return {std::move(kept), taken};
}

std::pair<std::vector<int32_t>, int64_t> keep_on_every_rank(const Transformer& tf, const BlendSelection& sel,
                                                            const BlendOptions& opt, float fraction,
                                                            const std::vector<int32_t>& pos,
                                                            const std::vector<char>& candidate,
                                                            const double* deviation,
                                                            const std::vector<int32_t>& cand_rows) {
  auto* comm = tf.comm();
  auto& be = tf.model().backend();
  if (!comm) return keep_after_check(be, sel, opt, fraction, pos, candidate, deviation, cand_rows);
  std::pair<std::vector<int32_t>, int64_t> out;
  if (comm->rank() == 0) out = keep_after_check(be, sel, opt, fraction, pos, candidate, deviation, cand_rows);
  int64_t header[2] = {static_cast<int64_t>(out.first.size()), out.second};
  comm->broadcast(header, sizeof header, 0, tf.collective_timeout());
  out.first.resize(static_cast<size_t>(header[0]));
  out.second = header[1];
  comm->broadcast(out.first.data(), header[0] * static_cast<int64_t>(sizeof(int32_t)), 0, tf.collective_timeout());
  return out;
}

uint64_t digest_of(const std::vector<int32_t>& rows, const std::vector<int32_t>& pos) {
  std::vector<int32_t> kept(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) kept[i] = pos[static_cast<size_t>(rows[i])];
  return XXH3_64bits(kept.data(), kept.size() * sizeof(int32_t));
}

}  // namespace bs::blend_detail
