// The decode steps of the layer worker's compute jobs (actors/runtime/layer_worker.cpp):
// a drain job steps every stream waiting in the worker's batcher at once (continuous
// batching, decode_batcher.h), and a long compute (a prefill, a chunk computed alone)
// runs a due step between its layers, so streams slow down instead of freezing. Both
// run on the compute thread; the logits go to the decoder by message.
#pragma once

#include <chrono>
#include <memory>

#include "actors/runtime/actors.h"
#include "actors/runtime/decode_batcher.h"

namespace bs {

// The worker's decode batcher (WorkerState::batcher): its compute jobs hold a
// reference, so one that runs after the worker died still finds it.
using BatcherPtr = std::shared_ptr<DecodeBatcher>;

// limits.decode_interleave as a clock duration (capped at a day: "never").
std::chrono::steady_clock::duration interleave_interval(const WorkerEnv& env);

// The compute job behind decode_atom: one batched step of the waiting requests.
void drain_decode(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher);

// Between the layers of a long compute on the compute thread: one decode step
// when one is due (a waiting stream's last step began decode_interleave ago).
// Nothing of the interrupted compute is live in the Transformer's scratch buffers
// here (they are only used inside one Transformer call), and the step touches
// only the decoding requests' own caches.
//
// Tensor parallel: the followers wait between the same two layers for rank 0's
// decision, so exactly one is announced here, a step or none.
// Returns the step's seconds (0: none was due).
double interleave_decode(const WorkerEnv& env, const HandlesRef& h, DecodeBatcher& batcher);

}  // namespace bs
