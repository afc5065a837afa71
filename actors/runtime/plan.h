// A request as the back end sees it: plain values — the id, token ids, keys,
// options, the tier each part comes from, the ratio — passed by message from the
// intake to the controller, from the controller to the worker and from the worker
// to the loaders; the worker's outcome goes to the decoder the same way. Nothing
// here points into another actor's state: execution state (the cache, the layer
// gate, decode state) is the worker's, keyed by request id (actors/runtime/load_target.h).
// Every type has an inspect overload and messages.h registers it
// (add_runtime_message_types), so a plan could cross a process or node boundary (a
// protocol test serializes one and reads it back; today none crosses). No CAF here: inspect is
// a template CAF's serializers instantiate. A field added to one of these structs
// goes into its inspect overload in the same change.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "blend/blend_engine.h"
#include "blend/rag_prompt.h"
#include "model/generate.h"
#include "storage/chunk_kv.h"

namespace bs {

// A stored tier by its place in the runtime's tier list (lookup order:
// RuntimeContext::tiers), or kMissTier for a part that has no stored KV.
using TierId = int8_t;
constexpr TierId kMissTier = -1;

struct RequestPlan {
  uint64_t id = 0;
  // -- the intake: what to compute
  RagPrompt prompt;
  std::vector<ChunkKey> chunk_keys;  // one per prompt chunk
  // Automatic prefix caching: the prompt's first prefix_end tokens in blocks of
  // prefix_block (blend.prefix_block_tokens; 0: off), the keys of the blocks that may
  // come stored (make_prefix_block_key: each chains every token before it). prefix_end:
  // the first chunk's offset, or, with no chunks, the last prompt token's (which is
  // always computed: its logits are the first token's). Whole blocks, then a partial
  // last block of prefix_end % prefix_block tokens, which only the same tokens before
  // the same cut find again (the same request again, a retry, a regenerate).
  int64_t prefix_block = 0;
  int64_t prefix_end = 0;
  std::vector<ChunkKey> prefix_block_keys;
  // Passages learnt on first sight (blend.learn_passage_tokens): the chunk tokens of the
  // pasted message's paragraphs that were not found stored; the worker computes each
  // alone in the background and stores it, so a later paste finds it.
  std::vector<std::vector<int32_t>> learn;
  // Whether the chunks computed for want of stored KV are stored afterwards (write-back):
  // a request's documents are; the text between passages found pasted in a plain message
  // is not (its paragraphs are learnt instead).
  bool store_missed_chunks = true;
  // The chunks are passages found in a plain message's text (blend.find_pasted), stored
  // before by documents or learnt: the trace and usage count their tokens apart.
  bool pasted = false;
  BlendOptions options;              // the config's, with the request's mode and ratio
  bool ratio_requested = false;      // the caller set the ratio: the controller keeps it
  SamplingParams sampling;           // final: max_tokens clamped to the context, the template's stops added
  // -- the controller: where each part comes from and at which ratio (options.ratio)
  std::vector<TierId> chunk_tier;    // per chunk
  // The tier of each stored prefix block, a run from block 0 (their tokens are
  // loaded.prefix_cached; the controller moves the prompt's prefix/suffix cut to cover
  // them where the prompt has no chunks).
  std::vector<TierId> prefix_block_tier;
  PrefillPlan loaded;                // the same, as the engine takes it
  std::string decision;              // the controller's decision and its inputs (JSON, for the trace)

