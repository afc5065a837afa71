// Waits (bounded) for a count that another actor publishes after the event a test
// observes: a request's on_done runs in the actor that ended it, and its slot and
// KV pages go back a message later, in the intake (which owns them). So "in flight
// is 0 again" is waited for, at most `seconds`, never assumed at on_done.
#pragma once

#include <chrono>
#include <thread>

namespace bs::testing {

template <class Pred>
bool settles(Pred ok, double seconds = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!ok()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace bs::testing
