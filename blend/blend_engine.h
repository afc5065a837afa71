// CacheBlend prefill (arXiv:2405.16444): reuse every chunk's stored KV wherever the
// chunk lands, repair its positions (delta-RoPE), and recompute only the tokens
// whose KV deviates most from what a full prefill would give.
//
// Selection and recompute run in one pass over the layers (the paper's form):
// every token without stored KV (missed chunks, the suffix, a missed prefix) and
// every cached chunk token (the candidates) start at layer 0. At each check layer
// the candidates' fresh K/V are compared with the loaded, repaired K/V; the fresh
// K/V of every row computed there is kept in the cache, and only the candidates
// with the largest score (the deviation, or a query-aware rule: Selection) continue
// to the next layer, from their hidden states.
// After the last check layer the survivors are the recomputed tokens; everything
// else keeps its loaded KV from there on. One check layer is the one-shot variant
// of the open implementations; several with a narrowing schedule is gradual
// filtering.
//
// Filtering::TwoPass keeps the earlier form for comparison: the selection runs on a
// scratch copy of layers 0..last check layer (restored afterwards), then the
// selected tokens are recomputed from layer 0 in a second pass, so tokens scored
// with fresh context go back to loaded KV in the early layers.
//
// Ratio 1 computes exactly what `full` does and ratio 0 exactly what `reuse` does.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "storage/chunk_kv.h"
#include "blend/rag_prompt.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace bs {

enum class BlendMode { Full, Prefix, Reuse, Blend };
const char* mode_name(BlendMode m);
BlendMode parse_mode(const std::string& s);  // throws std::invalid_argument

// What the deviation compares (kernels::KvDeviation: the backend op computes it).
using Deviation = kernels::KvDeviation;
const char* deviation_name(Deviation d);
Deviation parse_deviation(const std::string& s);  // throws std::invalid_argument

// How the recompute budget is spread: the largest deviations over all cached
// chunks, or each cached chunk's share (its tokens / all cached tokens) of the
// budget taken from its own largest deviations.
enum class Quota { Global, PerChunk };
const char* quota_name(Quota q);
Quota parse_quota(const std::string& s);  // throws std::invalid_argument

// What ranks the candidates at a check layer. Deviation: how far a token's loaded KV
// is from its fresh KV (CacheBlend). Attention: how much the question reads the token
// (the weight the suffix's query rows pay its key at that layer, summed over heads
// and rows; ProphetKV's criterion). Impact: the product of the two, the deviation's
// norm times that weight — to first order, how far the token's stale KV moves the
// question's attention output. The query-aware rules read the suffix's rows, which
// single-pass filtering computes at every check layer.
// QueryFirst: ProphetKV's order of work. A first pass runs only the question's rows
// (the suffix, and any part without stored KV) through every layer over the stored,
// position-repaired KV and ranks each cached token by the attention those rows pay it,
// summed over all layers (each layer's weights over the cached tokens normalized to
// sum 1, so no layer dominates); then one pass recomputes the top `ratio` from layer
// 0. No check layers, no fresh K/V of tokens that are dropped: the final pass runs
// `ratio` of the cached rows in every layer, where gradual filtering runs all of them
// through the early layers. The question reads what it needs in its deep layers,
// which the check layers 1..6 never see.
enum class Selection { Deviation, Attention, Impact, QueryFirst };
const char* selection_name(Selection s);
Selection parse_selection(const std::string& s);  // throws std::invalid_argument

enum class Filtering { SinglePass, TwoPass };
const char* filtering_name(Filtering f);
Filtering parse_filtering(const std::string& s);  // throws std::invalid_argument

