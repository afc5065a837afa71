// blendctl cluster up|status|down (tools/cluster/cluster_ctl.h): members as processes of
// this host, their pid files and logs under the cluster's data dir.
#include "tools/cluster/cluster_ctl.h"
#include "tools/cli/child_process.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/config/cluster_config.h"
#include "http/cluster_tls.h"
#include "storage/tls.h"
#include "tools/cli/process_report.h"
#include "tools/cli/progress.h"
#include "tools/cli/tcp_probe.h"

namespace bs::tools {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// The config as members are started with it (and as their command lines show it).
std::string canonical_config(const std::string& path) { return fs::weakly_canonical(fs::absolute(path)).string(); }

// --data-dir, then the config (ConfigError on a mistake).
ClusterConfig load(const ClusterCtlOptions& opt) {
  if (!opt.data_dir.empty()) ::setenv("BLENDSERVE_DATA_DIR", fs::absolute(opt.data_dir).c_str(), 1);
  ClusterConfig c = load_cluster_config(opt.config);
  if (!opt.data_dir.empty() && !c.configured_data_dir.empty())
    throw ConfigError("--data-dir " + opt.data_dir + ": " + opt.config + " sets cluster.data_dir (" +
                      c.configured_data_dir + "), which the members would use instead");
  return c;
}

// Stages of `up` (down runs them backwards): storage, workers, frontend.
std::vector<std::vector<const ClusterNode*>> start_stages(const ClusterConfig& c) {
  std::vector<std::vector<const ClusterNode*>> stages;
  if (const auto s = c.storage_nodes(); !s.empty()) stages.push_back(s);
  stages.push_back(c.workers());
  stages.push_back({&c.frontend()});
  return stages;
}

std::optional<pid_t> read_pid_file(const std::string& path) {
  std::ifstream in(path);
  long long pid = 0;
  if (!(in >> pid) || pid <= 1) return std::nullopt;
  return static_cast<pid_t>(pid);
}

void write_pid_file(const std::string& path, pid_t pid) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << pid << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
  }
  fs::rename(tmp, path);
}

// A process that exists and is not a zombie (a zombie has exited; its parent has
// not collected it yet).
bool running(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // "pid (comm) S ...": comm may hold spaces and ')'
  if (paren == std::string::npos || paren + 2 >= text.size()) return false;  // gone meanwhile
  return text[paren + 2] != 'Z';
}

// Whether `pid` is this member: running, and its command line has `--config
// <config>` and `--node <node>` (a pid reused by another process has not).
bool is_member(pid_t pid, const std::string& config, const std::string& node) {
  if (!running(pid)) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  bool has_config = false, has_node = false;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--config" && args[i + 1] == config) has_config = true;
    if (args[i] == "--node" && args[i + 1] == node) has_node = true;
  }
  return has_config && has_node;
}

// Where a probe connects: a wildcard listener is reached on loopback.
std::string probe_host(const std::string& host) {
  if (host == "0.0.0.0") return "127.0.0.1";
  if (host == "::" || host == "[::]") return "::1";
  return host;
}


// A member is ready: storage when its data_port accepts a connection, the others
// when GET /health on their http_port answers 200 (a worker of a TLS cluster over
// HTTPS, presenting the frontend's certificate: the one its workers accept).
bool ready(const ClusterConfig& c, const ClusterNode& n, double timeout_s) {
  const std::string host = probe_host(n.host);
  if (n.role == NodeRole::Storage) return tcp_accepts(host, n.data_port, timeout_s);
  const tls::Files tls = n.role == NodeRole::Worker ? c.member_tls(c.frontend().name) : tls::Files{};
  const auto cli = http::make_member_client(host, n.http_port, tls, n.name);
  const auto usec = static_cast<time_t>(timeout_s * 1e6);
  cli->set_connection_timeout(usec / 1000000, usec % 1000000);
  cli->set_read_timeout(usec / 1000000, usec % 1000000);
  const auto r = cli->Get("/health");
  return r && r->status == 200;
}

// `blendserve --config <config> --node <name>` in a session of its own, stdout and
// stderr to its log, stdin from /dev/null. Returns the child's pid.
pid_t spawn_member(const std::string& blendserve, const std::string& config, const ClusterNode& n,
                   const std::string& log) {
  ChildOptions child;
  child.die_with_parent = false;  // a member outlives `cluster up`: `cluster down` stops it
  return spawn_child({blendserve, "--config", config, "--node", n.name}, log, child);
}

