// CacheBlend prefill (DESIGN.md §2): reuse every chunk's stored KV wherever the
// chunk lands, repair its positions (delta-RoPE), and recompute only the tokens
// whose KV deviates most from what a full prefill would give.
//
// The blend runs in two passes:
//  1. Selection. Chunk tokens that hit the cache are run through the layers up to
//     the last check layer on a scratch copy of those layers' KV. At each check
//     layer their fresh K/V are compared with the loaded, repaired K/V; the
//     tokens with the largest deviation stay candidates. One check layer is the
//     one-shot variant of the open implementations; several check layers with a
//     narrowing schedule is the paper's gradual filtering.
//  2. Blend. The final selection, plus every token of a chunk that missed the
//     cache, plus the suffix, is computed through all layers; at every layer their
//     fresh K/V overwrite the loaded ones and their queries attend to the fused KV
//     of all earlier positions. Everything else keeps its loaded KV.
// Selection is a pure scoring step, so ratio 1 computes exactly what `full` does
// and ratio 0 exactly what `reuse` does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/chunk_kv.h"
#include "blend/rag_prompt.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "storage/kv_store.h"

namespace bs {

enum class BlendMode { Full, Prefix, Reuse, Blend };
const char* mode_name(BlendMode m);
BlendMode parse_mode(const std::string& s);  // throws std::invalid_argument

enum class Deviation { K, V, KV };

struct BlendOptions {
  BlendMode mode = BlendMode::Blend;
  float ratio = 0.15f;               // fraction of cached chunk tokens recomputed
  std::vector<int> check_layers{1};  // layers where deviation is measured (>= 1)
  // Fraction of cached chunk tokens kept after each check layer. Empty: one check
  // layer keeps `ratio`; several narrow linearly from 1 towards `ratio`.
  std::vector<float> schedule;
  int min_tokens = 1;                // recompute at least this many cached tokens (if any)
  Deviation deviation = Deviation::KV;
};

struct BlendStats {
  int64_t prompt_tokens = 0, prefix_tokens = 0, chunk_tokens = 0, suffix_tokens = 0;
  bool prefix_hit = false;
  int chunks = 0, chunks_hit = 0;
  int64_t cached_tokens = 0;                 // chunk tokens whose KV came from the store
  int64_t recomputed_tokens = 0;             // cached tokens selected for recompute
  int64_t computed_tokens = 0;               // tokens run through all layers in the final pass
  std::vector<int64_t> candidates_per_check; // selection narrowing, one per check layer
  double load_seconds = 0, select_seconds = 0, compute_seconds = 0, total_seconds = 0;
};

struct BlendPrefill {
  KvCache cache;               // the fused KV of the whole prompt (length = prompt size)
  std::vector<float> logits;   // [logit_rows, vocab] for the last logit_rows prompt tokens
  BlendStats stats;
  std::vector<int32_t> recomputed_positions;  // positions of cached tokens that were recomputed
};

class BlendEngine {
 public:
  BlendEngine(const Transformer& tf, KvStore& store) : tf_(tf), store_(store) {}

  // Prefill of a RAG prompt in the given mode. The cache gets room for
  // `extra_capacity` more tokens (decode). logit_rows > 1 returns the logits of
  // the last rows too (teacher forcing over an appended answer).
  BlendPrefill prefill(const RagPrompt& prompt, const BlendOptions& options, int64_t extra_capacity = 0,
                       int64_t logit_rows = 1) const;

  // KV of a chunk computed alone at positions 0..m-1 (what the store holds).
  std::shared_ptr<const ChunkKv> compute_chunk_kv(std::span<const int32_t> tokens) const;
  // Computes and stores the prompt's prefix and chunk KV that are not stored yet.
  // A request whose chunks missed computes them in context for its answer; running
  // this afterwards (off the first-token path) makes the next request hit.
  void warm(const RagPrompt& prompt) const;

  ChunkKey chunk_key(std::span<const int32_t> tokens) const;
  ChunkKey prefix_key(std::span<const int32_t> tokens) const;

 private:
  // Selection pass: scores the cached chunk tokens at the check layers on a scratch
  // copy of those layers' KV (restored afterwards) and returns the positions to
  // recompute. `missed` are chunk positions computed anyway (cache misses).
  std::vector<int32_t> select_recompute(const std::vector<int32_t>& prompt_tokens, const std::vector<int32_t>& cached,
                                        const std::vector<int32_t>& missed, int64_t chunks_end,
                                        const BlendOptions& opt, KvCache& cache, BlendStats& stats) const;

  const Transformer& tf_;
  KvStore& store_;  // any tier: RAM, SSD, or (later) a storage node
};

// Copies a stored chunk's KV into the cache at `offset` and rotates its K from
// positions 0..m-1 to offset..offset+m-1 (R(offset + i) = R(offset)·R(i)).
void place_chunk_kv(const ChunkKv& chunk, int64_t offset, KvCache& cache, kernels::Backend& backend,
                    const kernels::RopeTable& rope);

}  // namespace bs
