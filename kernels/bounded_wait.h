// A host wait for a device that can be given up: polls `done` until it says yes or
// `limit` has passed. A device backend's waits (a copy, a step's logits, a loader's
// stream drain) go through it instead of the driver's blocking call, so a hung GPU
// fails the request with a sentence instead of holding a thread forever (every wait
// has a timeout). Plain C++: the CUDA backend passes a query (cudaStreamQuery,
// cudaEventQuery); the test passes a counter.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace bs::kernels {

// True once `done()` returned true; false when `limit` passed first (`done` was asked
// once more at the end, so a wait that completes at the limit still counts). Spins for
// the first `spin` — a decode step's wait then returns microseconds after the device
// finished, as the driver's spinning wait does — then sleeps in steps growing from
// 50 us to 1 ms, so a long wait costs no core. `done` may throw (a device error).
template <typename Done>
bool wait_bounded(Done&& done, std::chrono::nanoseconds limit,
                  std::chrono::nanoseconds spin = std::chrono::milliseconds(2)) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto spin_until = start + std::min(spin, limit);
  const auto deadline = start + limit;
  while (clock::now() < spin_until)
    if (done()) return true;
  auto nap = std::chrono::microseconds(50);
  while (clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
  return done();
}

}  // namespace bs::kernels