// blendserve beside this blendctl.
std::string blendserve_binary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find blendctl's own path: " + ec.message());
  return (self.parent_path() / "blendserve").string();
}

struct Started {
  const ClusterNode* node;
  pid_t pid;
  bool exited = false;
};

// up's clean-up: SIGTERM to every member it started, SIGKILL to those still there
// after timeout_s; each collected (they are blendctl's children) and its pid file removed.
void stop_started(const ClusterConfig& c, std::vector<Started>& started, double timeout_s) {
  for (auto& s : started)
    if (!s.exited) ::kill(s.pid, SIGTERM);
  const auto t0 = Clock::now();
  for (bool waiting = true; waiting;) {
    waiting = false;
    for (auto& s : started) {
      if (s.exited) continue;
      if (::waitpid(s.pid, nullptr, WNOHANG) == s.pid) {
        s.exited = true;
        std::fprintf(stderr, "blendctl: stopped %s (pid %d)\n", s.node->name.c_str(), static_cast<int>(s.pid));
      } else {
        waiting = true;
      }
    }
    if (!waiting) break;
    if (seconds_since(t0) > timeout_s) {
      for (auto& s : started) {
        if (s.exited) continue;
        std::fprintf(stderr, "blendctl: %s (pid %d) still runs after %.0f s: SIGKILL\n", s.node->name.c_str(),
                     static_cast<int>(s.pid), timeout_s);
        ::kill(s.pid, SIGKILL);
        ::waitpid(s.pid, nullptr, 0);
        s.exited = true;
      }
      break;
    }
    sleep_ms(50);
  }
  for (auto& s : started) fs::remove(c.pid_path(s.node->name));
}

// cluster_init's work: the CA and the members' files made where missing, checked
// where present; a line per member into `report`. False (the reason on stderr) when
// a file is wrong or cannot be made.
bool ensure_certificates(const ClusterConfig& c, std::vector<nlohmann::json>* report) {
  if (!c.tls) return true;
  try {
    fs::create_directories(c.tls_dir);
    fs::permissions(c.tls_dir, fs::perms::owner_all, fs::perm_options::replace);
    const bool have_ca = fs::exists(c.ca_cert_path());
    if (have_ca != fs::exists(c.ca_key_path())) {
      std::fprintf(stderr, "blendctl: %s: the CA's certificate and key must both be there or both be gone (%s, %s)\n",
                   c.tls_dir.c_str(), c.ca_cert_path().c_str(), c.ca_key_path().c_str());
      return false;
    }
    if (!have_ca) {
      tls::make_ca(c.name + " cluster CA", c.ca_cert_path(), c.ca_key_path());
      std::fprintf(stderr, "blendctl: made the CA of cluster %s: %s\n", c.name.c_str(), c.ca_cert_path().c_str());
    }
    for (const ClusterNode& n : c.nodes) {
      const tls::Files f = c.member_tls(n.name);
      bool made = false;
      if (!have_ca || !fs::exists(f.cert) || !fs::exists(f.key)) {
        tls::issue_member(c.ca_cert_path(), c.ca_key_path(), n.name, {n.host}, f.cert, f.key);
        made = true;
      } else {
        try {
          tls::check_files(f);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "blendctl: %s: %s (delete %s and %s to have them made again)\n", n.name.c_str(),
                       e.what(), f.cert.c_str(), f.key.c_str());
          return false;
        }
      }
      if (report) report->push_back({{"name", n.name}, {"cert", f.cert}, {"key", f.key}, {"made", made}});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blendctl: cluster %s: the TLS files: %s\n", c.name.c_str(), e.what());
    return false;
  }
  return true;
}

int init(const ClusterConfig& c) {
  if (!c.tls) {
    std::fprintf(stderr, "blendctl: cluster %s: cluster.tls.mode is plaintext: no certificates to make\n",
                 c.name.c_str());
    return 0;
  }
  std::vector<nlohmann::json> report;
  if (!ensure_certificates(c, &report)) return 1;
  for (const auto& line : report) std::cout << line.dump() << "\n";
  return 0;
}