struct BlendOptions {
  BlendMode mode = BlendMode::Blend;
  // The default is query-first at 0.16. At 0.13 (what gradual filtering by deviation
  // at 0.10, the default before, costs) it won on each of two halves of the generated
  // set and of MuSiQue half A (lower first-token KL, higher agreement along full's own
  // answer; tools/eval/RESULTS.md, "query-first becomes the default"); 0.16 brings
  // the generated set's KL under 0.05 (0.050 -> 0.044) and improves every measure on
  // both sets, at 0.28-0.29x full's TTFT (tools/eval/RESULTS.md, "The ratio 0.16").
  float ratio = 0.16f;                             // fraction of cached chunk tokens recomputed
  // For selection deviation: the deviation is measured after each of these layers,
  // the candidates narrowing linearly from all cached tokens to `ratio` (gradual
  // filtering; on all 240 shipped cases it beat one check at layer 1).
  std::vector<int> check_layers{1, 2, 3, 4, 5, 6};  // layers where deviation is measured (>= 1)
  // Fraction of cached chunk tokens kept after each check layer. Empty: one check
  // layer keeps `ratio`; several narrow linearly from 1 towards `ratio`.
  std::vector<float> schedule;
  // Recompute at least this many cached tokens (if any) at any ratio > 0; ratio 0 is
  // exactly `reuse` and recomputes none.
  int min_tokens = 1;
  Deviation deviation = Deviation::KV;
  Quota quota = Quota::Global;
  Filtering filtering = Filtering::SinglePass;
  // Query-aware rules (attention, impact) need single-pass filtering; validate()
  // refuses them with two-pass. query-first (the default) has its own two passes and
  // does not use check_layers, schedule, deviation or filtering (quota and sink_tokens
  // apply to it as to the others).
  Selection selection = Selection::QueryFirst;
  // The first sink_tokens tokens of every cached chunk are always recomputed (they
  // were the attention sink of the chunk computed alone; in place they are not).
  // They count towards the budget: the deviation picks the rest. Ratio 0 still
  // recomputes nothing.
  int sink_tokens = 0;
  // query-first sums the question's attention over layers query_first_from_layer..last
  // only (a model with fewer layers: its last layer alone). Leaving out layers 0-1 was
  // tried as the default and lost on one of the four halves (tools/eval/RESULTS.md,
  // "Ways of scoring query-first's candidates that did not win"), so every layer is
  // summed by default. A model's local (sliding-window) layers are
  // never summed: their question sees only its window (Gemma 3: its global layers score).
  // Other rules do not use it.
  int query_first_from_layer = 0;
};

struct BlendStats {
  int64_t prompt_tokens = 0, prefix_tokens = 0, chunk_tokens = 0, suffix_tokens = 0;
  bool prefix_hit = false;             // some of the prefix came stored
  int64_t prefix_cached_tokens = 0;    // how many of its tokens (PrefillPlan::prefix_cached)
  int chunks = 0, chunks_hit = 0;
  int64_t cached_tokens = 0;                 // chunk tokens whose KV came from the store
  int64_t recomputed_tokens = 0;             // cached tokens selected for recompute
  int64_t computed_tokens = 0;               // tokens run through all layers in the final pass
  // Rows through a layer's attention and MLP in the final pass, summed over the
  // layers (gradual filtering narrows the rows layer by layer): the unit of the
  // loading controller's compute profile (planned_rows_per_layer predicts it).
  int64_t row_layers = 0;
  std::vector<int64_t> candidates_per_check; // selection narrowing, one per check layer
  // The rule that ranked the candidates (selection_name; "none" when nothing was
  // selected: full, reuse, prefix mode, ratio 0 or 1, or no cached chunk), and the
  // recomputed tokens per chunk of the prompt (0 for a chunk that missed).
  std::string selection = "none";
  std::vector<int64_t> recomputed_per_chunk;
  // Per check layer: XXH3 of the positions that went on. Tensor-parallel ranks take
  // the leader's set; comparing the ranks' digests shows they did.
  std::vector<uint64_t> check_digests;
  // load: reading stored KV up front (StoreBackedBlend; a runtime's loaders run
  // beside the steps instead). select: the compute that scores and narrows the
  // candidates. compute: the prefill's own compute (embedding, every step, logits),
  // without waits. total: begin to finish, wall clock.
  double load_seconds = 0, select_seconds = 0, compute_seconds = 0, total_seconds = 0;
  // Time from when the caller began waiting for a layer's delivery to its step
  // (BlendEngine::step's wait_began): loads not yet there, and in a runtime the
  // work of other requests that ran meanwhile.
  double wait_seconds = 0;
  // Per layer, in seconds since the prefill's epoch: when its loaded KV was there
  // (after the wait and the position repair), and the final pass over it.
  struct LayerTiming {
    double wait_begin = -1, ready = -1, compute_begin = -1, compute_end = -1;
  };
  std::vector<LayerTiming> layers;
};

// Which parts of a prompt arrive with stored KV (prefill_planned). The loaders
// write each delivered part's stored KV *as stored* (K rotated for positions
// 0..m-1) into the cache at the part's offset, layer by layer; the engine repairs
// the positions of a layer once it is there.
struct PrefillPlan {
  // The prefix's first prefix_cached tokens (all of it, or a run of whole blocks from
  // position 0: automatic prefix caching) are delivered with their exact KV at their
  // own positions: no repair, no recompute. The rest of the prefix is computed.
  int64_t prefix_cached = 0;
  std::vector<char> chunk_loaded;  // per chunk: its stored KV is delivered
};

// Blocks until layer `layer` of every delivered part is in the cache. Throws to
// abort the prefill (e.g. a loader failed); layers are asked for in order.
using LayerWait = std::function<void(int layer)>;

struct BlendPrefill {
  KvCache cache;               // the fused KV of the whole prompt (length = prompt size)
  std::vector<float> logits;   // [logit_rows, vocab] for the last logit_rows prompt tokens
  BlendStats stats;
  std::vector<int32_t> recomputed_positions;  // positions of cached tokens that were recomputed
};

