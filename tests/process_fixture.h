// Real processes for the tests that run the binaries as people do: a shell
// command's output and exit code, a free loopback port, and `blendserve serve`
// as a child process that is up (its /health answers) or a test failure.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace bs::testing {

struct CommandResult {
  int code = -1;    // exit code; -1 if it did not exit normally
  std::string out;  // what the command wrote to stdout (add 2>&1 for stderr too)
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A loopback port nothing listens on now (-1 if none could be had).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// `blendserve --config <config> serve --port <port>` as a child process, its
// stdout and stderr in `log`, its data in `data_dir` (empty: the environment's);
// the constructor returns once /health answers 200 (else a test failure within
// 120 s, with the log), the destructor kills it.
class ServeProcess {
 public:
  ServeProcess(const std::filesystem::path& config, int port, const std::filesystem::path& log,
               const std::filesystem::path& data_dir = {})
      : log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      if (!data_dir.empty()) ::setenv("BLENDSERVE_DATA_DIR", data_dir.c_str(), 1);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      const std::string bin = std::string(BLENDSERVE_BINARY_DIR) + "/blendserve";
      const std::string port_arg = std::to_string(port);
      ::execl(bin.c_str(), bin.c_str(), "--config", config.c_str(), "serve", "--port", port_arg.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    httplib::Client c("127.0.0.1", port);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto r = c.Get("/health"); r && r->status == 200) return;
      if (::waitpid(pid_, nullptr, WNOHANG) != 0) {
        pid_ = -1;
        ADD_FAILURE() << "blendserve exited: " << log_text();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "blendserve did not answer /health on port " << port << " within 120 s: " << log_text();
  }
  ~ServeProcess() { kill(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  bool up() const { return pid_ > 0; }
  // SIGKILL and reap (idempotent).
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string log_text() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

}  // namespace bs::testing