int up(const ClusterConfig& c, const ClusterCtlOptions& opt) {
  const std::string config = canonical_config(opt.config);
  // Members of this cluster already running: refuse; stale pid files: remove.
  std::string running_members;
  for (const ClusterNode& n : c.nodes) {
    const std::string pid_file = c.pid_path(n.name);
    const auto pid = read_pid_file(pid_file);
    if (!fs::exists(pid_file)) continue;
    if (pid && is_member(*pid, config, n.name)) {
      running_members += (running_members.empty() ? "" : ", ") + n.name + " (pid " + std::to_string(*pid) + ")";
    } else {
      std::fprintf(stderr, "blendctl: removed the stale pid file %s\n", pid_file.c_str());
      fs::remove(pid_file);
    }
  }
  if (!running_members.empty()) {
    std::fprintf(stderr,
                 "blendctl: cluster %s: members are running already: %s; run `blendctl cluster down %s` first\n",
                 c.name.c_str(), running_members.c_str(), opt.config.c_str());
    return 1;
  }
  if (!ensure_certificates(c, nullptr)) return 1;
  const std::string blendserve = blendserve_binary();
  fs::create_directories(fs::path(c.log_path("x")).parent_path());
  fs::create_directories(fs::path(c.pid_path("x")).parent_path());

  std::vector<Started> started;
  try {
    for (const auto& stage : start_stages(c)) {
      const size_t first = started.size();
      for (const ClusterNode* n : stage) {
        const pid_t pid = spawn_member(blendserve, config, *n, c.log_path(n->name));
        started.push_back({n, pid});
        write_pid_file(c.pid_path(n->name), pid);
        std::fprintf(stderr, "blendctl: cluster %s: started %s (%s, pid %d), log %s\n", c.name.c_str(),
                     n->name.c_str(), role_name(n->role), static_cast<int>(pid), c.log_path(n->name).c_str());
      }
      // Every member of the stage ready, or the first failure.
      const auto t0 = Clock::now();
      std::vector<bool> is_ready(started.size() - first, false);
      for (size_t waiting = is_ready.size(); waiting > 0;) {
        for (size_t i = 0; i < is_ready.size(); ++i) {
          if (is_ready[i]) continue;
          Started& s = started[first + i];
          int status = 0;
          std::string failure;
          if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
            s.exited = true;
            failure = describe_status(status) + " before it was ready";
          } else if (ready(c, *s.node, 1.0)) {
            is_ready[i] = true;
            --waiting;
            std::fprintf(stderr, "blendctl: cluster %s: %s ready after %.1f s\n", c.name.c_str(),
                         s.node->name.c_str(), seconds_since(t0));
            continue;
          } else if (seconds_since(t0) > c.startup_timeout_s) {
            failure = "was not ready within " + std::to_string(static_cast<int>(c.startup_timeout_s)) +
                      " s (cluster.startup_timeout)";
          } else {
            continue;
          }
          const std::string log = c.log_path(s.node->name);
          std::fprintf(stderr, "blendctl: cluster up failed: %s (%s, pid %d) %s; the end of %s:\n%s",
                       s.node->name.c_str(), role_name(s.node->role), static_cast<int>(s.pid), failure.c_str(),
                       log.c_str(), log_tail(log, 20).c_str());
          stop_started(c, started, opt.timeout_s);
          return 1;
        }
        if (waiting > 0) sleep_ms(200);
      }
    }
  } catch (...) {
    stop_started(c, started, opt.timeout_s);
    throw;
  }
  for (const Started& s : started) {
    const nlohmann::json line{{"name", s.node->name},
                              {"role", role_name(s.node->role)},
                              {"pid", s.pid},
                              {"ready", true},
                              {"log", c.log_path(s.node->name)}};
    std::printf("%s\n", line.dump().c_str());
  }
  return 0;
}

int status(const ClusterConfig& c, const ClusterCtlOptions& opt) {
  const std::string config = canonical_config(opt.config);
  bool all = true;
  for (const ClusterNode& n : c.nodes) {
    const auto pid = read_pid_file(c.pid_path(n.name));
    const bool alive = pid && is_member(*pid, config, n.name);
    const bool up = alive && ready(c, n, 1.0);
    all = all && up;
    nlohmann::json line{{"name", n.name}, {"role", role_name(n.role)}, {"pid", nullptr},
                        {"alive", alive},  {"ready", up},             {"log", c.log_path(n.name)}};
    if (pid) line["pid"] = *pid;
    std::printf("%s\n", line.dump().c_str());
  }
  return all ? 0 : 1;
}

