// What the cluster-command suites share (test_cli_cluster*.cpp): running blendserve and
// blendctl as processes, and the ClusterCli fixture (a fresh directory, the cluster
// file it writes, the members it starts and stops, their ports).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/config/cluster_secret.h"
#include "actors/cluster/control_wire.h"
#include "storage/framed_link.h"
#include "tests/console_fixture.h"
#include "tests/model_fixture.h"
#include "http/cluster_tls.h"
#include "storage/tls.h"
#include "tests/process_fixture.h"
#include "tests/tls_fixture.h"

namespace bs::cli_cluster_test {


namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

inline const std::string kBin = BLENDSERVE_BINARY_DIR;
inline const std::string kSecret = "0123456789abcdef0123";

inline std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

// A chat completion over `documents` (greedy, a few tokens).
inline nlohmann::json rag_request(const std::string& model, const std::vector<std::string>& documents) {
  return {{"model", model},
          {"messages", {{{"role", "user"}, {"content", "Who wrote the report?"}}}},
          {"documents", documents},
          {"max_tokens", 6},
          {"temperature", 0}};
}

// A command's exit code and its stdout (stderr apart, in `err`).
struct Result {
  int code = -1;
  std::string out, err;
};
inline Result run(const std::string& args, const fs::path& dir) {
  const fs::path err_file = dir / "stderr.txt";
  const auto r = bs::testing::run_command(kBin + "/" + args + " 2>" + err_file.string());
  std::ifstream in(err_file);
  std::stringstream err;
  err << in.rdbuf();
  return {r.code, r.out, err.str()};
}

// Alive: there and not a zombie. Members that `cluster up` started in their own
// session are reparented; a zombie left until its new parent reaps it has stopped.
inline bool process_exists(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// A fresh directory per test, removed after it.
class ClusterCli : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_MODEL();
    // A worker that refuses a TLS client closes on it: a failed write here, not a death.
    std::signal(SIGPIPE, SIG_IGN);
    dir_ = fs::temp_directory_path() / ("bs_cli_cluster_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    dir_ = fs::canonical(dir_);  // as blendctl records the config: no symlinks
  }
  void TearDown() override {
    for (pid_t pid : children_) {  // whatever a failed test left running
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    // Members a failed test's `cluster up` started (its pid files; a frozen one is
    // continued first so that SIGTERM reaches it, `down` SIGKILLs the late).
    if (fs::exists(dir_ / "cluster.yaml") && fs::exists(data() / "pids")) {
      for (const auto& f : fs::directory_iterator(data() / "pids")) {
        pid_t pid = 0;
        if (std::ifstream(f.path()) >> pid; pid > 0) ::kill(pid, SIGCONT);
      }
      run("blendctl cluster down --timeout 10 " + (dir_ / "cluster.yaml").string(), dir_);
    }
    fs::remove_all(dir_);
  }

  // A cluster config in the test's directory: a frontend, the workers (each `extra`
  // its own keys, e.g. a model path) and, with `storage`, a storage node; free
  // loopback ports. Returns its path.
  fs::path write_config(const std::vector<std::string>& worker_extra, bool storage = false,
                        const std::string& frontend_extra = "", const std::string& cluster_extra = "") {
    std::ostringstream y;
    y << "cluster: {name: t, secret: " << kSecret << ", data_dir: " << (dir_ / "data").string()
      << ", startup_timeout: 120s" << cluster_extra << "}\n"
      << "defaults:\n"
      << "  model: {path: " << bs::testing::model_path() << "}\n"
      << "  device: {threads: 1}\n"
      << "  limits: {max_requests: 2, max_queue: 2}\n"
      << "  tiers: {ram: {budget: 64MiB}, ssd: {budget: 64MiB}}\n"
      // The ratio stays the floor on every worker: the controller otherwise picks the
      // ratio and the selection rule from each worker's measured load and compute
      // speeds (from the slower remote tier it may send the default query-first
      // request the deviation's way), and two workers' texts, or one's a request
      // later, would differ by the rule, not by the stored KV these tests compare.
      << "  blend: {adaptive_ratio: false}\n"
      << "nodes:\n"
      << "  - {name: frontend, role: frontend, host: 127.0.0.1, port: " << port() << ", http_port: "
      << (http_ports_["frontend"] = port()) << frontend_extra << "}\n";
    for (size_t i = 0; i < worker_extra.size(); ++i) {
      const int http = port();
      http_ports_["worker-" + std::to_string(i + 1)] = http;
      const int control = port();
      control_ports_["worker-" + std::to_string(i + 1)] = control;
      y << "  - {name: worker-" << i + 1 << ", role: worker, host: 127.0.0.1, port: " << control
        << ", http_port: " << http << worker_extra[i] << "}\n";
    }
    if (storage)
      y << "  - {name: storage, role: storage, host: 127.0.0.1, port: " << port()
        << ", data_port: " << (storage_data_port_ = port()) << "}\n";
    const fs::path path = dir_ / "cluster.yaml";
    std::ofstream(path) << y.str();
    return path;
  }
  fs::path data() const { return dir_ / "data" / "t"; }

  // `blendserve --config F --node NAME` in a session of its own (as `blendctl cluster
  // up` starts it), its output in the log `up` would use, its pid in the pid file.
  pid_t start_member(const fs::path& config, const std::string& node) {
    fs::create_directories(data() / "logs");
    fs::create_directories(data() / "pids");
    const std::string log = (data() / "logs" / (node + ".log")).string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setsid();
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      const std::string bin = kBin + "/blendserve";
      ::execl(bin.c_str(), bin.c_str(), "--config", config.c_str(), "--node", node.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    children_.push_back(pid);
    std::ofstream(data() / "pids" / (node + ".pid")) << pid << "\n";
    return pid;
  }
  // The frontend's TLS files, once the cluster has them (a worker of a TLS cluster
  // answers only the frontend's certificate); none before, or in plaintext.
  bs::tls::Files frontend_tls() const {
    const fs::path t = data() / "tls";
    if (!fs::exists(t / "frontend.pem")) return {};
    return {(t / "ca.pem").string(), (t / "frontend.pem").string(), (t / "frontend.key").string()};
  }
  // A client to a node's HTTP port as the frontend would call it: a worker over
  // HTTPS with the frontend's certificate (when the cluster has TLS files), the
  // frontend's own users' endpoint over plain HTTP.
  std::unique_ptr<httplib::Client> client_of(const std::string& node) {
    auto c = bs::http::make_member_client("127.0.0.1", http_ports_[node],
                                          node.rfind("worker", 0) == 0 ? frontend_tls() : bs::tls::Files{});
    c->set_read_timeout(120, 0);
    return c;
  }
  // Waits for GET /health on a node (a test failure after 120 s or if `pid` exits).
  bool wait_healthy(const std::string& node, pid_t pid) {
    const auto c = client_of(node);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto r = c->Get("/health"); r && r->status == 200) return true;
      if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        forget(pid);
        ADD_FAILURE() << "the member exited";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "no /health within 120 s";
    return false;
  }
  // Collects a child; its exit status, or -1 if it did not end within `seconds`.
  int reap(pid_t pid, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        forget(pid);
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  void forget(pid_t pid) { std::erase(children_, pid); }
  std::string log_of(const std::string& node) const {
    std::ifstream in(data() / "logs" / (node + ".log"));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  int port() {
    int p = 0;
    do p = bs::testing::free_port();
    while (std::find(used_.begin(), used_.end(), p) != used_.end());
    used_.push_back(p);
    return p;
  }

  fs::path dir_;
  std::map<std::string, int> http_ports_, control_ports_;
  int storage_data_port_ = 0;
  std::vector<pid_t> children_;
  std::vector<int> used_;
};

}  // namespace bs::cli_cluster_test
