#include "tools/cli/child_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

namespace bs::tools {

pid_t spawn_child(const std::vector<std::string>& args, const std::string& log, const ChildOptions& options) {
  if (args.empty()) throw std::invalid_argument("spawn_child: no program");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> arg_copy = args, env_copy = options.env ? *options.env : std::vector<std::string>{};
  std::vector<char*> argv, envp;
  for (auto& a : arg_copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot write " + log + ": " + std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered here is written twice
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(log_fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    if (options.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);  // the parent died before the line above
    } else {
      ::setsid();
    }
    const int null_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::close_range(3, ~0U, 0);
    if (options.env) ::execve(argv[0], argv.data(), envp.data());
    else ::execv(argv[0], argv.data());
    ::dprintf(2, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(log_fd);
  return pid;
}

int stop_child(pid_t pid, double timeout_s, bool* killed) {
  if (killed) *killed = false;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      if (killed) *killed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

int stop_child_saying(pid_t pid, double timeout_s, const std::string& who) {
  bool killed = false;
  const int status = stop_child(pid, timeout_s, &killed);
  if (killed) std::fprintf(stderr, "%s did not exit %g s after SIGTERM; killed it\n", who.c_str(), timeout_s);
  return status;
}

std::string self_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot resolve /proc/self/exe: " + ec.message());
  return exe.parent_path().string();
}

}  // namespace bs::tools
