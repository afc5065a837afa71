// kill -9 in the middle of a write, on the real server binary (a child process) and
// the real model: documents stored through POST /v1/documents by several clients at
// once while a chat request with fresh documents writes its chunks back; the test
// watches the data directory and sends SIGKILL the moment a write is under way (its
// temp file is there), restarting and killing again until one kill landed mid-write
// (at most three rounds). After each kill: every document whose answer listed "ssd"
// among its tiers (fsynced before the answer) is there; nothing on the disk is a torn
// or corrupt entry (every entry reads back against its checksums, the cut-short temp
// files are only temp files). After the last: the server is up within its usual start
// time, serves every acknowledged document from the disk and cleared the temp files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "model_fixture.h"
#include "storage/disk_store.h"
#include "temp_dir.h"
#include "tests/process_fixture.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using testing::ServeProcess;
using testing::TempDir;

// Documents of the small RAG set, all distinct.
std::vector<std::string> all_documents() {
  std::ifstream in(std::string(BLENDSERVE_FIXTURES) + "/../data/rag_qa_small.jsonl");
  std::set<std::string> seen;
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    for (const auto& d : j.at("documents"))
      if (seen.insert(d.get<std::string>()).second) out.push_back(d.get<std::string>());
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Temp files of writes under way in `dir` (a kill now cuts one short).
bool write_under_way(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().find(".bskv.tmp.") != std::string::npos) return true;
  return false;
}

