// The inspection views end to end: the real model behind a real Runtime and
// server with an API key, a real HTTP client, and the console page loaded in a
// real headless Chromium (Debian's `chromium`), whose DOM after its scripts ran is
// checked: the actor table (one actor held busy with 100 (or 200) messages queued shows its
// depth and a busy share near 1), and the chosen request's layer timeline, which
// must hold exactly the trace's per-layer events. Without the key the page is
// refused its data. Also: /v1/inspect/snapshot, /requests, /metrics per actor.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "console_fixture.h"
#include "model_fixture.h"
#include "process_fixture.h"
#include "served_fixture.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::Served;
using testing::TempDir;
using testing::console_dom;
using testing::elements_with;
using testing::find_chromium;
using testing::unescape;

const char* kKey = "sk-console-test-4711";
const std::vector<std::string> kDocs = {
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889 and is 330 metres "
    "tall.",
    "Mount Kilimanjaro is a dormant volcano in Tanzania. Its highest peak is 5895 metres above sea level."};

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::model_available()) GTEST_SKIP() << "model not found: " << testing::model_path();
    config_ = default_runtime_config();
    config_.data_dir = dir_.path().string();
    config_.ssd.path = (dir_.path() / "kv").string();
    config_.api_keys = {kKey};
    runtime_ = std::make_unique<Runtime>(config_);
    served_ = std::make_unique<Served>(*runtime_, config_);
  }
  void TearDown() override {
    served_.reset();
    runtime_.reset();
  }
  json get(const std::string& path, int expect_status = 200) {
    auto c = served_->client(60);
    auto r = c.Get(path.c_str(), {{"Authorization", std::string("Bearer ") + kKey}});
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, expect_status) << path << ": " << r->body;
    return r->status == 200 && r->get_header_value("Content-Type").find("json") != std::string::npos
               ? json::parse(r->body)
               : json{};
  }
  uint64_t ask(const std::vector<std::string>& docs) {
    auto c = served_->client();
    json body = {{"model", "SmolLM2-135M-Instruct"},
                 {"messages", {{{"role", "user"}, {"content", "How tall is the Eiffel Tower?"}}}},
                 {"max_tokens", 6},
                 {"temperature", 0},
                 {"documents", docs}};
    auto r = c.Post("/v1/chat/completions", {{"Authorization", std::string("Bearer ") + kKey}}, body.dump(),
                    "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    // The finished request is the newest in the inspector's history.
    const json recent = get("/v1/inspect/snapshot").at("nodes")[0].at("recent");
    EXPECT_FALSE(recent.empty());
    return recent.empty() ? 0 : recent.back().at("id").get<uint64_t>();
  }

  TempDir dir_;
  RuntimeConfig config_;
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Served> served_;
};

