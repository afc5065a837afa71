#include "blend/blend_engine.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>

#include "kernels/dequant.h"
#include "blend/engine_buffers.h"
#include "blend/selection_rules.h"
#include "kernels/kv_view.h"

namespace bs {
using namespace blend_detail;
namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }



// The rows `keep` (device row indices, ascending) of a [*, width] backend array, in
// place: its first `kept` rows become them. No allocation (a check layer used to
// allocate the kept rows' buffer and free the old one, a device-wide wait on CUDA):
// gather_rows' destination must not overlap its source, so the rows go into a
// workspace slot (grown only, shared by every request of this thread) and are copied
// back over the front of `rows`, which has room (kept <= its rows). The copy is
// device-to-device and ordered on the backend's stream like the gather.
void gather_kept_in_place(kernels::Backend& be, kernels::DeviceBuffer& rows, int64_t width, const int32_t* keep_dev,
                          int64_t kept) {
  const int64_t bytes = kept * width * static_cast<int64_t>(sizeof(float));
  if (bytes > rows.bytes()) throw std::logic_error("blend: more kept rows than rows");
  if (kept == 0) return;
  float* tmp = be.workspace().get<float>(kKeptHidden, kept * width);
  be.gather_rows(rows.as<float>(), keep_dev, tmp, kept, width);
  be.copy_within(rows.data(), tmp, bytes);
}

// A check layer narrows its rows to keep_rows (host indices into them): the front of
// `hidden` becomes the kept rows' hidden states (its buffer stays), and the kept rows'
// queries are returned (a workspace slot, valid for this step).
const float* narrow_to_kept(kernels::Backend& be, const std::vector<int32_t>& keep_rows, kernels::DeviceBuffer& hidden,
                            int64_t dim, const float* q, int64_t q_dim) {
  const int64_t kept = static_cast<int64_t>(keep_rows.size());
  const int32_t* keep_dev = upload_ints(be, keep_rows, kKeepRows);
  gather_kept_in_place(be, hidden, dim, keep_dev, kept);
  float* kept_q = be.workspace().get<float>(kKeptQ, kept * q_dim);
  be.gather_rows(q, keep_dev, kept_q, kept, q_dim);
  return kept_q;
}

}  // namespace

