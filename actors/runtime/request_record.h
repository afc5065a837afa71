// A request at the front end — the Runtime (submit, cancel, a failure the
// supervisor reports), the intake (admission) and the decoder (the answer): what
// the caller asked and how to answer it. The back end (controller, loaders, layer
// worker) never sees a record: it works from the RequestPlan values the intake
// sends on. Shared by the front end's actors by request id through the
// RequestBook; each field says who writes it. Plain C++ (no CAF).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "actors/runtime/request.h"
#include "actors/runtime/trace.h"

namespace bs {

struct RequestRecord {
  uint64_t id = 0;
  std::chrono::steady_clock::time_point submitted;
  RuntimeRequest request;      // as submitted; nobody writes it after submit
  RequestCallbacks callbacks;  // the caller's, wrapped (StreamDelivery): called by whoever streams or finishes the request
  TracePtr trace;
  // Holds one of the max_requests slots and its KV pages, in the intake's ledger: the
  // intake sets it when it admits the request; whoever ends the request clears it
  // (exchange: once) and sends the intake the release. A restarted intake rebuilds its
  // ledger from the records still admitted.
  std::atomic<bool> admitted{false};
  std::atomic<int64_t> kv_pages{0};  // the KV pool pages promised to it (set by the intake with `admitted`)
  // Cancelled by the caller (Runtime::cancel), shutdown or an expiry: written by the intake
  // only (the others send it cancel_atom), before it tells the worker; read by the
  // decoder (it ends the request at its next message) and inspection. A caller that
  // stops reading (on_text false) is the decoder's own business: it ends the request
  // itself and writes nothing here.
  std::atomic<bool> cancelled{false};
  // Ran past limits.max_request_seconds (set by the intake with `cancelled`): it ends
  // as the error `expiry_error`, not as cancelled. The intake writes expiry_error
  // once, before it sets `expired`; others read it only after they saw `expired`.
  std::atomic<bool> expired{false};
  std::string expiry_error;
  // Set by whoever finishes the request (the decoder, or the runtime when an actor
  // that held it died): on_done runs exactly once.
  std::atomic<bool> finished{false};
};
using RecordPtr = std::shared_ptr<RequestRecord>;

// The records of the requests submitted and not yet finished (thread-safe).
class RequestBook {
 public:
  void put(RecordPtr r) {
    std::lock_guard<std::mutex> lock(mu_);
    records_[r->id] = std::move(r);
  }
  RecordPtr find(uint64_t id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : it->second;
  }
  void erase(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    records_.erase(id);
  }
  std::vector<RecordPtr> all() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<RecordPtr> out;
    for (const auto& [id, r] : records_) out.push_back(r);
    return out;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return records_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, RecordPtr> records_;
};

}  // namespace bs
