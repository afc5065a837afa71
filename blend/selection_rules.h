// How the blend picks the tokens it recomputes (blend/blend_engine.h's Selection,
// Deviation, Quota): the candidates' scores at a check layer (the deviation of
// loaded from fresh K/V, or the question's attention), the budget after each check
// layer, and the rows that go on, decided once for every tensor-parallel rank.
// Private to the engine's files (blend/blend_engine.cpp runs the prefill's steps
// and calls these); the scores live in the backend's memory, in the engine's
// workspace slots (blend/engine_buffers.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "blend/blend_engine.h"

namespace bs {

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

namespace blend_detail {

// The kept fraction of cached tokens after each check layer.
std::vector<float> keep_fractions(const BlendOptions& o);

// The check layers sorted, without repeats, each in [1, n_layers - 1].
std::vector<int> sorted_check_layers(const BlendOptions& o, int n_layers);

// The deviation of each candidate row (candidate[i] != 0) of a check layer: its
// fresh K/V (k, v: [n, kv_dim], backend memory) against the loaded, position-repaired
// rows the cache holds at its position. A half-precision cache holds the loaded rows
// rounded: they are compared as stored (widened), the fresh rows as computed.
// Returns the scores ([candidates], backend memory, in row order) and the candidates'
// row indices (host).
std::pair<const double*, std::vector<int32_t>> score_candidates(const Transformer& tf, int layer,
                                                                 const std::vector<int32_t>& pos,
                                                                 const std::vector<char>& candidate, const float* k,
                                                                 const float* v, const KvCache& cache,
                                                                 Deviation which);

// The query-aware rules read at most this many of the question's last rows (the
// question and the turn's template; a longer suffix's earlier rows add cost, not
// signal about what the answer reads).
inline constexpr int64_t kQueryRows = 128;

// The question's rows: the suffix up to the first row whose logits are asked for.
// Rows after it are a continuation being scored (an eval's teacher-forced answer),
// which must not steer what is recomputed for it.
inline int64_t question_rows(int64_t suffix_rows, int64_t logit_rows) { return suffix_rows - (logit_rows - 1); }

// The candidates' scores under a query-aware rule (Selection), replacing the
// deviations: the attention the question's rows — the last of `rows_dev` but
// `tail_rows` (a scored continuation), whose K/V and every computed row's must
// already be in the cache at `layer` — pay each of
// the n_kv keys, summed over heads and rows (all-reduced over tensor-parallel ranks,
// each of which holds its heads), then per candidate: Attention, that weight; Impact,
// it times the deviation's norm. Combined on the host (a few thousand doubles) and
// returned in backend memory, in candidate order, for top_k.
const double* query_aware_scores(const Transformer& tf, int layer, Selection rule, const float* q,
                                 const int32_t* rows_dev, int64_t n, int64_t suffix_rows, int64_t tail_rows,
                                 int64_t n_kv, const std::vector<int32_t>& pos, const std::vector<int32_t>& cand_rows,
                                 const double* deviation, const KvCache& cache);

// Rows that go on after a check layer: every row that is not a candidate, and the
// candidates with the largest score within the budget (the forced tokens are part of
// it). Largest score first, ties by position so the choice is deterministic (the
// backend's top_k: by index, and candidates are in position order). `deviation`: the
// candidates' scores (score_candidates' deviations, or query_aware_scores), `cand_rows` their
// rows. Returns row indices ascending and how many candidates stayed.
std::pair<std::vector<int32_t>, int64_t> keep_after_check(kernels::Backend& be, const BlendSelection& sel,
                                                           const BlendOptions& opt, float fraction,
                                                           const std::vector<int32_t>& pos,
                                                           const std::vector<char>& candidate,
                                                           const double* deviation,
                                                           const std::vector<int32_t>& cand_rows);

// keep_after_check on a tensor-parallel group: rank 0 picks the rows and broadcasts
// them (as int32), every rank continues with exactly that set. The deviations are
// bit-identical on every rank after the all-reduce, but the selection is the
// leader's decision, so no rank can ever continue with other rows. At tp 1 it is
// keep_after_check. Returns what keep_after_check returns, and the set's digest.
std::pair<std::vector<int32_t>, int64_t> keep_on_every_rank(const Transformer& tf, const BlendSelection& sel,
                                                            const BlendOptions& opt, float fraction,
                                                            const std::vector<int32_t>& pos,
                                                            const std::vector<char>& candidate,
                                                            const double* deviation,
                                                            const std::vector<int32_t>& cand_rows);

// XXH3 of the positions that go on after a check layer (BlendStats::check_digests).
uint64_t digest_of(const std::vector<int32_t>& rows, const std::vector<int32_t>& pos);

}  // namespace blend_detail
}  // namespace bs
