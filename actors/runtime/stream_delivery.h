// Per-stream delivery of a request's callbacks. The decoder steps every stream and
// hands out their text; if it called each caller's on_text itself, one caller whose
// on_text is slow (or never returns) would stall every other stream and, at shutdown,
// the runtime. So Runtime::submit wraps the caller's callbacks: on_text and on_done
// only queue what they carry (never block), and a pool of delivery threads runs the
// caller's callbacks, one stream at a time on one thread, in order (all text, then
// on_done). The pool has a thread per stream that may run at once (limits.max_requests
// plus the queue's), so a stuck callback holds only its own stream.
//
// Bounds: a stream whose caller falls behind by more than `max_pending_bytes` of text
// is cancelled (its on_text then answers false to the decoder) and its on_done says
// why; shutdown() waits for the streams to drain until its deadline and then leaves
// stuck callbacks behind (their threads detached), so a stuck caller cannot hold the
// runtime's shutdown.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "actors/runtime/request.h"

namespace bs {

class StreamDelivery {
 public:
  // threads: streams whose callbacks may run at once (>= 1).
  StreamDelivery(int threads, size_t max_pending_bytes);
  ~StreamDelivery();  // shutdown(0 s)
  StreamDelivery(const StreamDelivery&) = delete;
  StreamDelivery& operator=(const StreamDelivery&) = delete;

  // The callbacks the runtime calls in place of `caller`'s (an empty one stays empty).
  RequestCallbacks wrap(RequestCallbacks caller);

  // Waits up to `deadline` for every queued callback to run; returns the streams
  // whose callbacks are still running or queued then (their threads are detached).
  size_t shutdown(std::chrono::steady_clock::duration deadline);

  int64_t overflowed() const;  // streams cancelled because their caller fell behind

  // Defined in the .cpp (the delivery threads' shared state and its parts).
  struct Item;
  struct Stream;
  struct State;

 private:
  struct Thread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> exited;  // it left its loop (joinable without waiting)
  };
  std::shared_ptr<State> state_;
  std::vector<Thread> threads_;
};

}  // namespace bs
