#include "tools/cli/interrupt.h"

#include <unistd.h>

#include <atomic>

namespace bs::tools {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<pid_t> g_child{0};

void on_signal(int sig) {
  if (g_stop.exchange(true)) {  // second signal: stop now
    const pid_t c = g_child.load();
    if (c > 0) ::kill(c, SIGKILL);
    ::_exit(128 + sig);
  }
}

}  // namespace

bool stop_requested() { return g_stop.load(); }
void throw_if_stop_requested() {
  if (g_stop.load()) throw Interrupted();
}
void clear_stop_request() { g_stop = false; }
void set_interrupt_child(pid_t pid) { g_child = pid; }

InterruptGuard::InterruptGuard() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &old_pipe_);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGPIPE, &old_pipe_, nullptr);
}

}  // namespace bs::tools
