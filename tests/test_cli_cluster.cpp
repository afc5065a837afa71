// The cluster commands as people run them, with real processes on loopback and the
// real model: `blendserve check-config`, `blendserve --config F --node NAME`, and
// `blendctl cluster init|up|status|down`. `up` is also tested where it must fail (a
// worker that cannot load its model: the others it started are stopped), and
// `status`/`down` on a worker started by hand with its pid file where `up` writes it
// (the file layout is the documented contract), beside a pid file that names a stranger
// process and one that names a dead pid. The cluster at work and its faults:
// test_cli_cluster_faults.cpp.
#include "cluster_cli_fixture.h"

namespace {

using namespace bs::cli_cluster_test;  // NOLINT: the suites' shared fixture

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
TEST_F(ClusterCli, ConfigErrorsExit2) {
  std::ofstream(dir_ / "bad.yaml") << "cluster: {name: t, secret: short}\nnodes: []\n";
  for (const char* action : {"up", "status", "down"}) {
    const Result r = run(std::string("blendctl cluster ") + action + " " + (dir_ / "bad.yaml").string(), dir_);
    EXPECT_EQ(r.code, 2) << action;
    EXPECT_THAT(r.err, HasSubstr("cluster.secret: the secret has 5 characters")) << action;
  }
}


}  // namespace
