// Counting what an actor does, for the inspector: one RAII guard per handled
// message records the message, the busy time and the mailbox depth it saw.
#pragma once

#include <chrono>

#include "actors/messages.h"

namespace bs {

class BusyScope {
 public:
  BusyScope(ActorCounters& c, size_t mailbox) : c_(c), t0_(std::chrono::steady_clock::now()) {
    c_.messages.fetch_add(1, std::memory_order_relaxed);
    c_.mailbox.store(static_cast<int64_t>(mailbox), std::memory_order_relaxed);
  }
  ~BusyScope() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_);
    c_.busy_ns.fetch_add(ns.count(), std::memory_order_relaxed);
  }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  ActorCounters& c_;
  std::chrono::steady_clock::time_point t0_;
};

inline CountersPtr make_counters(std::string name) {
  auto c = std::make_shared<ActorCounters>();
  c->name = std::move(name);
  return c;
}

}  // namespace bs
