// Starting and stopping the blendserve processes the tools run (blendctl cluster up, bench
// serve, bench control): one way to fork/exec a child with its output in a log file, and
// one way to stop it. Why one place: each of the three had its own copy, and the rules
// they must share (stdin from /dev/null, no inherited descriptors, the child killed if
// the tool dies unless it is meant to outlive it, SIGKILL after a deadline) drifted.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace bs::tools {

struct ChildOptions {
  // The child's environment ("NAME=value" each); nullptr: this process's.
  const std::vector<std::string>* env = nullptr;
  // Whether the child gets SIGTERM when this process dies (PR_SET_PDEATHSIG; a bench's
  // server never outlives the bench). Off for what must outlive the tool (cluster
  // members started by `cluster up`), which go into a session of their own instead.
  bool die_with_parent = true;
};

// args[0] (a path) run with args as its argv: stdin from /dev/null, stdout and stderr
// to `log` (created or truncated), no other descriptor of this process inherited. A
// child that cannot exec writes why into its log and exits 127. Returns its pid;
// std::runtime_error if the log cannot be written or fork fails.
pid_t spawn_child(const std::vector<std::string>& args, const std::string& log, const ChildOptions& options = {});

// SIGTERM to `pid` (a child of this process), SIGKILL if it has not exited after
// timeout_s, then reaped. Returns its waitpid status; whether it had to be killed in
// *killed (when given).
int stop_child(pid_t pid, double timeout_s, bool* killed = nullptr);
// stop_child, saying on stderr "<who> did not exit <timeout_s> s after SIGTERM; killed
// it" when it had to be killed.
int stop_child_saying(pid_t pid, double timeout_s, const std::string& who);

// The directory of this executable (/proc/self/exe), where the tools find the
// blendserve binary built beside them. std::runtime_error if it cannot be read.
std::string self_dir();

}  // namespace bs::tools
