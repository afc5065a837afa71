// How often a supervised role may die before the supervisor gives up on it:
// Erlang/OTP's restart intensity (at most max_restarts restarts within a sliding
// window of window_s seconds) plus a backoff. Without a limit, an actor that dies
// on every message (a broken disk under a loader, a poisoned device) is restarted
// for ever and every request that reaches it fails one by one while the process
// looks alive; with it, the role is failed loudly and /health says so, so an
// orchestrator replaces the process. The backoff (from the second death within the
// window: backoff_s, doubling per death, at most backoff_max_s) is what the runtime
// pauses admission for (actors/runtime/runtime.cpp: the successor itself starts at once, so
// no message meant for the role lands on a dead handle meanwhile). Plain C++: the
// supervisor owns one per role name and is the only one to touch it.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>

namespace bs {

struct RestartLimits {
  int max_restarts = 5;        // restarts allowed within the window (0: the first death fails the role)
  double window_s = 60;        // the sliding window, seconds
  double backoff_s = 0.1;      // the pause after the second death within the window
  double backoff_max_s = 10;   // the pause at most
};

struct RestartDecision {
  bool restart = true;     // false: the role is failed for good
  double backoff_s = 0;    // seconds new work waits before it is admitted (0: none)
  int deaths_in_window = 0;  // this death included
};

class RestartIntensity {
 public:
  explicit RestartIntensity(RestartLimits limits) : limits_(limits) {}

  // A death at `now_s` (seconds on a monotonic clock, not decreasing between calls).
  RestartDecision on_death(double now_s) {
    deaths_.push_back(now_s);
    while (!deaths_.empty() && deaths_.front() <= now_s - limits_.window_s) deaths_.pop_front();
    RestartDecision d;
    d.deaths_in_window = static_cast<int>(deaths_.size());
    d.restart = d.deaths_in_window <= limits_.max_restarts;
    if (d.deaths_in_window >= 2)
      d.backoff_s = std::min(limits_.backoff_max_s, limits_.backoff_s * std::ldexp(1.0, std::min(d.deaths_in_window - 2, 60)));
    return d;
  }

 private:
  RestartLimits limits_;
  std::deque<double> deaths_;  // within the window, oldest first (at most max_restarts + 1 kept)
};

}  // namespace bs
