// The cluster commands as people run them, with real processes on loopback and the
// real model: `blendserve check-config`, `blendserve --config F --node NAME`, and
// `blendctl cluster up|status|down`; the whole cluster up (storage node, workers,
// frontend), routing, a worker killed, and the storage node's faults (frozen by
// SIGSTOP, killed, a worker with a wrong secret). `up` is also tested where it must
// fail (a worker that cannot load its model: the others it started are stopped),
// and `status`/`down` on a worker started by hand with its pid file where `up`
// writes it (the file layout is the documented contract), beside a pid file that
// names a stranger process and one that names a dead pid.
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

namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kBin = BLENDSERVE_BINARY_DIR;
const std::string kSecret = "0123456789abcdef0123";

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

// A chat completion over `documents` (greedy, a few tokens).
nlohmann::json rag_request(const std::string& model, const std::vector<std::string>& documents) {
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
Result run(const std::string& args, const fs::path& dir) {
  const fs::path err_file = dir / "stderr.txt";
  const auto r = bs::testing::run_command(kBin + "/" + args + " 2>" + err_file.string());
  std::ifstream in(err_file);
  std::stringstream err;
  err << in.rdbuf();
  return {r.code, r.out, err.str()};
}

// Alive: there and not a zombie. Members that `cluster up` started in their own
// session are reparented; a zombie left until its new parent reaps it has stopped.
bool process_exists(pid_t pid) {
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

TEST_F(ClusterCli, CheckConfigValidatesWithoutAModel) {
  const fs::path good = write_config({"", ""});
  Result r = run("blendserve check-config " + good.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0]["name"], "frontend");
  EXPECT_EQ(lines[0]["role"], "frontend");
  EXPECT_EQ(lines[1]["name"], "worker-1");
  EXPECT_EQ(lines[1]["http_port"], http_ports_["worker-1"]);
  EXPECT_EQ(lines[1]["data_dir"], (data() / "worker-1").string());
  EXPECT_TRUE(lines[1].contains("port"));
  EXPECT_FALSE(fs::exists(data())) << "check-config creates nothing";

  // A mistake: exit 2, the key and its line on stderr, nothing on stdout.
  std::string text;
  {
    std::ifstream in(good);
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  const size_t at = text.find("role: worker");
  std::ofstream(dir_ / "bad.yaml") << text.substr(0, at) + "role: wroker" + text.substr(at + 12);
  r = run("blendserve check-config " + (dir_ / "bad.yaml").string(), dir_);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
  EXPECT_THAT(r.err, AllOf(HasSubstr("bad.yaml: nodes[1].role: unknown role 'wroker' (frontend, worker, storage)"),
                           HasSubstr("(line " + std::to_string(line) + ", column")));

  // A plain runtime config is checked as one; its mistakes too.
  std::ofstream(dir_ / "single.yaml") << "server: {port: 8123}\n";
  r = run("blendserve check-config " + (dir_ / "single.yaml").string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(json_lines(r.out).size(), 1u);
  EXPECT_EQ(json_lines(r.out)[0]["http_port"], 8123);
  EXPECT_EQ(json_lines(r.out)[0]["role"], "single");
  std::ofstream(dir_ / "single.yaml") << "server:\n  port: 0\n";
  r = run("blendserve check-config " + (dir_ / "single.yaml").string(), dir_);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("server.port: must be in 1..65535, got 0 (line 2, column 9)"));

  // The shipped example, its secret from the environment.
  const std::string example = std::string(BLENDSERVE_FIXTURES) + "/../../configs/cluster.example.yaml";
  const auto set = bs::testing::run_command("env BLENDSERVE_CLUSTER_SECRET=" + kSecret + " " + kBin +
                                            "/blendserve check-config " + example + " 2>&1");
  EXPECT_EQ(set.code, 0) << set.out;
  EXPECT_EQ(json_lines(set.out).size(), 4u) << set.out;
  const auto unset = bs::testing::run_command("env -u BLENDSERVE_CLUSTER_SECRET " + kBin +
                                              "/blendserve check-config " + example + " 2>&1");
  EXPECT_EQ(unset.code, 2);
  EXPECT_THAT(unset.out, AllOf(HasSubstr("cluster.secret: the environment variable BLENDSERVE_CLUSTER_SECRET"),
                               HasSubstr("is not set")));
}

TEST_F(ClusterCli, AWorkerMemberServesAndStopsOnSigterm) {
  const fs::path config = write_config({""});
  ASSERT_EQ(run("blendctl cluster init " + config.string(), dir_).code, 0);
  const pid_t pid = start_member(config, "worker-1");
  ASSERT_TRUE(wait_healthy("worker-1", pid)) << log_of("worker-1");
  EXPECT_THAT(log_of("worker-1"), HasSubstr("serving on https://"));
  // Its endpoint is HTTPS and answers only the frontend's certificate: plain HTTP, a
  // certificate of another CA, or another member's get nothing.
  {
    httplib::Client plain("127.0.0.1", http_ports_["worker-1"]);
    plain.set_read_timeout(5, 0);
    EXPECT_FALSE(plain.Get("/health"));
    const fs::path other = dir_ / "other-ca";
    fs::create_directories(other);
    bs::tls::make_ca("other", (other / "ca.pem").string(), (other / "ca.key").string());
    bs::tls::issue_member((other / "ca.pem").string(), (other / "ca.key").string(), "frontend", {"127.0.0.1"},
                          (other / "frontend.pem").string(), (other / "frontend.key").string());
    const bs::tls::Files ours = frontend_tls();
    // Trusting our CA (so the worker's certificate passes) but presenting the other CA's.
    const auto stranger = bs::http::make_member_client(
        "127.0.0.1", http_ports_["worker-1"],
        {ours.ca, (other / "frontend.pem").string(), (other / "frontend.key").string()});
    stranger->set_read_timeout(5, 0);
    EXPECT_FALSE(stranger->Get("/health"));
    const fs::path t = data() / "tls";
    const auto storage_cert = bs::http::make_member_client(
        "127.0.0.1", http_ports_["worker-1"], {ours.ca, (t / "worker-1.pem").string(), (t / "worker-1.key").string()});
    storage_cert->set_read_timeout(5, 0);
    EXPECT_FALSE(storage_cert->Get("/health")) << "a member that is not the frontend";

    // The control port likewise (storage/framed_link.h under TLS): the frontend's
    // certificate gets the report; another CA's, another member's or plaintext nothing.
    auto ask = [&](const bs::tls::Files& files, std::string* why) {
      bs::FramedClientOptions o;
      o.host = "127.0.0.1";
      o.port = control_ports_["worker-1"];
      o.tls = files;
      o.peer_name = "worker-1";
      bs::FramedClient link(o);
      bs::ControlRequest req;
      req.from = "frontend";
      req.to = "worker-1";
      req.unix_ms = bs::unix_ms_now();
      req.proof = bs::control_proof(kSecret, req.from, req.to, req.unix_ms);
      const auto reply = link.call(bs::encode_control_request(req), 5, 5, why);
      return reply ? bs::decode_report_reply(*reply, why) : std::nullopt;
    };
    std::string why;
    const auto report = ask(ours, &why);
    ASSERT_TRUE(report) << why;
    EXPECT_EQ(report->node, "worker-1");
    EXPECT_TRUE(report->holdings.full);
    // Trusting both CAs (so only the worker's refusal ends the handshake).
    const fs::path both = other / "both-cas.pem";
    std::ofstream(both) << std::ifstream(ours.ca).rdbuf() << std::ifstream(other / "ca.pem").rdbuf();
    EXPECT_FALSE(ask({both.string(), (other / "frontend.pem").string(), (other / "frontend.key").string()}, &why));
    // TLS 1.3: the worker checks the client's certificate after the client's side of the
    // handshake; its refusal arrives as an alert where the reply should be.
    EXPECT_THAT(why, HasSubstr("alert unknown ca")) << "another CA's frontend";
    EXPECT_FALSE(ask({ours.ca, (t / "worker-1.pem").string(), (t / "worker-1.key").string()}, &why));
    EXPECT_FALSE(ask({}, &why)) << "plaintext";
    EXPECT_THAT(log_of("worker-1"), HasSubstr("refused"));
  }
  const auto client = client_of("worker-1");
  httplib::Client& c = *client;
  // A worker answers only whoever presents the key derived from the cluster secret.
  const auto refused = c.Get("/v1/models");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  c.set_bearer_token_auth(bs::worker_api_key(kSecret));
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = nlohmann::json::parse(models->body)["data"][0]["id"];
  // One byte of the worker's answer flipped on the way (a loopback proxy between
  // the frontend's client and the worker): the TLS record's MAC fails, the client
  // gets an error, never a changed answer.
  {
    auto via = [&](int port) {
      auto v = bs::http::make_member_client("127.0.0.1", port, frontend_tls());
      v->set_bearer_token_auth(bs::worker_api_key(kSecret));
      v->set_read_timeout(10, 0);
      return v;
    };
    int64_t answer_bytes = 0;
    {
      bs::testing::FlippingProxy clean(http_ports_["worker-1"], int64_t{1} << 40);  // flips nothing
      const auto client = via(clean.port());
      const auto a = client->Get("/v1/models");
      ASSERT_TRUE(a && a->status == 200);
      EXPECT_EQ(a->body, models->body);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the proxy's relay done
      answer_bytes = clean.bytes_from_server();
    }
    ASSERT_GT(answer_bytes, 100);
    // 60 bytes from the end: inside the answer's body record (after it the worker
    // sends only its 24-byte close_notify: the client asked for Connection: close).
    bs::testing::FlippingProxy flipping(http_ports_["worker-1"], answer_bytes - 60);
    const auto flipped = via(flipping.port())->Get("/v1/models");
    EXPECT_TRUE(flipping.flipped());
    EXPECT_FALSE(flipped) << "a flipped byte came through: " << (flipped ? flipped->body : "");
  }
  const nlohmann::json req{{"model", model},
                           {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
                           {"documents", {"Paris is the capital of France."}},
                           {"max_tokens", 4},
                           {"temperature", 0}};
  const auto r = c.Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(r) << log_of("worker-1");
  ASSERT_EQ(r->status, 200) << r->body;
  const auto body = nlohmann::json::parse(r->body);
  EXPECT_FALSE(body["choices"][0]["message"]["content"].get<std::string>().empty());
  EXPECT_GT(body["usage"]["completion_tokens"].get<int>(), 0);
  // Its data dir is the member's.
  EXPECT_TRUE(fs::exists(data() / "worker-1")) << log_of("worker-1");

  ::kill(pid, SIGTERM);
  const int status = reap(pid, 60);
  ASSERT_NE(status, -1) << "still running 60 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log_of("worker-1");
  EXPECT_THAT(log_of("worker-1"), HasSubstr("blendserve: stopped"));
}

TEST_F(ClusterCli, AnUnknownNodeExits2NamingTheNodes) {
  const fs::path config = write_config({"", ""});
  const Result r = run("blendserve --config " + config.string() + " --node nope", dir_);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--node nope: no such node in " + config.string() +
                               " (nodes: frontend, worker-1, worker-2)"));
  // --node without --config, and a cluster config given to serve.
  EXPECT_EQ(run("blendserve --node worker-1", dir_).code, 2);
  const Result serve = run("blendserve --config " + config.string() + " serve", dir_);
  EXPECT_EQ(serve.code, 2);
  EXPECT_THAT(serve.err, HasSubstr("is a cluster config: start one of its members with --node NAME"));
}

TEST_F(ClusterCli, UpStopsWhatItStartedWhenAMemberFails) {
  // worker-2 cannot listen on its HTTP port (another program holds it): up fails at
  // the workers' stage, names worker-2 with its log, stops worker-1 and never starts
  // the frontend. (A worker with another model is refused before anything starts: a
  // cluster runs one model.)
  const fs::path config = write_config({"", ""});
  const int busy = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(busy, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(http_ports_["worker-2"]));
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(busy, reinterpret_cast<sockaddr*>(&at), sizeof at), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(busy, 1), 0);
  const std::string busy_port = std::to_string(http_ports_["worker-2"]);
  const Result r = run("blendctl cluster up " + config.string(), dir_);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, AllOf(HasSubstr("cluster up failed: worker-2 (worker, pid"), HasSubstr("before it was ready"),
                           HasSubstr("cannot listen on 127.0.0.1:" + busy_port), HasSubstr("stopped worker-1"),
                           Not(HasSubstr("started frontend"))));
  // Every member it started is gone, and no pid file is left.
  std::vector<pid_t> pids;
  std::istringstream err(r.err);
  for (std::string line; std::getline(err, line);)
    if (const size_t at = line.find(", pid "); at != std::string::npos && line.find("started") != std::string::npos)
      pids.push_back(std::stoi(line.substr(at + 6)));
  EXPECT_EQ(pids.size(), 2u) << r.err;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid)) << pid;
  EXPECT_TRUE(fs::is_empty(data() / "pids"));
  EXPECT_THAT(log_of("worker-2"), HasSubstr("cannot listen on 127.0.0.1:" + busy_port));
  ::close(busy);

  // status: nothing runs.
  const Result s = run("blendctl cluster status " + config.string(), dir_);
  EXPECT_EQ(s.code, 1);
  for (const auto& line : json_lines(s.out)) EXPECT_FALSE(line["alive"].get<bool>()) << line;
}

