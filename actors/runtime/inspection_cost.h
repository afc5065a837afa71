// What the inspection data costs to collect: the time spent in the collection itself
// (an actor's per-message counters, a request's trace events and fields), summed over
// every thread, so `blendctl bench decode --inspection-cost` can state the overhead
// with nobody watching as a fraction of the run (issue 22's <= 2%) instead of as the
// difference of two noisy runs. Off by default: then the collection pays one relaxed
// load per call for it. When on, each collecting call times itself (two clock reads,
// which the sum includes, so it errs high). Plain C++ (no CAF).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace bs {

struct InspectionCost {
  static inline std::atomic<bool> measuring{false};
  static inline std::atomic<int64_t> ns{0};     // time inside collecting calls, all threads
  static inline std::atomic<int64_t> calls{0};  // collecting calls timed

  static void reset() {
    ns.store(0);
    calls.store(0);
  }
};

// Times the enclosing scope into InspectionCost while measuring is on.
class InspectionCostScope {
 public:
  InspectionCostScope() : on_(InspectionCost::measuring.load(std::memory_order_relaxed)) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~InspectionCostScope() {
    if (!on_) return;
    InspectionCost::ns.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count(),
        std::memory_order_relaxed);
    InspectionCost::calls.fetch_add(1, std::memory_order_relaxed);
  }
  InspectionCostScope(const InspectionCostScope&) = delete;
  InspectionCostScope& operator=(const InspectionCostScope&) = delete;

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace bs
