// What the tensor-parallel leader (rank 0's layer worker) tells the other ranks,
// as values (docs: actors/runtime/tp_ranks.h).
//
// RankJob: one compute job, sent by rank 0's compute thread to every follower's
// rank worker when the job starts there, so every rank runs the same jobs in the
// same order (one sender, one mailbox: CAF keeps the order). It has an inspect
// overload and messages.h registers it, like the plans it carries.
//
// RankKv: one layer of a request's stored KV for one follower rank, its KV heads
// only, sent by a loader to that rank's worker, which copies it into the rank's
// cache (the loader never writes a follower's memory). A value with an inspect
// overload, registered like RankJob.
//
// RankDecision: inside a job, each choice rank 0 makes from its own clock or from
// what it was told (the next layer is delivered, a decode step is due, the request
// was cancelled), broadcast through the communicator before it acts on it; the
// followers only execute the decisions they receive. No CAF here.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/runtime/plan.h"

namespace bs {

struct RankJob {
  enum Kind : int32_t {
    Prefill = 0,  // step request `id`'s prefill while rank 0 decides Step (begins it the first time)
    Decode = 1,   // one batched decode step of `ids` with `tokens`
    Chunk = 2,    // compute the KV of `tokens` alone (write-back, a stored document)
    End = 3,      // request `id` ended: its cache goes back to the rank's pool
  };
  int32_t kind = Prefill;
  uint64_t id = 0;
  RequestPlan plan;              // Prefill: the prompt, what is loaded, the options (read when it begins)
  bool restart = false;          // Prefill: begin again from `plan` (a stored entry failed: its part computed)
  std::vector<uint64_t> ids;     // Decode: the requests of the batch
  std::vector<int32_t> tokens;   // Decode: each request's token; Chunk: the chunk
  bool prefix = false;           // Chunk: an exact prefix (BlendEngine::compute_prefix_kv)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankJob& x) {
  return f(x.kind, x.id, x.plan, x.restart, x.ids, x.tokens, x.prefix);
}

struct RankKvPart {
  int64_t offset = 0;         // the part's first row in the request's cache
  int64_t length = 0;         // its rows (tokens)
  int32_t dtype = 0;          // kernels::TensorType of k and v (as stored)
  std::vector<char> k, v;     // [rank's kv_heads, length, head_dim] each, as stored (K unrotated)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankKvPart& x) {
  return f(x.offset, x.length, x.dtype, x.k, x.v);
}

struct RankKv {
  uint64_t id = 0;      // the request
  int32_t layer = 0;
  uint64_t loader = 0;  // the loader's actor id (the gate counts each loader's delivery per rank)
  std::vector<RankKvPart> parts;  // this loader's parts of the layer, all of them
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankKv& x) {
  return f(x.id, x.layer, x.loader, x.parts);
}

struct RankDecision {
  enum Kind : int32_t {
    Step = 0,      // compute the prefill's next layer
    Stop = 1,      // the prefill job ends here (a layer not delivered yet, a cancel, a failure)
    Finish = 2,    // the prefill's last layer is done: its logits and fused cache
    Continue = 3,  // between two layers: no decode step now
    Decode = 4,    // between two layers: one decode step of `ids` with `tokens`
  };
  int32_t kind = Continue;
  std::vector<uint64_t> ids;
  std::vector<int32_t> tokens;
};

}  // namespace bs