TEST_F(ConsoleTest, SnapshotAndMetricsShowEveryActorAndABlockedOne) {
  const uint64_t first = ask(kDocs);
  ASSERT_NE(first, 0u);
  // An actor held busy: 100 messages of 50 ms each, queued at once.
  auto post = runtime_->spawn_reporting_actor("held-busy", [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  // One whose work throws: the error is reported, the actor goes on.
  auto post_failing = runtime_->spawn_reporting_actor("fails-once", [] { throw std::runtime_error("injected failure"); });
  post_failing();
  post_failing();
  EXPECT_THROW(runtime_->spawn_reporting_actor("held-busy", [] {}), std::invalid_argument) << "a name in use";
  get("/v1/inspect/snapshot");  // a first sample: the share below covers the next second
  for (int i = 0; i < 100; ++i) post();
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  const json node = get("/v1/inspect/snapshot").at("nodes")[0];
  EXPECT_EQ(node.at("name"), "local");
  std::map<std::string, json> actors;
  for (const auto& a : node.at("actors")) actors[a.at("actor").get<std::string>()] = a;
  for (const char* name : {"intake", "controller", "layer-worker", "decoder", "inspector", "supervisor", "write-back",
                           "compute-thread", "loader-ram-0", "loader-ssd-0", "ssd-writer", "held-busy"})
    EXPECT_TRUE(actors.count(name)) << name;
  const json& held = actors["held-busy"];
  EXPECT_EQ(held.at("state"), "busy");
  EXPECT_GE(held.at("mailbox").get<int64_t>(), 50) << held.dump();
  EXPECT_GT(held.at("busy_share").get<double>(), 0.9) << held.dump();
  ASSERT_TRUE(actors.count("fails-once"));
  EXPECT_EQ(actors["fails-once"].at("messages").get<int64_t>(), 2) << "it handled the second message too";
  EXPECT_EQ(actors["fails-once"].value("last_error", ""), "injected failure");
  EXPECT_EQ(actors["layer-worker"].at("kind"), "layer-worker");
  EXPECT_GT(actors["layer-worker"].at("messages").get<int64_t>(), 0);
  EXPECT_GT(actors["compute-thread"].at("busy_s").get<double>(), 0.0) << "the prefill and decode ran there";
  // The finished request in the recent list, with what the console shows of it.
  const json& last = node.at("recent").back();
  EXPECT_EQ(last.at("id").get<uint64_t>(), first);
  EXPECT_EQ(last.at("mode"), "blend");
  EXPECT_EQ(last.at("chunk_tiers").size(), 2u);
  EXPECT_GT(last.at("first_token_s").get<double>(), 0.0);
  EXPECT_EQ(last.at("tokens_out").get<int64_t>(), 6);
  EXPECT_FALSE(last.at("ratio_reason").get<std::string>().empty());
  // Which rule chose the recomputed tokens, and how many came from each of its chunks.
  EXPECT_TRUE(last.at("selection") == "query-first" || last.at("selection") == "deviation" ||
              last.at("selection") == "none")
      << last.dump();
  EXPECT_EQ(last.at("recomputed_per_chunk").size(), 2u) << last.dump();
  // Where its stored KV came from: its two documents' chunks, missed (computed in
  // place, then stored at once as provisional entries and computed alone once each).
  const json& reused = last.at("reused");
  EXPECT_EQ(reused.at("document_tokens").get<int64_t>(), 0) << last.dump();
  EXPECT_EQ(reused.at("pasted_passage_tokens").get<int64_t>(), 0) << last.dump();
  EXPECT_GE(reused.at("prefix_cache_tokens").get<int64_t>(), 0) << last.dump();
  const json& reuse = node.at("reuse");
  EXPECT_EQ(reuse.at("provisional_entries").get<int64_t>(), 2) << reuse.dump();
  EXPECT_LE(reuse.at("chunks_computed").get<int64_t>(), 2) << reuse.dump();
  EXPECT_EQ(get("/v1/inspect/requests/" + std::to_string(first)).at("id").get<uint64_t>(), first);
  get("/v1/inspect/requests/987654", 404);
  // Prometheus: per actor and per tier.
  auto c = served_->client();
  auto m = c.Get("/metrics", {{"Authorization", std::string("Bearer ") + kKey}});
  ASSERT_TRUE(m && m->status == 200);
  EXPECT_NE(m->body.find("# TYPE blendserve_actor_messages_total counter"), std::string::npos);
  EXPECT_NE(m->body.find("blendserve_actor_busy_seconds_total{actor=\"layer-worker\",kind=\"layer-worker\",node=\"local\""),
            std::string::npos);
  EXPECT_TRUE(std::regex_search(m->body, std::regex(R"(blendserve_actor_mailbox_depth\{actor="held-busy"[^}]*\} ([5-9][0-9]))")))
      << "the held actor's depth";
  EXPECT_NE(m->body.find("blendserve_tier_load_bytes_total{tier=\"ram\"}"), std::string::npos);
  // The Grafana dashboard in configs/ asks only for series this server exports.
  std::ifstream dash(std::string(BLENDSERVE_FIXTURES) + "/../../configs/grafana-dashboard.json");
  ASSERT_TRUE(dash) << "configs/grafana-dashboard.json";
  const json dashboard = json::parse(dash);
  int queries = 0;
  for (const auto& panel : dashboard.at("panels"))
    for (const auto& target : panel.at("targets")) {
      const std::string expr = target.at("expr");
      const std::regex metric(R"(blendserve_[a-z_]+)");
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), metric); it != std::sregex_iterator(); ++it) {
        ++queries;
        std::string at_line_start(1, '\n');
        at_line_start.append(it->str());
        EXPECT_NE(m->body.find(at_line_start), std::string::npos) << it->str() << " in " << panel.at("title");
      }
    }
  EXPECT_GE(queries, 10);
}

