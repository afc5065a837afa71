// Continuous batching of decode steps. A request that wants its next token waits
// here (the layer worker adds it when its decode message arrives); one compute job
// takes up to `max_batch` waiting requests into one Transformer::decode_step, so N
// streams cost about one step each round instead of N. Requests join and leave
// between steps.
//
// Why the job waits a little before it takes (gather): after a step, the decoder
// samples each request in turn and sends it back; the first one back would
// otherwise start a step of one while the rest arrive a moment later, and the
// streams would split into alternating small batches. So the job waits until every
// request of the previous steps, and every one whose prefill just ended (expect()), is
// back or finished (the decoder reports a finish, forget()), at most `gather` — a
// bound, not the usual wait (tens of microseconds).
//
// Plain C++ (no CAF): the worker's handler adds and forgets, the compute thread
// takes (in its own job, or inline between the layers of a long prefill:
// take_now). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <memory>

#include "kernels/sampling.h"
#include "model/kv_cache.h"

namespace bs {

// One decoding request's state in the layer worker: its cache (the prefill's,
// then one row per step). Owned by the worker; a batch on the compute thread
// holds a reference while it steps, so a request that ends meanwhile does not
// free the cache under it.
struct DecodeSlot {
  uint64_t id = 0;
  KvCache cache;
  std::atomic<bool> cancelled{false};  // set by the worker; the next batch skips the compute
  // Automatic prefix caching: the tokens at the cache's positions when its KV is what a
  // full prefill of them gives (a prompt without blended chunks, then every token a
  // step appends: the worker's, which stores their blocks when the request ends);
  // empty otherwise.
  std::vector<int32_t> exact_tokens;
  int64_t prompt_tokens = 0;  // how many of them the prompt was (its blocks are stored at the first token)
};
using DecodeSlotPtr = std::shared_ptr<DecodeSlot>;

class DecodeBatcher {
 public:
  using clock = std::chrono::steady_clock;
  struct Entry {
    DecodeSlotPtr slot;
    int32_t token = -1;        // the token to append to the request's cache
    kernels::SampleRow next;   // how to pick the one after it, where the backend picks
    // When the request's last step began (when it was added, before its first step):
    // what due() measures the wait from.
    std::chrono::steady_clock::time_point since{};
  };

  // A request's next step. True when the caller must submit a drain job (none is
  // queued); that job calls take().
  bool add(DecodeSlotPtr slot, int32_t token, const kernels::SampleRow& next = {});
  // For the drain job: waits (at most `gather`) for the requests still out with the
  // decoder, then takes up to max_batch entries, oldest first. `more` is set when
  // entries are left: the job is still due, and the caller submits it again.
  std::vector<Entry> take(int max_batch, clock::duration gather, bool& more);
  // Inline (between prefill layers): up to max_batch entries, no waiting; the
  // queued drain job stays queued.
  std::vector<Entry> take_now(int max_batch);
  // Every entry, and no drain job counts as queued any more: for when the compute
  // thread refused the job (shutdown).
  std::vector<Entry> take_all();
  // Whether a step is due (inline between prefill layers, or ahead of the next
  // prefill): a waiting request's last step began at least `interval` ago (or, before
  // its first step, it was added that long ago).
  bool due(clock::duration interval) const;
  // The request's prefill ended and its first token is with the decoder: a drain's
  // gather waits for it to come back as for a request back from a step (so streams
  // prefilled back to back take their first step together), until it does or is
  // forgotten.
  void expect(uint64_t id);
  // The request finished (or will never come back): no gather waits for it.
  void forget(uint64_t id);
  // Marks the start of a step of these requests (for due()).
  void step_began(const std::vector<uint64_t>& ids);
  size_t pending() const;

 private:
  std::vector<Entry> pop(int max_batch);  // mu_ held

  mutable std::mutex mu_;
  std::condition_variable arrived_;
  std::deque<Entry> pending_;
  std::unordered_set<uint64_t> out_;  // taken into a step, not yet back or finished
  bool job_queued_ = false;
  std::unordered_map<uint64_t, clock::time_point> stepped_;  // per request: when its last step began
};

}  // namespace bs