struct BlendSelection;  // blend/selection_rules.h: candidates, forced tokens, budget shape

// A prefill in progress: what the engine carries from one layer to the next
// (BlendEngine::begin / step / finish). Whoever holds it decides when each step
// runs — a runtime interleaves the layers of several prefills with decode steps
// and runs a step only once that layer's stored KV is delivered, so a prefill
// waiting on a slow tier does not hold the compute thread. Steps must run one at a
// time, on a thread where the Transformer's calls may run; between steps nothing
// of the prefill lives in the Transformer's per-thread scratch.
class PrefillRun {
 public:
  PrefillRun();
  PrefillRun(PrefillRun&&) noexcept;
  PrefillRun& operator=(PrefillRun&&) noexcept;
  ~PrefillRun();

  bool done() const;
  // The layer the next step computes over; its stored KV must be in the cache
  // before step() when needs_delivery(). -1 when done.
  int next_layer() const;
  // The next step is the first to read next_layer(): its delivered KV is repaired
  // (delta-RoPE) in that step. False for a layer already there (the final pass of
  // two-pass filtering or of query-first re-reads layers the first pass waited for).
  bool needs_delivery() const;
  // Steps left at most (a two-pass prefill counts its selection layers too, a
  // query-first one its question's pass over every layer).
  int steps_left() const;
  const BlendStats& stats() const;

 private:
  friend class BlendEngine;
  struct State;
  std::unique_ptr<State> s_;
};

// The blend's compute over a Transformer: no store. Which parts arrive with stored
// KV is the caller's plan (a runtime's controller and loaders, or StoreBackedBlend
// for a direct call over one store).
class BlendEngine {
 public:
  // chunk_prelude: tokens every chunk is computed behind and then dropped (empty:
  // chunks are computed alone). A chunk computed alone makes its first token the
  // attention sink of its KV; behind a prelude the prelude takes that role, as the
  // prompt's own first tokens do in place. Part of every chunk key.
  explicit BlendEngine(const Transformer& tf, std::vector<int32_t> chunk_prelude = {})
      : tf_(tf), chunk_prelude_(std::move(chunk_prelude)) {}

  // A prefill over KV that arrives layer by layer, as steps. `cache` (capacity >=
  // the prompt, length ignored) receives the plan's parts as stored (K rotated for
  // positions 0..m-1) at their offsets, from loaders that may run concurrently;
  // step() repairs the positions of the delivered chunks in a layer the first time
  // it reads that layer. The cache must outlive the run and stay where it is until
  // finish() moves it into the result; if a step throws, it is still the caller's
  // (loaders may still be writing into it). Times in the stats are seconds since
  // `epoch`. Throws what validate() throws, before any work.
  PrefillRun begin(const RagPrompt& prompt, const PrefillPlan& plan, KvCache& cache, const BlendOptions& options,
                   int64_t logit_rows = 1,
                   std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now()) const;
  // One layer (of the selection pass, or of the final pass). `wait_began`: when the
  // caller began waiting for this layer's delivery (its per-layer wait in the stats;
  // default: no wait).
  void step(PrefillRun& run, std::chrono::steady_clock::time_point wait_began = {}) const;
  // The logits of the last rows, and the fused cache (moved out of the caller's).
  BlendPrefill finish(PrefillRun&& run) const;

  // begin / step / finish in one call: before the first step of each layer the
  // engine calls wait(l), which blocks until its stored KV is delivered (and may run
  // other work on this thread, e.g. the runtime's decode steps). Throws to abort.
  BlendPrefill prefill_planned(const RagPrompt& prompt, const PrefillPlan& plan, KvCache& cache,
                               const BlendOptions& options, const LayerWait& wait, int64_t logit_rows = 1,
                               std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now()) const;
  // Throws the errors a prefill of these arguments would, before any work.
  void validate(const RagPrompt& prompt, const BlendOptions& options, int64_t extra_capacity = 0,
                int64_t logit_rows = 1) const;