TEST_F(ConsoleTest, ThePageShowsTheActorsAndTheRequestsLayersAndRefusesWithoutTheKey) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "no chromium (tools/setup.sh installs Debian's)";
  ask(kDocs);                          // computes the chunks (write-back stores them)
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t id = ask(kDocs);      // served from the RAM tier: loads and computes
  ASSERT_NE(id, 0u);
  auto post = runtime_->spawn_reporting_actor("held-busy", [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  get("/v1/inspect/snapshot");
  // 10 s of work queued: Chromium's start and the page's first snapshot take a few
  // seconds on a slow 2-core machine, and the depth must still be >= 50 by then.
  for (int i = 0; i < 200; ++i) post();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));

  // The page itself needs no key: it holds no data.
  auto c = served_->client();
  auto page = c.Get("/console");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  for (const char* outside : {"<script src", "<link", "@import", "url(http", "src=\"http", "href=\"http", "https://"})
    EXPECT_EQ(page->body.find(outside), std::string::npos) << "nothing fetched from elsewhere: " << outside;

  const std::string dom = console_dom(chromium, served_->port(), "key=" + std::string(kKey) + "&req=" + std::to_string(id),
                                      dir_.path() / "chromium");
  ASSERT_NE(dom.find("data-connected=\"true\""), std::string::npos) << dom.substr(0, 2000);
  std::map<std::string, std::map<std::string, std::string>> rows;
  for (auto& r : elements_with(dom, "tr", "data-actor=")) rows[r["data-actor"]] = r;
  for (const char* name : {"intake", "controller", "layer-worker", "decoder", "compute-thread", "loader-ram-0"})
    EXPECT_TRUE(rows.count(name)) << name;
  ASSERT_TRUE(rows.count("held-busy")) << dom.substr(0, 4000);
  ASSERT_TRUE(rows["held-busy"].count("data-mailbox")) << dom.substr(0, 4000);
  EXPECT_EQ(rows["held-busy"]["data-state"], "busy");
  EXPECT_GE(std::stoi(rows["held-busy"]["data-mailbox"]), 50);
  EXPECT_GT(std::stod(rows["held-busy"]["data-busy-share"]), 0.9);

  // The timeline: exactly the trace's per-layer events, each in its lane.
  const json trace = get("/v1/inspect/requests/" + std::to_string(id));
  std::multiset<std::tuple<int, std::string, std::string>> expected, shown;
  std::set<int> computed_layers;
  for (const auto& e : trace.at("events")) {
    if (!e.contains("layer")) continue;
    expected.insert({e.at("layer").get<int>(), e.at("actor").get<std::string>(), e.at("what").get<std::string>()});
    if (e.at("what") == "compute") computed_layers.insert(e.at("layer").get<int>());
  }
  const int n_layers = runtime_->context().model->config().n_layers;
  EXPECT_EQ(static_cast<int>(computed_layers.size()), n_layers) << "every layer computed";
  ASSERT_NE(dom.find("id=\"timeline-svg\" xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(dom.find("data-request=\"" + std::to_string(id) + "\""), std::string::npos);
  int load_rects = 0;
  for (auto& r : elements_with(dom, "rect", "data-layer=")) {
    shown.insert({std::stoi(r["data-layer"]), unescape(r["data-actor"]), unescape(r["data-what"])});
    if (r["data-lane"] == "load") {
      ++load_rects;
      EXPECT_EQ(unescape(r["data-what"]), "load");
    }
  }
  EXPECT_EQ(shown, expected);
  EXPECT_EQ(load_rects, n_layers) << "the RAM tier's loader delivered every layer";

  // Without the key: the page loads, its data does not.
  const std::string refused = console_dom(chromium, served_->port(), "req=" + std::to_string(id), dir_.path() / "chromium2");
  EXPECT_NE(refused.find("data-connected=\"false\""), std::string::npos);
  EXPECT_NE(refused.find("Refused by the server"), std::string::npos);
  EXPECT_TRUE(elements_with(refused, "tr", "data-actor=").empty());
  EXPECT_EQ(c.Get("/v1/inspect/snapshot")->status, 401);
}

}  // namespace
}  // namespace bs