std::vector<double> planned_rows_per_layer(const BlendOptions& o, int n_layers, int64_t other, int64_t cached) {
  std::vector<double> rows(static_cast<size_t>(std::max(n_layers, 0)), static_cast<double>(other));
  if (o.mode != BlendMode::Blend || cached <= 0 || o.ratio <= 0.0f) return rows;
  // The minimum recompute (min_tokens) is ignored: a few rows.
  const double c = static_cast<double>(cached);
  if (o.ratio >= 1.0f || o.filtering == Filtering::TwoPass || o.selection == Selection::QueryFirst) {
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

// Everything a prefill carries between its steps.
struct PrefillRun::State {
  // The prompt as one token list, and its parts' sizes.
  std::vector<int32_t> all;
  int64_t N = 0, P = 0, S = 0;
  KvCache* cache = nullptr;  // the caller's, until finish() moves it into the result
  BlendOptions opt;
  int64_t logit_rows = 1;
  clock_type::time_point epoch, t_begin;
  BlendPrefill r;  // stats and recomputed positions as they grow; logits and cache at finish

  // Delivered chunks whose K needs delta-RoPE, once per layer on first read.
  struct Placed {
    int64_t offset, length;
  };
  std::vector<Placed> repair;
  std::vector<char> is_ready;  // per layer: delivered and repaired
  BlendSelection sel;
  int layer = 0;       // the next step's layer
  bool finished_layers = false;

  // The final pass: rows through every layer (active tokens and the candidates
  // still in the running, which narrow at the check layers in single pass).
  std::vector<int32_t> active;  // tokens computed in every layer (before the final pass starts)
  std::vector<int32_t> rows;
  kernels::DeviceBuffer rows_dev;  // rows, in the backend's memory
  std::vector<char> candidate;     // per row: still a candidate
  kernels::DeviceBuffer hidden;    // [rows, dim] fp32
  size_t check_index = 0;
  bool narrowing = false;       // candidates are still being narrowed

  // Two-pass filtering's selection pass over layers 0..last check layer, on a
  // scratch copy of those layers' KV (restored at its end).
  bool selecting = false;
  std::vector<int32_t> sel_pos;       // rows: every candidate and every computed position before the suffix
  kernels::DeviceBuffer sel_pos_dev;  // sel_pos, in the backend's memory
  std::vector<char> is_candidate;     // [N - S]
  kernels::DeviceBuffer sel_hidden;   // [sel_pos, dim] fp32
  size_t sel_check = 0;
  // Layers 0..last as delivered and repaired, as stored: [layer, kv_heads, N, head_dim]
  // elements of the cache's dtype, in the backend's memory.
  kernels::DeviceBuffer saved_k, saved_v;

  // Selection::QueryFirst's first pass (`selecting` too): sel_pos / sel_hidden are the
  // question's rows, and each candidate's score (sel.candidates order) is the sum over
  // the layers done of its share of the question's attention to cached tokens.
  bool query_first = false;
  std::vector<double> qf_score;
};

PrefillRun::PrefillRun() = default;
PrefillRun::PrefillRun(PrefillRun&&) noexcept = default;
PrefillRun& PrefillRun::operator=(PrefillRun&&) noexcept = default;
PrefillRun::~PrefillRun() = default;
bool PrefillRun::done() const { return !s_ || s_->finished_layers; }
int PrefillRun::next_layer() const { return done() ? -1 : s_->layer; }
bool PrefillRun::needs_delivery() const { return !done() && !s_->is_ready[static_cast<size_t>(s_->layer)]; }
int PrefillRun::steps_left() const {
  if (done()) return 0;
  const int n_layers = static_cast<int>(s_->is_ready.size());
  if (!s_->selecting) return n_layers - s_->layer;
  return (s_->query_first ? n_layers : s_->sel.checks.back() + 1) - s_->layer + n_layers;
}
const BlendStats& PrefillRun::stats() const {
  static const BlendStats none;
  return s_ ? s_->r.stats : none;
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
  if (opt.query_first_from_layer < 0) throw std::invalid_argument("blend: query_first_from_layer must be >= 0");
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
    if (opt.selection != Selection::Deviation && opt.filtering == Filtering::TwoPass)
      throw std::invalid_argument(std::string("blend: selection ") + selection_name(opt.selection) +
                                  (opt.selection == Selection::QueryFirst
                                       ? " runs its own two passes: it does not take two-pass filtering"
                                       : " needs single-pass filtering (two-pass's selection pass has no question rows)"));
  }
}

PrefillRun BlendEngine::begin(const RagPrompt& prompt, const PrefillPlan& plan, KvCache& cache,
                              const BlendOptions& opt, int64_t logit_rows, clock_type::time_point epoch) const {
  const auto t_start = clock_type::now();
  validate(prompt, opt, 0, logit_rows);
  const auto& c = tf_.model().config();
  const int64_t N = prompt.size();
  const int64_t P = static_cast<int64_t>(prompt.prefix.size());
  const int64_t S = static_cast<int64_t>(prompt.suffix.size());
  if (cache.capacity < N || cache.n_layers != c.n_layers || cache.kv_heads != c.n_kv_heads ||
      cache.head_dim != c.head_dim)
    throw std::invalid_argument("blend: the cache does not fit the prompt or the model");
  if (plan.chunk_loaded.size() != prompt.chunks.size())
    throw std::invalid_argument("blend: the plan has " + std::to_string(plan.chunk_loaded.size()) +
                                " chunk entries for " + std::to_string(prompt.chunks.size()) + " chunks");
  PrefillRun run;
  run.s_ = std::make_unique<PrefillRun::State>();
  auto& s = *run.s_;
  s.all = prompt.concatenated();
  s.N = N, s.P = P, s.S = S;
  s.cache = &cache;
  s.opt = opt;
  s.logit_rows = logit_rows;
  s.epoch = epoch;
  s.t_begin = t_start;
  s.is_ready.assign(static_cast<size_t>(c.n_layers), 0);
  auto& st = s.r.stats;
  st.prompt_tokens = N;
  st.prefix_tokens = P;
  st.suffix_tokens = S;
  st.chunks = static_cast<int>(prompt.chunks.size());
  st.chunk_tokens = N - P - S;
  st.layers.resize(static_cast<size_t>(c.n_layers));

  auto& sel = s.sel;
  auto& active = s.active;
  std::vector<int32_t> candidates;  // single pass: narrowed in the final pass
  const bool reuse_chunks = opt.mode == BlendMode::Reuse || opt.mode == BlendMode::Blend;
  if (opt.mode == BlendMode::Full) {
    active.resize(static_cast<size_t>(N));
    std::iota(active.begin(), active.end(), 0);
    start_final_pass(s, {});
    return run;
  }
  if (plan.prefix_cached < 0 || plan.prefix_cached > P)
    throw std::invalid_argument("blend: the plan delivers " + std::to_string(plan.prefix_cached) +
                                " prefix tokens of " + std::to_string(P));
  st.prefix_hit = plan.prefix_cached > 0;
  st.prefix_cached_tokens = plan.prefix_cached;
  for (int64_t p = plan.prefix_cached; p < P; ++p) active.push_back(static_cast<int32_t>(p));
  std::vector<int32_t> cached;  // positions whose KV came from the store
  sel.chunk_of.assign(static_cast<size_t>(N - S), -1);
  sel.chunk_cached.assign(prompt.chunks.size(), 0);
  sel.chunk_forced.assign(prompt.chunks.size(), 0);
  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
    const int64_t off = prompt.chunk_offset(i);
    const int64_t m = static_cast<int64_t>(prompt.chunks[i].size());
    for (int64_t j = 0; j < m; ++j) sel.chunk_of[off + j] = static_cast<int32_t>(i);
    if (reuse_chunks && plan.chunk_loaded[i]) {
      s.repair.push_back({off, m});
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
    std::vector<int32_t> selected;
    if (opt.ratio >= 1.0f) {
      selected = cached;
    } else if (opt.ratio > 0.0f) {
      st.selection = selection_name(opt.selection);
      sel.checks = sorted_check_layers(opt, c.n_layers);
      BlendOptions sorted = opt;
      sorted.check_layers = sel.checks;
      sel.keep = keep_fractions(sorted);
      selected = sel.forced;
      if (opt.selection == Selection::QueryFirst) {
        // The question's pass first: its rows are the suffix and the parts without
        // stored KV (which the question reads too); the cached chunks stay as loaded.
        s.selecting = true;
        s.query_first = true;
        s.sel_pos = active;
        const int64_t question_end = N - S + question_rows(S, logit_rows);
        for (int64_t p = N - S; p < question_end; ++p) s.sel_pos.push_back(static_cast<int32_t>(p));
        std::sort(s.sel_pos.begin(), s.sel_pos.end());
        s.qf_score.assign(sel.candidates.size(), 0.0);
        start_first_pass(s);
      } else if (opt.filtering == Filtering::TwoPass) {
        // The selection pass first: its rows are every candidate and every position
        // before the suffix computed anyway (missed parts, forced tokens).
        s.selecting = true;
        s.sel_pos = sel.candidates;
        s.sel_pos.insert(s.sel_pos.end(), active.begin(), active.end());
        s.sel_pos.insert(s.sel_pos.end(), sel.forced.begin(), sel.forced.end());
        std::sort(s.sel_pos.begin(), s.sel_pos.end());
        s.is_candidate.assign(static_cast<size_t>(N - S), 0);
        for (int32_t p : sel.candidates) s.is_candidate[p] = 1;
        start_first_pass(s);
        auto& be = tf_.model().backend();
        const int64_t layer_bytes = static_cast<int64_t>(c.n_kv_heads) * N * c.head_dim * cache.elem_bytes();
        s.saved_k = be.alloc((sel.checks.back() + 1) * layer_bytes);
        s.saved_v = be.alloc((sel.checks.back() + 1) * layer_bytes);
      } else {
        candidates = std::move(sel.candidates);
      }
    }
    active.insert(active.end(), selected.begin(), selected.end());
    std::sort(selected.begin(), selected.end());
    s.r.recomputed_positions = std::move(selected);
  }
  const double setup = since(t_start);
  st.select_seconds += setup;
  st.compute_seconds += setup;
  if (!s.selecting) start_final_pass(s, std::move(candidates));
  return run;
}

void BlendEngine::start_first_pass(PrefillRun::State& s) const {
  auto& be = tf_.model().backend();
  std::vector<int32_t> ids(s.sel_pos.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = s.all[s.sel_pos[i]];
  upload_ints(be, s.sel_pos, s.sel_pos_dev);
  s.sel_hidden = be.alloc(static_cast<int64_t>(ids.size()) * tf_.model().config().dim *
                          static_cast<int64_t>(sizeof(float)));
  tf_.embed(ids, s.sel_hidden.as<float>());
}

void BlendEngine::start_final_pass(PrefillRun::State& s, std::vector<int32_t> candidates) const {
  const auto t0 = clock_type::now();
  const auto& c = tf_.model().config();
  if (s.opt.mode != BlendMode::Full)
    for (int64_t p = s.N - s.S; p < s.N; ++p) s.active.push_back(static_cast<int32_t>(p));
  s.rows = std::move(s.active);
  s.rows.insert(s.rows.end(), candidates.begin(), candidates.end());
  std::sort(s.rows.begin(), s.rows.end());
  s.candidate.assign(s.rows.size(), 0);
  size_t j = 0;
  for (size_t i = 0; i < s.rows.size() && j < candidates.size(); ++i)
    if (s.rows[i] == candidates[j]) s.candidate[i] = 1, ++j;
  s.narrowing = !candidates.empty();
  auto& be = tf_.model().backend();
  std::vector<int32_t> ids(s.rows.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = s.all[s.rows[i]];
  upload_ints(be, s.rows, s.rows_dev);
  ensure_bytes(be, s.hidden, static_cast<int64_t>(ids.size()) * c.dim * static_cast<int64_t>(sizeof(float)));
  tf_.embed(ids, s.hidden.as<float>());
  s.selecting = false;
  s.layer = 0;
  s.check_index = 0;
  s.r.stats.compute_seconds += since(t0);
}

void BlendEngine::step(PrefillRun& run, clock_type::time_point wait_began) const {
  if (run.done()) throw std::logic_error("blend: step after the last layer");
  auto& s = *run.s_;
  auto& st = s.r.stats;
  const int l = s.layer;
  auto rel = [&](clock_type::time_point t) { return std::chrono::duration<double>(t - s.epoch).count(); };
  const auto t0 = clock_type::now();
  if (!s.is_ready[l]) {
    // The first read of layer l: its delivered chunks get their positions repaired.
    auto& lt = st.layers[l];
    const auto began = wait_began == clock_type::time_point{} ? t0 : std::min(wait_began, t0);
    lt.wait_begin = rel(began);
    st.wait_seconds += std::chrono::duration<double>(t0 - began).count();
    for (const auto& p : s.repair)
      rotate_chunk_layer(l, p.offset, p.length, *s.cache, tf_.model());
    lt.ready = rel(clock_type::now());
    s.is_ready[l] = 1;
  }
  if (s.selecting) {
    if (s.query_first)
      step_query_first(s);
    else
      step_selection(s);
    st.select_seconds += since(t0);
  } else {
    const bool narrowing = s.narrowing;
    st.layers[l].compute_begin = rel(clock_type::now());
    step_final(s);
    st.layers[l].compute_end = rel(clock_type::now());
    if (narrowing) st.select_seconds += since(t0);
  }
  st.compute_seconds += since(t0);
}

void BlendEngine::step_selection(PrefillRun::State& s) const {
  const auto& c = tf_.model().config();
  auto& be = tf_.model().backend();
  auto& ws = be.workspace();
  auto& cache = *s.cache;
  auto& st = s.r.stats;
  const auto& sel = s.sel;
  const int l = s.layer;
  const int last = sel.checks.back();
  const int64_t chunks_end = s.N - s.S;
  const int64_t layer_bytes = static_cast<int64_t>(c.n_kv_heads) * s.N * c.head_dim * cache.elem_bytes();
  cache.save_layer(l, s.N, s.saved_k.as<std::byte>() + l * layer_bytes, s.saved_v.as<std::byte>() + l * layer_bytes);
  int64_t n = static_cast<int64_t>(s.sel_pos.size());
  if (l != sel.checks[s.sel_check]) {
    tf_.run_layer(l, s.sel_hidden.as<float>(), s.sel_pos_dev.as<int32_t>(), n, cache, chunks_end);
    ++s.layer;
    return;
  }
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  float* q = ws.get<float>(kQ, n * qd);
  float* k = ws.get<float>(kK, n * kvd);
  float* v = ws.get<float>(kV, n * kvd);
  tf_.project_qkv(l, s.sel_hidden.as<float>(), s.sel_pos_dev.as<int32_t>(), n, q, k, v);
  std::vector<char> candidate(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) candidate[i] = s.is_candidate[s.sel_pos[i]];
  auto [dev, cand_rows] = score_candidates(tf_, l, s.sel_pos, candidate, k, v, cache, s.opt.deviation);
  auto [keep_rows, taken] =
      keep_on_every_rank(tf_, sel, s.opt, sel.keep[s.sel_check], s.sel_pos, candidate, dev, cand_rows);
  st.candidates_per_check.push_back(taken + static_cast<int64_t>(sel.forced.size()));
  st.check_digests.push_back(digest_of(keep_rows, s.sel_pos));
  if (l == last) {
    // The selection is made: restore the loaded KV the pass overwrote, and the
    // chosen tokens join the final pass from layer 0.
    std::vector<int32_t> chosen;
    for (int32_t i : keep_rows)
      if (candidate[i]) chosen.push_back(s.sel_pos[i]);
    for (int saved = 0; saved <= last; ++saved)
      cache.restore_layer(saved, s.N, s.saved_k.as<std::byte>() + saved * layer_bytes,
                          s.saved_v.as<std::byte>() + saved * layer_bytes);
    s.saved_k.reset();
    s.saved_v.reset();
    // The selection pass's row buffers become the final pass's (kept where large
    // enough: no free and allocation between the passes).
    s.hidden = std::move(s.sel_hidden);
    s.rows_dev = std::move(s.sel_pos_dev);
    s.active.insert(s.active.end(), chosen.begin(), chosen.end());
    auto& recomputed = s.r.recomputed_positions;
    recomputed.insert(recomputed.end(), chosen.begin(), chosen.end());
    std::sort(recomputed.begin(), recomputed.end());
    std::sort(s.active.begin(), s.active.end());
    start_final_pass(s, {});
    return;
  }
  tf_.store_kv(l, s.sel_pos_dev.as<int32_t>(), n, k, v, cache);
  const int64_t kept = static_cast<int64_t>(keep_rows.size());
  const float* kept_q = narrow_to_kept(be, keep_rows, s.sel_hidden, c.dim, q, qd);
  std::vector<int32_t> kept_pos(keep_rows.size());
  for (size_t i = 0; i < keep_rows.size(); ++i) kept_pos[i] = s.sel_pos[keep_rows[i]];
  s.sel_pos = std::move(kept_pos);
  upload_ints(be, s.sel_pos, s.sel_pos_dev);
  tf_.attend_and_mlp(l, s.sel_hidden.as<float>(), kept_q, s.sel_pos_dev.as<int32_t>(), kept, cache, chunks_end);
  ++s.sel_check;
  ++s.layer;
}

void BlendEngine::step_query_first(PrefillRun::State& s) const {
  const auto& c = tf_.model().config();
  auto& be = tf_.model().backend();
  auto& ws = be.workspace();
  auto& cache = *s.cache;
  auto& st = s.r.stats;
  auto& sel = s.sel;
  const int l = s.layer;
  const int64_t n = static_cast<int64_t>(s.sel_pos.size());
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  float* q = ws.get<float>(kQ, n * qd);
  float* k = ws.get<float>(kK, n * kvd);
  float* v = ws.get<float>(kV, n * kvd);
  const int32_t* pos_dev = s.sel_pos_dev.as<int32_t>();
  tf_.project_qkv(l, s.sel_hidden.as<float>(), pos_dev, n, q, k, v);
  // The question's rows (and the missed parts') go into the cache at their own
  // positions; the final pass computes them again and overwrites them.
  tf_.store_kv(l, pos_dev, n, k, v, cache);
  // The weight the question's last rows pay each key (all heads; summed over
  // tensor-parallel ranks, so every rank holds the same doubles).
  const int64_t qr = std::min(question_rows(s.S, s.logit_rows), kQueryRows);
  double* mass = ws.get<double>(kMass, s.N);
  be.attention_mass(q + (n - qr) * qd, pos_dev + (n - qr), tf_.attention_view(cache, l), qr, c.n_heads, s.N,
                    c.attn_scale, mass);
  if (auto* comm = tf_.comm()) {
    tf_.sync_for_collective();
    comm->all_reduce_sum(mass, s.N, tf_.collective_timeout());
  }
  std::vector<double> weight(static_cast<size_t>(s.N));
  be.copy_to_host(weight.data(), mass, s.N * static_cast<int64_t>(sizeof(double)));
  double total = 0;
  for (int32_t p : sel.candidates) total += weight[static_cast<size_t>(p)];
  // A local (sliding-window) layer's question sees only its window's candidates: their
  // shares there would outweigh, layer after layer, those of candidates it cannot see.
  // Only the layers that see every candidate score them (Gemma 3: the global ones;
  // measured on it, tests/test_model_gemma3.cpp).
  const bool sees_all = tf_.model().window(l) == 0;
  if (total > 0 && sees_all && l >= std::min(s.opt.query_first_from_layer, c.n_layers - 1))
    for (size_t i = 0; i < sel.candidates.size(); ++i)
      s.qf_score[i] += weight[static_cast<size_t>(sel.candidates[i])] / total;
  tf_.attend_and_mlp(l, s.sel_hidden.as<float>(), q, pos_dev, n, cache, s.N);
  if (++s.layer < c.n_layers) return;

  // Every layer is scored: the candidates with the largest sums are recomputed.
  const int64_t m = static_cast<int64_t>(sel.candidates.size());
  double* score = ws.get<double>(kScore, m);
  be.copy_to_backend(score, s.qf_score.data(), m * static_cast<int64_t>(sizeof(double)));
  std::vector<int32_t> cand_rows(static_cast<size_t>(m));
  std::iota(cand_rows.begin(), cand_rows.end(), 0);
  const std::vector<char> all_candidates(static_cast<size_t>(m), 1);
  auto [keep_rows, taken] =
      keep_on_every_rank(tf_, sel, s.opt, s.opt.ratio, sel.candidates, all_candidates, score, cand_rows);
  st.candidates_per_check.push_back(taken + static_cast<int64_t>(sel.forced.size()));
  st.check_digests.push_back(digest_of(keep_rows, sel.candidates));
  std::vector<int32_t> chosen(keep_rows.size());
  for (size_t i = 0; i < keep_rows.size(); ++i) chosen[i] = sel.candidates[static_cast<size_t>(keep_rows[i])];
  s.sel_hidden.reset();
  s.active.insert(s.active.end(), chosen.begin(), chosen.end());
  auto& recomputed = s.r.recomputed_positions;
  recomputed.insert(recomputed.end(), chosen.begin(), chosen.end());
  std::sort(recomputed.begin(), recomputed.end());
  std::sort(s.active.begin(), s.active.end());
  s.query_first = false;
  start_final_pass(s, {});
}

void BlendEngine::step_final(PrefillRun::State& s) const {
  const auto& c = tf_.model().config();
  auto& be = tf_.model().backend();
  auto& ws = be.workspace();
  auto& cache = *s.cache;
  auto& st = s.r.stats;
  const auto& sel = s.sel;
  const int l = s.layer;
  int64_t n = static_cast<int64_t>(s.rows.size());
  if (!s.narrowing || l != sel.checks[s.check_index]) {
    tf_.run_layer(l, s.hidden.as<float>(), s.rows_dev.as<int32_t>(), n, cache, s.N);
    st.row_layers += n;
  } else {
    const int64_t qd = c.q_dim(), kvd = c.kv_dim();
    float* q = ws.get<float>(kQ, n * qd);
    float* k = ws.get<float>(kK, n * kvd);
    float* v = ws.get<float>(kV, n * kvd);
    tf_.project_qkv(l, s.hidden.as<float>(), s.rows_dev.as<int32_t>(), n, q, k, v);
    auto [dev, cand_rows] = score_candidates(tf_, l, s.rows, s.candidate, k, v, cache, s.opt.deviation);
    // Fresh K/V of every row computed here stay: the dropped candidates' loaded KV
    // is replaced by the better value at this layer. Stored once the deviation has
    // read the loaded rows, and before a query-aware rule reads the question's
    // attention over the layer's keys.
    tf_.store_kv(l, s.rows_dev.as<int32_t>(), n, k, v, cache);
    const double* score = dev;
    if (s.opt.selection != Selection::Deviation)
      score = query_aware_scores(tf_, l, s.opt.selection, q, s.rows_dev.as<int32_t>(), n, s.S, s.logit_rows - 1, s.N,
                                 s.rows,
                                 cand_rows, dev, cache);
    auto [keep_rows, taken] =
        keep_on_every_rank(tf_, sel, s.opt, sel.keep[s.check_index], s.rows, s.candidate, score, cand_rows);
    st.candidates_per_check.push_back(taken + static_cast<int64_t>(sel.forced.size()));
    st.check_digests.push_back(digest_of(keep_rows, s.rows));
    const int64_t kept_n = static_cast<int64_t>(keep_rows.size());
    const float* kept_q = narrow_to_kept(be, keep_rows, s.hidden, c.dim, q, qd);
    std::vector<int32_t> kept(keep_rows.size());
    std::vector<char> kept_candidate(keep_rows.size());
    for (size_t i = 0; i < keep_rows.size(); ++i) {
      kept[i] = s.rows[keep_rows[i]];
      kept_candidate[i] = s.candidate[keep_rows[i]];
    }
    s.rows = std::move(kept);
    s.candidate = std::move(kept_candidate);
    upload_ints(be, s.rows, s.rows_dev);
    n = kept_n;
    tf_.attend_and_mlp(l, s.hidden.as<float>(), kept_q, s.rows_dev.as<int32_t>(), n, cache, s.N);
    st.row_layers += n;
    if (++s.check_index == sel.checks.size()) {
      // The survivors are the recomputed tokens; from here on they are active.
      auto& recomputed = s.r.recomputed_positions;
      for (int64_t i = 0; i < n; ++i)
        if (s.candidate[i]) recomputed.push_back(s.rows[i]);
      std::sort(recomputed.begin(), recomputed.end());
      std::fill(s.candidate.begin(), s.candidate.end(), 0);
      s.narrowing = false;
    }
  }
  if (++s.layer == c.n_layers) s.finished_layers = true;
}

BlendPrefill BlendEngine::finish(PrefillRun&& run) const {
  if (!run.s_ || !run.s_->finished_layers) throw std::logic_error("blend: finish before the last layer");
  auto s = std::move(run.s_);
  const auto t0 = clock_type::now();
  const auto& c = tf_.model().config();
  auto& r = s->r;
  auto& st = r.stats;
  const int64_t n = static_cast<int64_t>(s->rows.size());
  st.recomputed_tokens = static_cast<int64_t>(r.recomputed_positions.size());
  st.recomputed_per_chunk.assign(static_cast<size_t>(st.chunks), 0);
  for (int32_t p : r.recomputed_positions) {
    const size_t at = static_cast<size_t>(p);
    if (at < s->sel.chunk_of.size() && s->sel.chunk_of[at] >= 0) ++st.recomputed_per_chunk[s->sel.chunk_of[at]];
  }
  r.logits.resize(static_cast<size_t>(s->logit_rows * c.vocab));
  tf_.logits(s->hidden.as<float>() + (n - s->logit_rows) * c.dim, s->logit_rows, r.logits.data());
  s->cache->length = s->N;
  r.cache = std::move(*s->cache);
  st.computed_tokens = n;
  st.compute_seconds += since(t0);
  st.total_seconds = since(s->t_begin);
  return std::move(r);
}

BlendPrefill BlendEngine::prefill_planned(const RagPrompt& prompt, const PrefillPlan& plan, KvCache& cache,
                                          const BlendOptions& opt, const LayerWait& wait, int64_t logit_rows,
                                          clock_type::time_point epoch) const {
  PrefillRun run = begin(prompt, plan, cache, opt, logit_rows, epoch);
  while (!run.done()) {
    const auto t0 = clock_type::now();
    if (run.needs_delivery() && wait) wait(run.next_layer());
    step(run, t0);
  }
  return finish(std::move(run));
}

}  // namespace bs