  // KV of a chunk at positions 0..m-1 (what the store holds): computed behind the
  // chunk prelude if there is one (the chunk at positions p..p+m-1, K rotated back
  // by -p), else alone. between_layers, if set, is called before each layer (the
  // runtime's decode steps run there). Tensor parallel: every rank computes its
  // heads and every rank returns the whole chunk (gather_chunk_heads).
  std::shared_ptr<const ChunkKv> compute_chunk_kv(std::span<const int32_t> tokens,
                                                  const LayerWait& between_layers = {}) const;
  // KV of an exact prefix: computed alone at positions 0..m-1 (it is used only there).
  std::shared_ptr<const ChunkKv> compute_prefix_kv(std::span<const int32_t> tokens,
                                                   const LayerWait& between_layers = {}) const;
  // A chunk's KV as it stands in a request's cache: rows [offset, offset + m) of every
  // layer (in context: they attended to the prompt before them), copied, K rotated
  // back by -offset to positions 0..m-1, the stored convention. The runtime stores it as
  // a provisional entry (actors/runtime/chunk_flights.h) until the chunk's KV computed alone
  // replaces it. The cache must be host memory (the rotation runs on the copy with
  // the backend's rope_kv_rows) and hold every KV head (not a tensor-parallel rank's).
  std::shared_ptr<ChunkKv> chunk_in_context(const KvCache& cache, int64_t offset,
                                            std::span<const int32_t> tokens) const;
  const std::vector<int32_t>& chunk_prelude() const { return chunk_prelude_; }
  const Transformer& transformer() const { return tf_; }

  // Tensor parallel: the chunk of every KV head from each rank's `mine` (its heads),
  // on every rank. All ranks call it together.
  std::shared_ptr<const ChunkKv> gather_chunk_heads(const ChunkKv& mine) const;

  ChunkKey chunk_key(std::span<const int32_t> tokens) const;
  ChunkKey prefix_key(std::span<const int32_t> tokens) const;
  // The keys of the blocks of tokens [0, end) (make_prefix_block_key, chained from the
  // first): the whole `block`-token blocks, then, where end is not a multiple of
  // block, the partial block of the last end % block tokens (the same prompt again
  // finds every token before its last stored). end <= tokens.size().
  std::vector<ChunkKey> prefix_block_keys(std::span<const int32_t> tokens, int64_t block, int64_t end) const;

 private:
  // KV of `tokens` computed behind `before` (positions 0..p-1, dropped): rows p.. of
  // the result, K rotated back to positions 0..m-1.
  std::shared_ptr<const ChunkKv> compute_kv_behind(std::span<const int32_t> before, std::span<const int32_t> tokens,
                                                   const LayerWait& between_layers) const;
  // Steps of the two-pass selection and of the final pass (blend_engine.cpp).
  void step_selection(PrefillRun::State& s) const;
  void step_query_first(PrefillRun::State& s) const;
  void step_final(PrefillRun::State& s) const;
  // The first pass's rows (State::sel_pos, two-pass's or query-first's): uploaded,
  // and their embeddings in sel_hidden.
  void start_first_pass(PrefillRun::State& s) const;
  void start_final_pass(PrefillRun::State& s, std::vector<int32_t> candidates) const;

  const Transformer& tf_;
  std::vector<int32_t> chunk_prelude_;
};

// Rows the final pass of a prefill runs through each layer's attention and MLP, as
// `o` runs it: `other` rows (no stored KV: missed chunks and prefix, the suffix) in
// every layer, plus the `cached` chunk tokens still computed there — in blend mode
// all of them before the first check layer, the schedule's kept fraction from each
// check layer on and the ratio from the last (single pass), or the ratio in every
// layer (two-pass and query-first, whose first pass is not counted); none in reuse or prefix
// mode. The loading controller predicts compute time and TTFT from it; the engine
// counts the same rows (BlendStats::row_layers). Throws on options validate() refuses.
std::vector<double> planned_rows_per_layer(const BlendOptions& o, int n_layers, int64_t other, int64_t cached);

// Copies one layer of a stored chunk's KV into the cache at `offset` as stored (K
// still rotated for positions 0..m-1). k, v: [kv_heads, m, head_dim] elements of
// dtype (the cache's: copied unchanged; another: widened and rounded to the cache's).
// Tensor parallel: the cache holds a rank's KV heads, the chunk every head; the
// cache's heads are the chunk's [first_head, first_head + cache.kv_heads)
// (LlamaModel::first_kv_head). `stream`: the caller's copy stream for rows stored in the
// cache's dtype (KvCache::write_block_raw: one block per layer); rows of another dtype go
// the synchronous way.
void copy_chunk_layer(const std::byte* k, const std::byte* v, kernels::TensorType dtype, int64_t m, int layer,
                      int64_t offset, KvCache& cache, int first_head = 0, kernels::Stream* stream = nullptr);
// Rotates K of cache rows offset..offset+m-1 in `layer` from positions 0..m-1 to
// offset..offset+m-1 (delta-RoPE, R(offset + i) = R(offset)·R(i)), on the model's
// backend with the layer's RoPE table (LlamaModel::rope(layer)).
void rotate_chunk_layer(int layer, int64_t offset, int64_t m, KvCache& cache, const LlamaModel& model);

// Copies a stored chunk's KV into the cache at `offset` and rotates its K from
// positions 0..m-1 to offset..offset+m-1 (R(offset + i) = R(offset)·R(i)).
void place_chunk_kv(const ChunkKv& chunk, int64_t offset, KvCache& cache, const LlamaModel& model);

}  // namespace bs
