#include "tools/bench/spawned_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tools/bench/serve_client.h"
#include "tools/cli/child_process.h"
#include "tools/cli/interrupt.h"
#include "tools/cli/progress.h"
#include "tools/cli/tcp_probe.h"

namespace bs::tools::serve {
namespace {

namespace fs = std::filesystem;


}  // namespace

SpawnedServer::SpawnedServer(const std::string& config, double timeout_s, const std::string& api_key) {
  const std::string bin = self_dir() + "/blendserve";
  if (access(bin.c_str(), X_OK) != 0) throw std::runtime_error("--spawn: no executable " + bin);
  char tmpl[] = "/tmp/blendserve-bench-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  dir_ = tmpl;
  try {
    start(bin, config, timeout_s, api_key);
  } catch (...) {  // no destructor after a throwing constructor: clean up here
    stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

SpawnedServer::~SpawnedServer() {
  stop();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void SpawnedServer::start(const std::string& bin, const std::string& config, double timeout_s, const std::string& api_key) {
  log_ = dir_ + "/server.log";
  port_ = free_loopback_port();
  url_ = "http://127.0.0.1:" + std::to_string(port_);

  std::vector<std::string> args{bin};
  if (!config.empty()) args.insert(args.end(), {"--config", config});  // a global option of blendserve
  args.insert(args.end(), {"serve", "--port", std::to_string(port_)});
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "BLENDSERVE_DATA_DIR=", 20) != 0) env.emplace_back(*e);
  env.push_back("BLENDSERVE_DATA_DIR=" + dir_ + "/data");
  std::string cmdline;
  for (auto& a : args) cmdline += (cmdline.empty() ? "" : " ") + a;
  std::fprintf(stderr, "bench serve: starting %s (BLENDSERVE_DATA_DIR=%s/data, log %s)\n", cmdline.c_str(),
               dir_.c_str(), log_.c_str());
  ChildOptions child;
  child.env = &env;
  pid_ = spawn_child(args, log_, child);
  set_interrupt_child(pid_);
  wait_healthy(timeout_s, api_key);
}

void SpawnedServer::stop() {
  if (pid_ <= 0) return;
  stop_child_saying(pid_, 15, "bench serve: server");
  pid_ = 0;
  set_interrupt_child(0);
}

std::string SpawnedServer::log_tail() const {
  std::ifstream in(log_);
  std::vector<std::string> lines;
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  std::string out;
  for (size_t i = lines.size() > 15 ? lines.size() - 15 : 0; i < lines.size(); ++i) out += "\n  | " + lines[i];
  return out.empty() ? " (empty log)" : out;
}

void SpawnedServer::wait_healthy(double timeout_s, const std::string& api_key) {
  const auto t0 = Clock::now();
  const Endpoint ep{url_, api_key, 2};
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      set_interrupt_child(0);
      const std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                                : "was killed by signal " + std::to_string(WTERMSIG(status));
      throw std::runtime_error("--spawn: blendserve " + how + " before answering /health; its log:" + log_tail());
    }
    {
      auto c = make_client(ep, 2);
      c->set_connection_timeout(1);
      if (auto r = c->Get("/health"); r && r->status == 200) {
        std::fprintf(stderr, "bench serve: server healthy after %.1f s\n", seconds_since(t0));
        return;
      }
    }
    if (stop_requested()) throw Interrupted();
    if (seconds_since(t0) > timeout_s) {
      stop();
      throw std::runtime_error("--spawn: blendserve did not answer GET /health within " +
                               std::to_string(static_cast<int>(timeout_s)) + " s; its log:" + log_tail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace bs::tools::serve
