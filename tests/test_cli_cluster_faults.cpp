// A whole cluster up with real processes on loopback and the real model (storage
// nodes, workers, frontend): routing by held KV, the storage node's faults (frozen by
// SIGSTOP, killed, a worker with a wrong secret), two storage nodes and one's loss, the
// frontend's console over every worker, a frozen worker failed within two heartbeats.
#include "cluster_cli_fixture.h"

namespace {

using namespace bs::cli_cluster_test;  // NOLINT: the suites' shared fixture

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


}  // namespace