TEST_F(ClusterCli, StatusAndDownFollowThePidFiles) {
  const fs::path config = write_config({""}, /*storage=*/true);
  ASSERT_EQ(run("blendctl cluster init " + config.string(), dir_).code, 0);
  const pid_t worker = start_member(config, "worker-1");
  ASSERT_TRUE(wait_healthy("worker-1", worker)) << log_of("worker-1");
  // The frontend's pid file names a stranger (a pid reused by another program), the
  // storage node's a pid that is gone.
  const pid_t stranger = ::fork();
  if (stranger == 0) {
    ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  children_.push_back(stranger);
  std::ofstream(data() / "pids" / "frontend.pid") << stranger << "\n";
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  std::ofstream(data() / "pids" / "storage.pid") << dead << "\n";

  Result r = run("blendctl cluster status " + config.string(), dir_);
  EXPECT_EQ(r.code, 1) << r.err;
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& line : json_lines(r.out)) by_name[line["name"]] = line;
  ASSERT_EQ(by_name.size(), 3u) << r.out;
  EXPECT_EQ(by_name["worker-1"]["pid"], worker);
  EXPECT_TRUE(by_name["worker-1"]["alive"].get<bool>());
  EXPECT_TRUE(by_name["worker-1"]["ready"].get<bool>());
  EXPECT_FALSE(by_name["frontend"]["alive"].get<bool>());  // the stranger is not the frontend
  EXPECT_FALSE(by_name["storage"]["alive"].get<bool>());
  EXPECT_EQ(by_name["storage"]["log"], (data() / "logs" / "storage.log").string());

  // up refuses while a member runs.
  r = run("blendctl cluster up " + config.string(), dir_);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("worker-1 (pid " + std::to_string(worker) + ")"),
                           HasSubstr("blendctl cluster down " + config.string() + "` first")));
  EXPECT_TRUE(process_exists(worker));
  // ... and clears the pid files that name no member (the stranger is not signalled).
  EXPECT_THAT(r.err, AllOf(HasSubstr("removed the stale pid file " + (data() / "pids" / "frontend.pid").string()),
                           HasSubstr("removed the stale pid file " + (data() / "pids" / "storage.pid").string())));
  EXPECT_TRUE(process_exists(stranger));
  std::ofstream(data() / "pids" / "frontend.pid") << stranger << "\n";
  std::ofstream(data() / "pids" / "storage.pid") << dead << "\n";

  r = run("blendctl cluster down --timeout 30 " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  by_name.clear();
  for (const auto& line : json_lines(r.out)) by_name[line["name"]] = line;
  EXPECT_EQ(by_name["worker-1"]["stopped"], "SIGTERM");
  EXPECT_EQ(by_name["frontend"]["stopped"], "not ours");
  EXPECT_EQ(by_name["storage"]["stopped"], "not running");
  // The worker drained and exited by itself; the stranger was never signalled.
  const int status = reap(worker, 5);
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << log_of("worker-1");
  EXPECT_TRUE(process_exists(stranger));
  EXPECT_EQ(::waitpid(stranger, nullptr, WNOHANG), 0) << "the stranger ended";
  EXPECT_TRUE(fs::is_empty(data() / "pids"));

  // Down again: nothing to do.
  r = run("blendctl cluster down " + config.string(), dir_);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "");
}

