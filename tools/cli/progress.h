// Progress of a long-running command on stderr: "label: done/total, elapsed, ETA", and
// the seconds since a start that commands and benchmarks time their steps with.
// Results go to stdout as JSON lines; this never touches stdout.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace bs::tools {

// Seconds of the steady clock since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class Progress {
 public:
  Progress(std::string label, int total) : label_(std::move(label)), total_(total), t0_(clock::now()) {}
  void tick(int n = 1) {
    done_ += n;
    const double elapsed = std::chrono::duration<double>(clock::now() - t0_).count();
    const int worked = done_ - resumed_;
    const double eta = worked > 0 ? elapsed / worked * (total_ - done_) : 0.0;
    std::fprintf(stderr, "%s: %d/%d, %.0f s elapsed, ETA %.0f s\n", label_.c_str(), done_, total_, elapsed, eta);
  }
  // Units done by an earlier run (read back, not worked now): counted as done, left out
  // of the rate the ETA is estimated from.
  void resumed(int n) {
    resumed_ += n;
    done_ += n;
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string label_;
  int total_, done_ = 0, resumed_ = 0;
  clock::time_point t0_;
};

}  // namespace bs::tools