TEST(ServerCrash, AKillMidWriteLosesNoAcknowledgedDocumentAndServesNoTornEntry) {
  REQUIRE_MODEL();
  TempDir dir;
  const fs::path config = dir.path() / "crash.yaml";
  {
    std::ofstream f(config);
    f << "data_dir: " << (dir.path() / "data").string() << "\n";
  }
  const fs::path kv = dir.path() / "data" / "kv";
  const auto docs = all_documents();
  ASSERT_GE(docs.size(), 40u);
  const int port = testing::free_port();
  ASSERT_GT(port, 0);

  std::mutex mu;
  std::vector<std::string> acknowledged;  // ids whose answer listed "ssd"
  std::atomic<size_t> next{0};             // documents are handed out once, across rounds
  double first_start = 0;
  int rounds = 0, mid_write_kills = 0;
  int64_t torn_writes = 0;  // temp files on the disk at the kills
  while (rounds < 3 && mid_write_kills == 0) {
    ++rounds;
    const auto t0 = std::chrono::steady_clock::now();
    ServeProcess server(config, port, dir.path() / ("run" + std::to_string(rounds) + ".log"));
    ASSERT_TRUE(server.up());
    if (rounds == 1) first_start = seconds_since(t0);
    size_t acked_before;
    {
      std::lock_guard<std::mutex> lock(mu);
      acked_before = acknowledged.size();
    }
    std::atomic<bool> stop{false};
    std::atomic<int> storing{3};  // document clients still storing (the documents may run out)
    std::vector<std::thread> clients;
    for (int c = 0; c < 3; ++c)
      clients.emplace_back([&] {
        struct Done {
          std::atomic<int>& n;
          ~Done() { --n; }
        } done{storing};
        httplib::Client h("127.0.0.1", port);
        h.set_read_timeout(60, 0);
        while (!stop.load()) {
          const size_t i = next.fetch_add(1);
          if (i >= docs.size() - 4) return;  // the last four are the chat's
          auto r = h.Post("/v1/documents", json{{"text", docs[i]}}.dump(), "application/json");
          if (!r || r->status != 200) continue;  // cut short by the kill, or refused
          const json j = json::parse(r->body);
          const auto tiers = j.value("tiers", json::array());
          if (std::find(tiers.begin(), tiers.end(), "ssd") != tiers.end()) {
            std::lock_guard<std::mutex> lock(mu);
            acknowledged.push_back(j.at("id").get<std::string>());
          }
        }
      });
    if (rounds == 1)  // a chat with documents of its own beside them: its chunks are written back
      clients.emplace_back([&] {
        httplib::Client h("127.0.0.1", port);
        h.set_read_timeout(60, 0);
        for (size_t i = docs.size() - 1; i > docs.size() - 4 && !stop.load(); --i) {
          const json body = {{"model", "SmolLM2-135M-Instruct"},
                             {"messages", {{{"role", "user"}, {"content", "What does it say?"}}}},
                             {"documents", {docs[i], docs[i - 1]}},
                             {"max_tokens", 2}};
          h.Post("/v1/chat/completions", body.dump(), "application/json");
        }
      });
    // Once a few documents are on the disk (the first round: a dozen), SIGKILL the
    // moment a write is under way; past the deadline, wherever it stands.
    const size_t want = acked_before + (rounds == 1 ? 12 : 3);
    auto deadline = std::chrono::steady_clock::now() + 300s;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (acknowledged.size() >= want) break;
      }
      if (storing.load() == 0) break;
      std::this_thread::sleep_for(20ms);
    }
    deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline && storing.load() > 0 && !write_under_way(kv))
      std::this_thread::sleep_for(1ms);
    server.kill();  // SIGKILL: no drain, no flush
    stop = true;
    for (auto& t : clients) t.join();

    // The directory as the kill left it, read by the store itself (a copy, so the
    // next start-up scan starts from the same state): nothing the scan drops as
    // torn, every entry reads back whole against its checksums, every acknowledged
    // document there.
    const fs::path copy = dir.path() / ("kv_after_kill" + std::to_string(rounds));
    fs::copy(kv, copy);
    int64_t bskv_files = 0, temp_files = 0;
    for (const auto& e : fs::directory_iterator(copy)) {
      if (e.path().extension() == ".bskv") ++bskv_files;
      else if (e.path().filename().string().find(".bskv.tmp.") != std::string::npos) ++temp_files;
      else ADD_FAILURE() << "neither an entry nor a write's temp file: " << e.path();
    }
    {
      DiskKvStore store(copy.string(), int64_t{1} << 40);
      EXPECT_EQ(store.stats().entries, bskv_files) << "a file under an entry's name was not a whole entry";
      for (const ChunkKey& key : store.keys()) EXPECT_NE(store.get(key), nullptr) << key.hex();
      EXPECT_EQ(store.stats().corrupt, 0);
    }
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& id : acknowledged) EXPECT_TRUE(fs::exists(kv / (id + ".bskv"))) << "acknowledged " << id << " lost";
    torn_writes += temp_files;
    if (temp_files > 0) ++mid_write_kills;
    std::printf("[ measured ] round %d: %zu documents acknowledged so far, %lld entries and %lld cut-short "
                "writes on the disk at the kill\n",
                rounds, acknowledged.size(), static_cast<long long>(bskv_files), static_cast<long long>(temp_files));
  }
  EXPECT_GE(mid_write_kills, 1) << "no kill in " << rounds << " rounds landed while a write was under way";
  ASSERT_GE(acknowledged.size(), 12u) << "too few documents were stored before the kills";

  // Restart on the same directory: up within its usual time, every acknowledged
  // document served from the disk, nothing corrupt.
  const auto t1 = std::chrono::steady_clock::now();
  ServeProcess again(config, port, dir.path() / "after.log");
  ASSERT_TRUE(again.up());
  const double restart = seconds_since(t1);
  std::printf("[ measured ] first start %.2f s, restart after %d kill -9 %.2f s, %zu documents acknowledged, "
              "%lld cut-short writes\n",
              first_start, rounds, restart, acknowledged.size(), static_cast<long long>(torn_writes));
  EXPECT_LT(restart, 2 * first_start + 5) << "the restart took much longer than the first start";
  for (const auto& f : fs::directory_iterator(kv)) EXPECT_EQ(f.path().extension(), ".bskv") << f.path();
  httplib::Client h("127.0.0.1", port);
  h.set_read_timeout(120, 0);
  // Storing each acknowledged document again finds it stored (the documents were
  // handed out in order, so they are among the first; stop once all are seen).
  std::set<std::string> acked(acknowledged.begin(), acknowledged.end());
  size_t seen = 0;
  for (size_t i = 0; i < docs.size() && seen < acked.size(); ++i) {
    auto r = h.Post("/v1/documents", json{{"text", docs[i]}}.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    if (acked.count(j.at("id").get<std::string>())) {
      ++seen;
      EXPECT_TRUE(j.at("already_stored").get<bool>()) << "acknowledged document " << i << " is not there";
    }
  }
  EXPECT_EQ(seen, acked.size());
  auto stores = h.Get("/v1/inspect/stores");
  ASSERT_TRUE(stores);
  EXPECT_EQ(json::parse(stores->body)["ssd"]["corrupt"].get<int64_t>(), 0);
}

}  // namespace
}  // namespace bs