// The whole cluster up (storage node, a worker, the frontend, each ready: the
// frontend's /health answers 200 only once a worker reports over the control plane),
// status, then down leaving no process.
TEST_F(ClusterCli, UpStartsEveryMemberAndDownStopsThem) {
  const fs::path config = write_config({", tiers: {remote: {enabled: true}}"}, /*storage=*/true);
  Result r = run("blendctl cluster up " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines.front()["name"], "storage");  // started first
  EXPECT_EQ(lines.back()["name"], "frontend");   // and last
  std::vector<pid_t> pids;
  for (const auto& line : lines) {
    EXPECT_TRUE(line["ready"].get<bool>()) << line;
    pids.push_back(line["pid"].get<pid_t>());
  }
  r = run("blendctl cluster status " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.out;
  // `up` made the cluster's certificates (TLS is the default) and the storage node
  // serves its data port over TLS.
  for (const char* f : {"ca.pem", "ca.key", "storage.pem", "worker-1.key", "frontend.pem"})
    EXPECT_TRUE(fs::exists(data() / "tls" / f)) << f;
  EXPECT_THAT(log_of("storage"), HasSubstr("(TLS 1.3, mutual)"));
  r = run("blendctl cluster down " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid)) << pid;
  EXPECT_TRUE(fs::is_empty(data() / "pids"));
}

