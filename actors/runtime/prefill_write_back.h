// What a prefill leaves in the stores, decided by the layer worker when it ends
// (actors/runtime/layer_worker.cpp): the chunks it had to compute, computed alone in
// the compute thread's background and sent to the write-back actor (single flight,
// chunk_flights.h); provisional entries from its own cache, reusable at once; its
// prompt's whole prefix blocks (automatic prefix caching); and the passages it learnt.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "actors/runtime/actors.h"
#include "actors/runtime/decode_steps.h"

namespace bs {

// The KV of a chunk (or an exact prefix) computed alone, on the compute thread, with
// due decode steps between its layers (a long document must not stall the
// streams). Tensor parallel: on every rank (rank 0 gets the whole chunk); a
// failure stops the other ranks too.
std::shared_ptr<const ChunkKv> compute_alone(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher,
                                             const std::vector<int32_t>& tokens, bool prefix);

// Queues the background computes of the parts a prefill had to compute (missed,
// or failed when loaded: the plan after a fallback marks them computed): each
// alone, to the write-back actor. Every mode stores what it computed: a `full`
// request warms the cache for the blend requests after it. Single flight (chunk_flights.h): a chunk whose compute another
// request queued already joins it; a provisional entry stored meanwhile is no reason
// to skip (the compute replaces it).
void queue_write_back(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher, const RequestPlan& plan);

// Reusable at once (chunk_flights.h): each chunk this prefill had to compute, not
// stored yet, is put in RAM from the request's own cache as a provisional entry
// (BlendEngine::chunk_in_context: its rows in context, K rotated back to positions
// 0..m-1), before the first token goes out, so a request that comes after this
// one's answer finds it even if the chunk's compute alone is still queued; that
// compute replaces it. Not passages to learn: a paragraph's chunk tokens end with
// "\n\n" as one token, which the message holds as other tokens before the next
// paragraph, so its rows are not the chunk's (its compute alone stores it). RAM only,
// and only where the cache is host memory holding every head (not a device cache: a
// device-to-host copy on this thread; not a tensor-parallel rank's). A memcpy and a rotation of K per layer:
// SmolLM2, 1,800 tokens of documents, ~40 MB.
void store_provisional_chunks(const WorkerEnv& env, const RequestPlan& plan, const KvCache& cache);

// Automatic prefix caching: stores the whole `block`-token blocks of `tokens` (the
// first tokens of a request's cache whose KV equals a full prefill's; every one of
// them written there by a step that has ended) from block `first` on that are not
// stored yet, each an entry of its own under its chained key (plan.h), so the next
// prompt that begins with them loads them; and, where `tail_end` (the prompt's
// RequestPlan::prefix_end; 0: none) is not a multiple of block, the partial block of
// tokens [tail_end - tail_end % block, tail_end), which the same prompt again finds.
// The rows are copied from the request's own cache here, on the worker's thread,
// before anything else is decided: a memcpy per head and layer (SmolLM2, 16 tokens:
// 0.4 MB), and the next request's plan finds them (a device cache: copied by a
// background job, below).
// Tensor parallel, where rank 0's cache holds only its KV heads: the tokens are
// computed alone on every rank in the compute thread's background (exact at position
// 0, where a prefix always is) and cut into blocks; a job its bounded queue refuses is
// counted and not stored. The deepest block is stored first: a tier's LRU then evicts
// a prompt's later blocks before the earlier ones every later block needs.
void store_prefix_blocks(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher,
                         std::vector<int32_t> tokens, int64_t block, int64_t first, int64_t tail_end,
                         const DecodeSlotPtr& slot);

}  // namespace bs
