// kill -9 in the middle of heavy writing, on the real server binary (a child process)
// and the real model: documents stored through POST /v1/documents by several clients
// at once while chat requests with fresh documents write their chunks back, then
// SIGKILL. After a restart on the same data directory: every document whose answer
// listed "ssd" among its tiers (fsynced before the answer) is there and is served
// from the disk; nothing on the disk is a torn or corrupt entry (temp files of the
// writes cut short are gone, every entry reads back against its checksums); the
// server is up within its usual start time.
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

TEST(ServerCrash, AKillDuringHeavyWritesLosesNoAcknowledgedDocumentAndServesNoTornEntry) {
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
  double first_start = 0;
  {
    const auto t0 = std::chrono::steady_clock::now();
    ServeProcess server(config, port, dir.path() / "first.log");
    ASSERT_TRUE(server.up());
    first_start = seconds_since(t0);
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 3; ++c)
      clients.emplace_back([&] {
        httplib::Client h("127.0.0.1", port);
        h.set_read_timeout(60, 0);
        while (!stop.load()) {
          const size_t i = next.fetch_add(1);
          if (i >= docs.size()) return;
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
    // A chat with documents of its own beside them: its chunks are written back.
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
    // Kill once a dozen documents are on the disk, with writes still going on.
    const auto deadline = std::chrono::steady_clock::now() + 300s;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (acknowledged.size() >= 12) break;
      }
      std::this_thread::sleep_for(20ms);
    }
    server.kill();  // SIGKILL: no drain, no flush
    stop = true;
    for (auto& t : clients) t.join();
  }
  ASSERT_GE(acknowledged.size(), 12u) << "too few documents were stored before the kill";

  // The directory as the kill left it, read by the store itself (a copy, so the
  // server's own start-up scan below starts from the same state): nothing the scan
  // drops as torn, every entry reads back whole against its checksums.
  const fs::path copy = dir.path() / "kv_after_kill";
  fs::copy(kv, copy);
  int64_t bskv_files = 0, other_files = 0;  // other: temp files of writes the kill cut short
  for (const auto& e : fs::directory_iterator(copy))
    (e.path().extension() == ".bskv" ? bskv_files : other_files) += 1;
  {
    DiskKvStore store(copy.string(), int64_t{1} << 40);
    EXPECT_EQ(store.stats().entries, bskv_files) << "a file under an entry's name was not a whole entry";
    for (const ChunkKey& key : store.keys()) EXPECT_NE(store.get(key), nullptr) << key.hex();
    EXPECT_EQ(store.stats().corrupt, 0);
  }
  for (const auto& id : acknowledged) EXPECT_TRUE(fs::exists(kv / (id + ".bskv"))) << "acknowledged " << id << " lost";

  // Restart on the same directory: up within its usual time, every acknowledged
  // document served from the disk, nothing corrupt.
  const auto t1 = std::chrono::steady_clock::now();
  ServeProcess again(config, port, dir.path() / "again.log");
  ASSERT_TRUE(again.up());
  const double restart = seconds_since(t1);
  std::printf("[ measured ] first start %.2f s, restart after kill -9 %.2f s, %zu documents acknowledged, "
              "%lld entries and %lld cut-short temp files on the disk at the kill\n",
              first_start, restart, acknowledged.size(), static_cast<long long>(bskv_files),
              static_cast<long long>(other_files));
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