int down(const ClusterConfig& c, const ClusterCtlOptions& opt) {
  const std::string config = canonical_config(opt.config);
  auto stages = start_stages(c);
  bool all_stopped = true;
  for (auto stage = stages.rbegin(); stage != stages.rend(); ++stage) {
    struct Target {
      const ClusterNode* node;
      pid_t pid;
      std::string stopped;  // how; empty while it runs
    };
    std::vector<Target> targets;
    for (const ClusterNode* n : *stage) {
      const std::string pid_file = c.pid_path(n->name);
      if (!fs::exists(pid_file)) continue;
      const auto pid = read_pid_file(pid_file);
      Target t{n, pid.value_or(0), ""};
      if (!pid || !running(*pid)) {
        t.stopped = "not running";
      } else if (!is_member(*pid, config, n->name)) {
        t.stopped = "not ours";  // the pid now belongs to another process: never signalled
        std::fprintf(stderr, "blendctl: %s's pid file names pid %d, which is another process now: left alone\n",
                     n->name.c_str(), static_cast<int>(*pid));
      } else {
        std::fprintf(stderr, "blendctl: cluster %s: SIGTERM to %s (pid %d)\n", c.name.c_str(), n->name.c_str(),
                     static_cast<int>(*pid));
        ::kill(*pid, SIGTERM);
      }
      targets.push_back(t);
    }
    const auto t0 = Clock::now();
    bool killed = false;
    for (;;) {
      bool waiting = false;
      for (Target& t : targets)
        if (t.stopped.empty() && !running(t.pid)) t.stopped = killed ? "SIGKILL" : "SIGTERM";
        else if (t.stopped.empty()) waiting = true;
      if (!waiting) break;
      if (!killed && seconds_since(t0) > opt.timeout_s) {
        for (Target& t : targets)
          if (t.stopped.empty() && is_member(t.pid, config, t.node->name)) {
            std::fprintf(stderr, "blendctl: %s (pid %d) still runs after %.0f s: SIGKILL\n", t.node->name.c_str(),
                         static_cast<int>(t.pid), opt.timeout_s);
            ::kill(t.pid, SIGKILL);
          }
        killed = true;
      } else if (killed && seconds_since(t0) > opt.timeout_s + 10) {
        break;  // outlived SIGKILL (e.g. in uninterruptible I/O): its pid file stays
      }
      sleep_ms(50);
    }
    for (const Target& t : targets) {
      const bool gone = !t.stopped.empty();
      if (gone) fs::remove(c.pid_path(t.node->name));
      else all_stopped = false;
      const nlohmann::json line{{"name", t.node->name}, {"role", role_name(t.node->role)}, {"pid", t.pid},
                                {"stopped", gone ? t.stopped : "still running"}};
      std::printf("%s\n", line.dump().c_str());
    }
  }
  return all_stopped ? 0 : 1;
}

template <class F>
int with_config(const ClusterCtlOptions& opt, F run) {
  // A member that drops a TLS probe is a failed write, not blendctl's death.
  std::signal(SIGPIPE, SIG_IGN);
  ClusterConfig c;
  try {
    c = load(opt);
  } catch (const ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return run(c);
}

}  // namespace

ClusterConfig load_cluster_for_ctl(const ClusterCtlOptions& opt) { return load(opt); }
bool ensure_cluster_certificates(const ClusterConfig& c) { return !c.tls || ensure_certificates(c, nullptr); }
bool member_ready(const ClusterConfig& c, const ClusterNode& n, double timeout_s) { return ready(c, n, timeout_s); }

int cluster_init(const ClusterCtlOptions& opt) {
  return with_config(opt, [&](const ClusterConfig& c) { return init(c); });
}
int cluster_up(const ClusterCtlOptions& opt) {
  return with_config(opt, [&](const ClusterConfig& c) { return up(c, opt); });
}
int cluster_status(const ClusterCtlOptions& opt) {
  return with_config(opt, [&](const ClusterConfig& c) { return status(c, opt); });
}
int cluster_down(const ClusterCtlOptions& opt) {
  return with_config(opt, [&](const ClusterConfig& c) { return down(c, opt); });
}

}  // namespace bs::tools