  // Positions the request's cache holds: the prompt and every token it may generate.
  int64_t cache_capacity() const { return prompt.size() + sampling.max_tokens; }
  // Parts that may come from a tier: chunks 0..n-1, then the stored prefix blocks.
  size_t parts() const { return prompt.chunks.size() + prefix_block_tier.size(); }
  bool is_prefix_block(size_t part) const { return part >= prompt.chunks.size(); }
  size_t block_of(size_t part) const { return part - prompt.chunks.size(); }
  // Prefix block j's tokens: prefix_block, or fewer for a partial last block.
  int64_t block_length(size_t j) const {
    return std::min(prefix_block, prefix_end - static_cast<int64_t>(j) * prefix_block);
  }
  // The tokens of prefix blocks 0..n-1.
  int64_t blocks_tokens(size_t n) const {
    return n == 0 ? 0 : static_cast<int64_t>(n - 1) * prefix_block + block_length(n - 1);
  }
  std::span<const int32_t> part_tokens(size_t part) const {
    if (!is_prefix_block(part)) return prompt.chunks[part];
    return std::span<const int32_t>(prompt.prefix).subspan(block_of(part) * static_cast<size_t>(prefix_block),
                                                           static_cast<size_t>(block_length(block_of(part))));
  }
  const ChunkKey& part_key(size_t part) const {
    return is_prefix_block(part) ? prefix_block_keys[block_of(part)] : chunk_keys[part];
  }
  TierId part_tier(size_t part) const {
    return is_prefix_block(part) ? prefix_block_tier[block_of(part)] : chunk_tier[part];
  }
  int64_t part_offset(size_t part) const {
    return is_prefix_block(part) ? static_cast<int64_t>(block_of(part)) * prefix_block : prompt.chunk_offset(part);
  }
};

// What the worker hands the decoder when a prefill ended: the plan it ran, the
// logits of the last prompt position, and what the prefill did. `error` is set
// when it failed (then there are no logits).
struct PrefillOutcome {
  RequestPlan plan;
  std::string error;
  std::vector<float> logits;       // [vocab]
  int64_t cached_tokens = 0;       // prompt tokens whose KV came from a tier (chunks and prefix)
  int64_t prefix_cached_tokens = 0; // of those, the prefix's (automatic prefix caching)
  int64_t recomputed_tokens = 0;   // of those, recomputed by the blend
  bool fallback = false;           // a stored entry failed mid-load: begun again with it computed
};

// A decode step asked of the worker: the token to append, and the settings and draw
// (the request's sampler, kernels/sampling.h) that pick the next one where the backend
// picks it (a device backend: only the id comes back).
struct DecodeAsk {
  int32_t token = -1;
  kernels::SampleRow next;
};

// One decode step's result for one request, from the worker to the decoder: the next
// token picked on the backend, or the logits to pick it from.
struct DecodeStep {
  std::vector<float> logits;  // [vocab], or empty: picked on the backend, or not computed (cancelled, failed)
  int32_t token = -1;         // picked on the backend with DecodeAsk::next; -1: from the logits
  int32_t batch = 0;          // requests in the step (continuous batching)
  bool interleaved = false;   // run between the layers of a prefill or write-back compute
  std::string error;          // the step failed for this request
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChunkKey& x) {
  return f(x.hi, x.lo);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RagPrompt& x) {
  return f(x.prefix, x.chunks, x.suffix);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BlendOptions& x) {
  return f(x.mode, x.ratio, x.check_layers, x.schedule, x.min_tokens, x.deviation, x.quota, x.filtering,
           x.selection, x.sink_tokens, x.query_first_from_layer);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PrefillPlan& x) {
  return f(x.prefix_cached, x.chunk_loaded);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  return f(x.temperature, x.top_p, x.top_k, x.seed, x.max_tokens, x.stop);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestPlan& x) {
  return f(x.id, x.prompt, x.chunk_keys, x.prefix_block, x.prefix_end, x.prefix_block_keys, x.learn, x.store_missed_chunks, x.pasted, x.options,
           x.ratio_requested, x.sampling, x.chunk_tier, x.prefix_block_tier, x.loaded, x.decision);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PrefillOutcome& x) {
  return f(x.plan, x.error, x.logits, x.cached_tokens, x.prefix_cached_tokens, x.recomputed_tokens, x.fallback);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DecodeStep& x) {
  return f(x.logits, x.token, x.batch, x.interleaved, x.error);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DecodeAsk& x) {
  return f(x.token, x.next.temperature, x.next.top_p, x.next.top_k, x.next.uniform);
}

}  // namespace bs
