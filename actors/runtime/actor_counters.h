// What an actor (or a compute thread) reports about itself for the inspector:
// counters it updates while it handles messages, read from other threads at any
// time. Self-reported because CAF 0.17 has no safe view of another actor's
// mailbox: the depth is what the actor saw when it took its last message. One
// RAII guard per handled message records the message, the busy time and that
// depth; `busy_since_ns` lets a reader count the message still being handled, so
// an actor stuck in one long message shows busy, not idle. Plain C++ (no CAF).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "actors/runtime/inspection_cost.h"

namespace bs {

// Nanoseconds on the steady clock: the one time base of every counter here.
inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ActorCounters {
  std::string name;  // unique in the runtime: "loader-ssd-0", "rank-worker-2", "compute-thread-rank-1"
  std::string kind;  // what it is: "loader", "rank-worker", "compute-thread", "intake", ...
  int rank = 0;      // the tensor-parallel rank whose work it does (0: rank 0's, and every non-rank actor)
  std::atomic<int64_t> messages{0};       // messages (jobs, for a compute thread) handled
  std::atomic<int64_t> busy_ns{0};        // time spent handling them, finished ones
  std::atomic<int64_t> busy_since_ns{0};  // when the message being handled began; 0: idle
  std::atomic<int64_t> mailbox{0};        // messages waiting, as seen when it took the last one
  std::atomic<int64_t> restarts{0};       // times the supervisor started this actor again after it died

  // Busy time up to `now_ns`, the message in hand included.
  int64_t busy_ns_at(int64_t now_ns) const {
    const int64_t since = busy_since_ns.load(std::memory_order_acquire);
    return busy_ns.load(std::memory_order_acquire) + (since > 0 && now_ns > since ? now_ns - since : 0);
  }
  bool busy() const { return busy_since_ns.load(std::memory_order_relaxed) != 0; }

  // Why it last died or failed (empty: never), and when (steady ns).
  void set_error(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = std::move(what);
    last_error_ns_ = steady_now_ns();
  }
  std::pair<std::string, int64_t> last_error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {last_error_, last_error_ns_};
  }

 private:
  mutable std::mutex mu_;
  std::string last_error_;
  int64_t last_error_ns_ = 0;
};
using CountersPtr = std::shared_ptr<ActorCounters>;

class BusyScope {
 public:
  BusyScope(ActorCounters& c, size_t mailbox) : c_(c), t0_(steady_now_ns()) {
    InspectionCostScope cost;
    c_.messages.fetch_add(1, std::memory_order_relaxed);
    c_.mailbox.store(static_cast<int64_t>(mailbox), std::memory_order_relaxed);
    c_.busy_since_ns.store(t0_, std::memory_order_release);
  }
  ~BusyScope() {
    InspectionCostScope cost;
    // Added before `busy_since_ns` clears: a reader in between counts the message
    // twice (the share is clamped), never not at all.
    c_.busy_ns.fetch_add(steady_now_ns() - t0_, std::memory_order_release);
    c_.busy_since_ns.store(0, std::memory_order_release);
  }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  ActorCounters& c_;
  int64_t t0_;
};

// What a runtime name says about its actor: "loader-ram-0" is a loader,
// "rank-worker-2" a rank worker of rank 2, "compute-thread-rank-1" the compute
// thread of rank 1.
inline CountersPtr make_counters(std::string name) {
  auto c = std::make_shared<ActorCounters>();
  auto strip_number = [](const std::string& s, int& number) {
    const auto dash = s.rfind('-');
    if (dash == std::string::npos || dash + 1 == s.size() ||
        s.find_first_not_of("0123456789", dash + 1) != std::string::npos)
      return s;
    number = std::stoi(s.substr(dash + 1));
    return s.substr(0, dash);
  };
  int number = 0;
  if (name.rfind("loader-", 0) == 0) {
    c->kind = "loader";
  } else if (name.rfind("compute-thread-rank-", 0) == 0) {
    c->kind = "compute-thread";
    strip_number(name, c->rank);
  } else if (name.rfind("rank-worker-", 0) == 0) {
    c->kind = "rank-worker";
    strip_number(name, c->rank);
  } else if (name.size() > 7 && name.compare(name.size() - 7, 7, "-writer") == 0) {
    c->kind = "writer";
  } else {
    c->kind = strip_number(name, number);
  }
  c->name = std::move(name);
  return c;
}

}  // namespace bs
