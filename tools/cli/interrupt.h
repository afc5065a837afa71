// Ctrl-C and SIGTERM for the benchmarks that run for minutes and may own a child
// process (bench serve --spawn, bench control): the first signal only asks the run
// to stop (stop_requested(); the run prints what it measured and its owners stop
// their children), a second one SIGKILLs the registered child and exits at once
// with 128 + the signal. While a guard lives SIGPIPE is ignored: a server that went
// away is an error of that call, not the death of the benchmark.
#pragma once

#include <sys/types.h>

#include <signal.h>

#include <stdexcept>

namespace bs::tools {

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

bool stop_requested();
void throw_if_stop_requested();  // Interrupted
void clear_stop_request();       // a new run in the same process
// The child a second signal kills (0: none).
void set_interrupt_child(pid_t pid);

// Installs the handlers for its lifetime, restoring the previous ones after.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {}, old_pipe_ {};
};

}  // namespace bs::tools