// `blendctl cluster init`: the CA and every member's files made once, then found and
// checked; a member's file that does not belong is named (exit 1); plaintext says so.
TEST_F(ClusterCli, InitMakesTheCertificatesOnceAndNamesAWrongOne) {
  const fs::path config = write_config({""}, /*storage=*/true);
  Result r = run("blendctl cluster init " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;  // frontend, worker-1, storage
  for (const auto& line : lines) EXPECT_TRUE(line["made"].get<bool>()) << line;
  EXPECT_THAT(r.err, HasSubstr("made the CA of cluster t"));
  EXPECT_EQ(fs::status(data() / "tls").permissions() & fs::perms::all, fs::perms::owner_all);
  // The real tool agrees: signed by the cluster's CA.
  if (bs::testing::run_command("openssl version").code == 0) {
    const auto v = bs::testing::run_command("openssl verify -CAfile " + (data() / "tls" / "ca.pem").string() + " " +
                                            (data() / "tls" / "storage.pem").string() + " 2>&1");
    EXPECT_EQ(v.code, 0) << v.out;
  }
  r = run("blendctl cluster init " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& line : lines) EXPECT_FALSE(line["made"].get<bool>()) << line;
  // worker-1's key swapped for the storage node's: named, with what to do.
  fs::copy_file(data() / "tls" / "storage.key", data() / "tls" / "worker-1.key", fs::copy_options::overwrite_existing);
  r = run("blendctl cluster init " + config.string(), dir_);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("worker-1"), HasSubstr("is not the key of"), HasSubstr("to have them made again")));
  // So does `up`, before it starts anything.
  r = run("blendctl cluster up " + config.string(), dir_);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  // Plaintext, said explicitly: nothing to make.
  const fs::path plain = write_config({""}, /*storage=*/true, "", ", tls: {mode: plaintext}");
  r = run("blendctl cluster init " + plain.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("plaintext"));
}

