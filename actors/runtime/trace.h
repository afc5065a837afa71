// A request's timeline: what each actor did for it and when (seconds since the
// request was submitted), and the facts each stage reports about it (the
// controller's decision, the prefill's stats, the decode's batching). An
// append-only log, like a logger: the actors that work on a request add to it by
// request id through the runtime's TraceBook; the decoder closes it when the
// request ends and hands the JSON to the inspector. Thread-safe. Plain C++ (no CAF).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace bs {

struct TraceEvent {
  std::string actor, what;
  int layer = -1;
  double begin = 0, end = 0;
  int64_t bytes = 0;
};

class RequestTrace {
 public:
  using clock = std::chrono::steady_clock;
  RequestTrace(uint64_t id, clock::time_point submitted) : id_(id), submitted_(submitted) {}

  uint64_t id() const { return id_; }
  clock::time_point submitted() const { return submitted_; }
  double seconds_since_submit(clock::time_point t) const {
    return std::chrono::duration<double>(t - submitted_).count();
  }
  double now_s() const { return seconds_since_submit(clock::now()); }

  // Bounded: past kMaxEvents an event is only counted ("events_dropped").
  static constexpr size_t kMaxEvents = 8192;
  void add_event(TraceEvent e);
  std::vector<TraceEvent> events() const;
  // A top-level field of the trace JSON (the last value set wins).
  void set(const std::string& key, nlohmann::json value);
  // The fields so far, without the events: what a live view of a request in flight
  // reads (phase, layer, tokens, the controller's decision).
  nlohmann::json fields() const;
  // The timeline as JSON: the fields, then "events".
  std::string json() const;

 private:
  const uint64_t id_;
  const clock::time_point submitted_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  int64_t events_dropped_ = 0;
  nlohmann::json fields_ = nlohmann::json::object();
};
using TracePtr = std::shared_ptr<RequestTrace>;

// The traces of the requests in flight, by id (thread-safe).
class TraceBook {
 public:
  TracePtr open(uint64_t id, RequestTrace::clock::time_point submitted);
  // The request's trace, or a detached one (its events go nowhere) when it was
  // closed already: callers never check.
  TracePtr find(uint64_t id) const;
  // Removes it; null if it was not open.
  TracePtr close(uint64_t id);

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, TracePtr> open_;
};

}  // namespace bs