// The whole path through real processes: the frontend sends a request with
// documents to a worker, which computes them and pushes its chunks to the storage
// node; the same documents again go to that worker (it holds them: RAM); with that
// worker killed, the frontend notices (or retries) and the other worker answers
// with the chunks from the storage node's remote tier.
TEST_F(ClusterCli, TheFrontendRoutesByHeldKvAndTheOtherWorkerLoadsTheStorageNodesChunks) {
  const std::string remote = ", tiers: {remote: {enabled: true, write_back: true}}";
  const fs::path config =
      write_config({remote, remote}, /*storage=*/true, ", server: {api_keys: [users-key-0123456789]}");
  Result r = run("blendctl cluster up " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, pid_t> pids;
  for (const auto& line : json_lines(r.out)) pids[line["name"]] = line["pid"].get<pid_t>();
  httplib::Client c("127.0.0.1", http_ports_["frontend"]);
  c.set_read_timeout(120, 0);
  // The frontend checks the users' keys: none, or a wrong one (the workers' key
  // included), is refused before anything reaches a worker.
  auto refused = c.Get("/v1/models");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_THAT(refused->body, HasSubstr("missing_api_key"));
  c.set_bearer_token_auth(bs::worker_api_key(kSecret));
  refused = c.Get("/v1/models");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_THAT(refused->body, HasSubstr("invalid_api_key"));
  c.set_bearer_token_auth("users-key-0123456789");
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200) << (models ? models->body : "no answer");
  const std::string model = nlohmann::json::parse(models->body)["data"][0]["id"];
  const nlohmann::json req{{"model", model},
                           {"messages", {{{"role", "user"}, {"content", "Who wrote the report?"}}}},
                           {"documents", {"The 2019 water report was written by Ana Lopez of the city council.",
                                          "The council meets every Tuesday in the old library building."}},
                           {"max_tokens", 6},
                           {"temperature", 0}};
  auto ask = [&] {
    auto res = c.Post("/v1/chat/completions", req.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return std::make_pair(std::string(), nlohmann::json());
    EXPECT_EQ(res->status, 200) << res->body;
    return std::make_pair(res->get_header_value("X-Blendserve-Worker"), nlohmann::json::parse(res->body, nullptr, false));
  };
  const auto [first_worker, first] = ask();
  ASSERT_FALSE(first_worker.empty());
  EXPECT_FALSE(first["choices"][0]["message"]["content"].get<std::string>().empty());
  // The worker's write-back reaches its RAM and the storage node in the background.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const auto [again_worker, again] = ask();
  EXPECT_EQ(again_worker, first_worker) << "the documents' KV is there";
  EXPECT_EQ(again["usage"]["blendserve"].value("chunks_ram", 0), 2) << again.dump();
  // Blended from stored KV: what the other worker answers from the node's copy.
  const std::string answer = again["choices"][0]["message"]["content"];
  // That worker dies: the other one answers, its chunks from the storage node.
  ASSERT_EQ(::kill(pids.at(first_worker), SIGKILL), 0);
  const auto [other_worker, other] = ask();
  EXPECT_NE(other_worker, first_worker);
  EXPECT_EQ(other["usage"]["blendserve"].value("chunks_remote", 0), 2) << other.dump();
  EXPECT_EQ(other["choices"][0]["message"]["content"], answer);
  const auto cluster = c.Get("/v1/inspect/cluster");
  ASSERT_TRUE(cluster && cluster->status == 200);
  r = run("blendctl cluster down " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  for (const auto& [name, pid] : pids) EXPECT_FALSE(process_exists(pid)) << name;
}

// The storage node's faults, with real processes. Worker-1 answers each document
// set cold first (its chunks computed: what a cold request answers), stores the set
// on the node (POST /v1/documents pushes before answering) and answers again from
// RAM (what a blend over the stored KV answers). Worker-2 holds nothing of its own:
// - the node frozen (SIGSTOP): the frontend marks it down within three heartbeats;
//   worker-2's request misses the remote tier within its timeouts and answers with
//   the cold text, nothing from the node;
// - SIGCONT: marked up again by itself; worker-2 loads a stored set from the node
//   and answers with worker-1's stored-KV text;
// - a server presenting a wrong secret: the node refuses it and logs it; that
//   server answers cold;
// - the node killed (SIGKILL): down again; worker-2 answers a stored set cold.
TEST_F(ClusterCli, StorageNodeFrozenKilledOrRefusingAWrongSecretCostsARecomputeNeverAWrongAnswer) {
  const std::string remote =
      ", tiers: {remote: {enabled: true, write_back: true, connect_timeout: 1s, io_timeout: 1s, retry_after: 1s}}";
  const fs::path config =
      write_config({remote, remote}, /*storage=*/true, "", ", heartbeat_interval: 500ms, connection_timeout: 2s");
  Result r = run("blendctl cluster up " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, pid_t> pids;
  for (const auto& line : json_lines(r.out)) pids[line["name"]] = line["pid"].get<pid_t>();
  const pid_t storage = pids.at("storage");

  auto client = [&](const std::string& node) {
    auto c = client_of(node);
    c->set_bearer_token_auth(bs::worker_api_key(kSecret));
    return c;
  };
  auto w1 = client("worker-1"), w2 = client("worker-2"), front = client("frontend");
  const auto models = w1->Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = nlohmann::json::parse(models->body)["data"][0]["id"];
  auto ask = [&](httplib::Client& c, const std::vector<std::string>& docs) {
    const auto res = c.Post("/v1/chat/completions", rag_request(model, docs).dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    return res && res->status == 200 ? nlohmann::json::parse(res->body) : nlohmann::json::object();
  };
  auto text = [](const nlohmann::json& a) { return a.value("/choices/0/message/content"_json_pointer, std::string()); };
  auto remote_chunks = [](const nlohmann::json& a) {
    return a.value("/usage/blendserve/chunks_remote"_json_pointer, 0);
  };
  // Cold on worker-1, stored on the node, then from worker-1's RAM.
  struct Set {
    std::vector<std::string> docs;
    std::string cold, stored;
  };
  auto prepare = [&](std::vector<std::string> docs) {
    Set s{std::move(docs), "", ""};
    const auto cold = ask(*w1, s.docs);
    EXPECT_EQ(cold.value("/usage/blendserve/chunks_missed"_json_pointer, -1), 2) << cold.dump();
    s.cold = text(cold);
    for (const auto& d : s.docs) {
      const auto res = w1->Post("/v1/documents", nlohmann::json{{"text", d}}.dump(), "application/json");
      EXPECT_TRUE(res && res->status == 200);
      if (res) {
        EXPECT_TRUE(nlohmann::json::parse(res->body).value("on_storage_node", false)) << res->body;
      }
    }
    const auto stored = ask(*w1, s.docs);
    EXPECT_EQ(stored.value("/usage/blendserve/chunks_ram"_json_pointer, 0), 2) << stored.dump();
    s.stored = text(stored);
    return s;
  };
  const Set frozen = prepare({"The 2019 water report was written by Ana Lopez of the city council.",
                              "The council meets every Tuesday in the old library building."});
  const Set thawed = prepare({"The 2020 budget report was written by Tom Okafor, the city treasurer.",
                              "The treasurer's office is on the second floor of the town hall."});
  const Set killed = prepare({"The 2021 transit report was written by Mei Chen of the bus authority.",
                              "The bus authority runs forty routes across the northern districts."});
  // Whether the frontend's view has the storage node up, polled for up to `seconds`.
  auto storage_up_becomes = [&](bool want, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    do {
      if (const auto res = front->Get("/v1/inspect/cluster"); res && res->status == 200) {
        const auto view = nlohmann::json::parse(res->body);
        for (const auto& m : view["members"])
          if (m["name"] == "storage" && m["up"].get<bool>() == want) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (std::chrono::steady_clock::now() < deadline);
    return false;
  };
  ASSERT_TRUE(storage_up_becomes(true, 10));

  // Frozen: noticed, and the request recomputes what the node would have sent.
  ASSERT_EQ(::kill(storage, SIGSTOP), 0);
  EXPECT_TRUE(storage_up_becomes(false, 1.5 * 3 + 2)) << "not marked down within 3 heartbeats";
  const auto t0 = std::chrono::steady_clock::now();
  const auto while_frozen = ask(*w2, frozen.docs);
  const double frozen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(text(while_frozen), frozen.cold);
  EXPECT_EQ(remote_chunks(while_frozen), 0) << while_frozen.dump();
  EXPECT_LT(frozen_s, 60) << "a frozen node must cost its timeouts, not a hang";

  // Thawed: up again by itself, and worker-2 loads from it again.
  ASSERT_EQ(::kill(storage, SIGCONT), 0);
  EXPECT_TRUE(storage_up_becomes(true, 10)) << "not marked up again after SIGCONT";
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // worker-2's retry_after
  const auto after = ask(*w2, thawed.docs);
  EXPECT_EQ(remote_chunks(after), 2) << after.dump();
  EXPECT_EQ(text(after), thawed.stored);

  // A server with a wrong secret: refused by the node (and logged there); it
  // answers as a cold request.
  {
    const int stranger_port = port();
    const fs::path wrong = dir_ / "wrong-secret.yaml";
    std::ofstream(wrong) << "model: {path: " << bs::testing::model_path() << "}\n"
                         << "device: {threads: 1}\n"
                         << "tiers: {ram: {enabled: false}, ssd: {enabled: false}, remote: {enabled: true, "
                         << "host: 127.0.0.1, port: " << storage_data_port_
                         << ", secret: not-the-cluster-secret-0123, write_back: false}}\n";
    bs::testing::ServeProcess stranger(wrong, stranger_port, dir_ / "wrong-secret.log", dir_ / "wrong-secret-data");
    ASSERT_TRUE(stranger.up());
    httplib::Client c("127.0.0.1", stranger_port);
    c.set_read_timeout(120, 0);
    const auto a = ask(c, thawed.docs);
    EXPECT_EQ(remote_chunks(a), 0) << a.dump();
    EXPECT_EQ(text(a), thawed.cold);
    EXPECT_THAT(log_of("storage"), HasSubstr("refused"));
  }

  // A single node outside the cluster file (tiers.remote with its own TLS keys:
  // worker-2's certificate, the storage node's name, the secret) loads the stored
  // chunks over TLS, with the stored text.
  {
    const int single_port = port();
    const fs::path t = data() / "tls";
    const fs::path single = dir_ / "single-tls.yaml";
    std::ofstream(single) << "model: {path: " << bs::testing::model_path() << "}\n"
                          << "device: {threads: 1}\n"
                          << "tiers: {ram: {enabled: false}, ssd: {enabled: false}, remote: {enabled: true, "
                          << "host: 127.0.0.1, port: " << storage_data_port_ << ", secret: " << kSecret
                          << ", write_back: false, tls: {ca: " << (t / "ca.pem").string()
                          << ", cert: " << (t / "worker-2.pem").string() << ", key: " << (t / "worker-2.key").string()
                          << ", peer_name: storage}}}\n";
    bs::testing::ServeProcess node(single, single_port, dir_ / "single-tls.log", dir_ / "single-tls-data");
    ASSERT_TRUE(node.up());
    httplib::Client c("127.0.0.1", single_port);
    c.set_read_timeout(120, 0);
    const auto a = ask(c, thawed.docs);
    EXPECT_EQ(remote_chunks(a), 2) << a.dump();
    EXPECT_EQ(text(a), thawed.stored);
  }

  // Killed: down, and the stored set recomputes.
  ASSERT_EQ(::kill(storage, SIGKILL), 0);
  EXPECT_TRUE(storage_up_becomes(false, 1.5 * 3 + 2));
  const auto after_kill = ask(*w2, killed.docs);
  EXPECT_EQ(remote_chunks(after_kill), 0) << after_kill.dump();
  EXPECT_EQ(text(after_kill), killed.cold);

  r = run("blendctl cluster down " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  for (const auto& [name, pid] : pids) EXPECT_FALSE(process_exists(pid)) << name;
}

// The console of a cluster, served by its frontend with the users' key, loaded in
// headless Chromium: every worker's actors, the requests each ran, and a chosen
// request's layer timeline fetched from its worker through the frontend (exactly
// that trace's per-layer events); without the key the page gets no data.
TEST_F(ClusterCli, TheFrontendsConsoleShowsEveryWorkersActorsAndARequestsTimeline) {
  const std::string chromium = bs::testing::find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "no chromium (tools/setup.sh installs Debian's)";
  const std::string key = "users-key-0123456789";
  const fs::path config = write_config({"", ""}, false, ", server: {api_keys: [" + key + "]}");
  Result r = run("blendctl cluster up " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  httplib::Client c("127.0.0.1", http_ports_["frontend"]);
  c.set_read_timeout(120, 0);
  c.set_bearer_token_auth(key);
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = nlohmann::json::parse(models->body)["data"][0]["id"];
  const std::vector<std::string> docs = {"The 2019 water report was written by Ana Lopez of the city council.",
                                         "The council meets every Tuesday in the old library building."};
  std::string worker;
  for (int i = 0; i < 2; ++i) {  // the second from the RAM tier of the worker the first wrote back to
    const auto res = c.Post("/v1/chat/completions", rag_request(model, docs).dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    worker = res->get_header_value("X-Blendserve-Worker");
    if (i == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  const auto snap = nlohmann::json::parse(c.Get("/v1/inspect/snapshot")->body);
  uint64_t id = 0;
  for (const auto& n : snap["nodes"])
    if (n["name"] == worker && !n.value("recent", nlohmann::json::array()).empty())
      id = n["recent"].back()["id"].get<uint64_t>();
  ASSERT_NE(id, 0u) << snap.dump().substr(0, 2000);
  const auto no_node = c.Get("/v1/inspect/requests/" + std::to_string(id));
  ASSERT_TRUE(no_node);
  EXPECT_EQ(no_node->status, 400);
  EXPECT_THAT(no_node->body, HasSubstr("unknown_node"));
  const auto trace_res = c.Get("/v1/inspect/requests/" + std::to_string(id) + "?node=" + worker);
  ASSERT_TRUE(trace_res && trace_res->status == 200);
  const auto trace = nlohmann::json::parse(trace_res->body);

  const std::string dom = bs::testing::console_dom(
      chromium, http_ports_["frontend"], "key=" + key + "&req=" + std::to_string(id) + "&node=" + worker,
      dir_ / "chromium");
  ASSERT_NE(dom.find("data-connected=\"true\""), std::string::npos) << dom.substr(0, 2000);
  std::set<std::string> layer_workers;
  for (auto& row : bs::testing::elements_with(dom, "tr", "data-actor="))
    if (row["data-actor"] == "layer-worker") layer_workers.insert(row["data-node"]);
  EXPECT_EQ(layer_workers, (std::set<std::string>{"worker-1", "worker-2"}));
  bool chosen_row = false;
  for (auto& row : bs::testing::elements_with(dom, "tr", "data-request="))
    chosen_row |= row["data-request"] == std::to_string(id) && row["data-node"] == worker && row["class"] == "sel";
  EXPECT_TRUE(chosen_row) << "the chosen request's row, on its worker";
  std::multiset<std::tuple<int, std::string, std::string>> expected, shown;
  for (const auto& e : trace.at("events"))
    if (e.contains("layer")) expected.insert({e["layer"].get<int>(), e["actor"].get<std::string>(), e["what"].get<std::string>()});
  int load_rects = 0;
  for (auto& rect : bs::testing::elements_with(dom, "rect", "data-layer=")) {
    shown.insert({std::stoi(rect["data-layer"]), bs::testing::unescape(rect["data-actor"]),
                  bs::testing::unescape(rect["data-what"])});
    load_rects += rect["data-lane"] == "load";
  }
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(shown, expected);
  EXPECT_GT(load_rects, 0) << "the second request's chunks came from the RAM tier, layer by layer";

  const std::string refused = bs::testing::console_dom(chromium, http_ports_["frontend"], "req=1", dir_ / "chromium2");
  EXPECT_NE(refused.find("data-connected=\"false\""), std::string::npos);
  EXPECT_TRUE(bs::testing::elements_with(refused, "tr", "data-actor=").empty());
  r = run("blendctl cluster down " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
}

// Two storage nodes, replication 2 (the default), TLS on: documents stored through
// worker-1 land on both; with one node SIGKILLed, worker-2 (no RAM, no SSD: every
// chunk from the storage nodes) answers with the stored chunks — no recompute, the
// same text; the node started again empty is repaired by the next reads (the ratio
// stays the floor: write_config turns adaptive_ratio off for every worker).
TEST_F(ClusterCli, TwoStorageNodesSoOnesLossCostsNoRecomputeAndItIsRepairedWhenBack) {
  const fs::path config = write_config(
      {", tiers: {remote: {enabled: true, write_back: true}}",
       ", tiers: {ram: {enabled: false}, ssd: {enabled: false}, remote: {enabled: true, write_back: false, "
       "retry_after: 500ms}}"},
      /*storage=*/true);
  const int second_data_port = port();
  std::ofstream(config, std::ios::app) << "  - {name: storage-2, role: storage, host: 127.0.0.1, port: " << port()
                                       << ", data_port: " << second_data_port << "}\n";
  Result r = run("blendctl cluster up " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, pid_t> pids;
  for (const auto& line : json_lines(r.out)) pids[line["name"]] = line["pid"].get<pid_t>();
  ASSERT_EQ(pids.size(), 5u);
  auto client = [&](const std::string& node) {
    auto c = client_of(node);
    c->set_bearer_token_auth(bs::worker_api_key(kSecret));
    return c;
  };
  auto w1 = client("worker-1"), w2 = client("worker-2");
  const auto models = w1->Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = nlohmann::json::parse(models->body)["data"][0]["id"];
  const std::vector<std::string> docs = {"The 2019 water report was written by Ana Lopez of the city council.",
                                         "The council meets every Tuesday in the old library building."};
  std::vector<std::string> ids;
  for (const auto& d : docs) {
    const auto res = w1->Post("/v1/documents", nlohmann::json{{"text", d}}.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    const auto j = nlohmann::json::parse(res->body);
    EXPECT_TRUE(j.value("on_storage_node", false)) << res->body;
    ids.push_back(j.at("id").get<std::string>());
  }
  // Both nodes hold both chunks.
  for (const char* node : {"storage", "storage-2"})
    for (const auto& id : ids) EXPECT_TRUE(fs::exists(data() / node / "kv" / (id + ".bskv"))) << node << " " << id;
  auto ask = [&](httplib::Client& c) {
    const auto res = c.Post("/v1/chat/completions", rag_request(model, docs).dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    return res && res->status == 200 ? nlohmann::json::parse(res->body) : nlohmann::json::object();
  };
  auto text = [](const nlohmann::json& a) { return a.value("/choices/0/message/content"_json_pointer, std::string()); };
  const auto stored = ask(*w1);
  EXPECT_EQ(stored.value("/usage/blendserve/chunks_ram"_json_pointer, 0), 2) << stored.dump();

  // One node killed: every chunk still comes from the other.
  ASSERT_EQ(::kill(pids.at("storage"), SIGKILL), 0);
  const auto one_down = ask(*w2);
  EXPECT_EQ(one_down.value("/usage/blendserve/chunks_remote"_json_pointer, 0), 2) << one_down.dump();
  EXPECT_EQ(one_down.value("/usage/blendserve/chunks_missed"_json_pointer, -1), 0) << one_down.dump();
  EXPECT_EQ(text(one_down), text(stored));

  // Started again with nothing on its disk: the next reads copy the chunks back.
  fs::remove_all(data() / "storage" / "kv");
  const pid_t again = start_member(config, "storage");
  ASSERT_GT(again, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto accepts = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
    ::close(fd);
    return ok;
  };
  while (!accepts(storage_data_port_) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // past worker-2's retry_after for the old node
  const auto repaired_read = ask(*w2);
  EXPECT_EQ(repaired_read.value("/usage/blendserve/chunks_remote"_json_pointer, 0), 2) << repaired_read.dump();
  EXPECT_EQ(text(repaired_read), text(stored));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  auto repaired = [&] {
    for (const auto& id : ids)
      if (!fs::exists(data() / "storage" / "kv" / (id + ".bskv"))) return false;
    return true;
  };
  while (!repaired() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(repaired()) << "the node that came back empty was not repaired by the reads";
  r = run("blendctl cluster down " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
}

// A frozen worker (SIGSTOP: its sockets stay open, its reports stop) fails the
// requests it holds within two heartbeat intervals, whatever their own timeouts
// (first_token_timeout is 300 s here): before the first token the request is
// answered by the other worker; mid-stream the stream ends with a 503 event.
TEST_F(ClusterCli, AFrozenWorkerFailsItsRequestsWithinTwoHeartbeats) {
  const double hb = 0.5;
  const fs::path config = write_config({"", ""}, /*storage=*/false, "",
                                       ", heartbeat_interval: 500ms, connection_timeout: 5s, routing: round_robin");
  Result r = run("blendctl cluster up " + config.string(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, pid_t> pids;
  for (const auto& line : json_lines(r.out)) pids[line["name"]] = line["pid"].get<pid_t>();
  httplib::Client c("127.0.0.1", http_ports_["frontend"]);
  c.set_read_timeout(120, 0);
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200) << (models ? models->body : "no answer");
  const std::string model = nlohmann::json::parse(models->body)["data"][0]["id"];
  const nlohmann::json short_req{{"model", model},
                                 {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                                 {"max_tokens", 4},
                                 {"temperature", 0}};
  auto since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Round robin: this one goes to A, the next to B.
  auto t0 = std::chrono::steady_clock::now();
  auto first = c.Post("/v1/chat/completions", short_req.dump(), "application/json");
  const double alone_s = since(t0);
  ASSERT_TRUE(first && first->status == 200) << (first ? first->body : "no answer");
  const std::string a = first->get_header_value("X-Blendserve-Worker");
  const std::string b = a == "worker-1" ? "worker-2" : "worker-1";

  // Before the first token: B frozen; its request is failed by its missing reports
  // and answered by A.
  ASSERT_EQ(::kill(pids.at(b), SIGSTOP), 0);
  t0 = std::chrono::steady_clock::now();
  auto moved = c.Post("/v1/chat/completions", short_req.dump(), "application/json");
  const double moved_s = since(t0);
  ASSERT_TRUE(moved) << "no answer";
  EXPECT_EQ(moved->status, 200) << moved->body;
  EXPECT_EQ(moved->get_header_value("X-Blendserve-Worker"), a);
  std::printf("[ measured ] a request on a frozen worker answered by the other in %.2f s (alone %.2f s, heartbeat %.1f s)\n",
              moved_s, alone_s, hb);
  EXPECT_LT(moved_s, 2 * hb + 3 * alone_s + 1.0) << "not failed over within two heartbeats plus its compute";
  ASSERT_EQ(::kill(pids.at(b), SIGCONT), 0);

  // Mid-stream: a long answer streamed from whichever worker takes it, frozen after
  // its first token; the stream ends with a 503 event naming the heartbeats.
  std::this_thread::sleep_for(std::chrono::seconds(2));  // B reports again
  nlohmann::json long_req{{"model", model},
                          {"messages", {{{"role", "user"}, {"content", "Write a long story about a dragon."}}}},
                          {"max_tokens", 300},
                          {"temperature", 0},
                          {"stream", true}};
  std::string worker, events;
  std::atomic<bool> frozen{false};
  std::chrono::steady_clock::time_point frozen_at;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.headers.emplace("Content-Type", "application/json");
  req.body = long_req.dump();
  req.response_handler = [&](const httplib::Response& res) {
    worker = res.get_header_value("X-Blendserve-Worker");
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    events.append(data, n);
    if (!frozen && events.find("\"content\"") != std::string::npos && pids.count(worker)) {
      ::kill(pids.at(worker), SIGSTOP);
      frozen_at = std::chrono::steady_clock::now();
      frozen = true;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  EXPECT_TRUE(c.send(req, res, err)) << httplib::to_string(err);
  ASSERT_TRUE(frozen) << events;
  const double ended_s = since(frozen_at);
  ::kill(pids.at(worker), SIGCONT);
  std::printf("[ measured ] a stream on a frozen worker ended %.2f s after the freeze\n", ended_s);
  EXPECT_THAT(events, AllOf(HasSubstr("\"code\":503"), HasSubstr("missed its heartbeats"))) << events;
  EXPECT_LT(ended_s, 2 * hb + 1.0) << "the stream was not ended within two heartbeats";
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("blendserve_frontend_heartbeat_failures_total 2"));
  r = run("blendctl cluster down " + config.string(), dir_);
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(ClusterCli, ConfigErrorsExit2) {
  std::ofstream(dir_ / "bad.yaml") << "cluster: {name: t, secret: short}\nnodes: []\n";
  for (const char* action : {"up", "status", "down"}) {
    const Result r = run(std::string("blendctl cluster ") + action + " " + (dir_ / "bad.yaml").string(), dir_);
    EXPECT_EQ(r.code, 2) << action;
    EXPECT_THAT(r.err, HasSubstr("cluster.secret: the secret has 5 characters")) << action;
  }
}

}  // namespace
