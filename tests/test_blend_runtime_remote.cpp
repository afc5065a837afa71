// The remote tier in the runtime, with the real model: a storage node
// (StorageServer over its own SSD tier, on loopback) holds the chunks a first
// worker computed and pushed (tiers.remote.write_back); a second worker with
// nothing of its own loads them layer by layer from the node and answers with the
// tokens the first one gives from RAM; a storage node that is gone, or that
// breaks off a transfer mid-request, costs a recompute and never a wrong answer;
// a stored document (Runtime::store_document) goes to the node at once and other
// workers load it from there instead of computing it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "blend/rag_prompt.h"
#include "model_fixture.h"
#include "rag_runtime_fixture.h"
#include "storage/disk_store.h"
#include "storage/storage_server.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::RagCase;
using testing::TempDir;
using testing::wait_stored;

constexpr const char* kSecret = "remote-tier-test-secret-0123";

RuntimeRequest request_for(const RagCase& c, int max_tokens = 12) {
  RuntimeRequest r;
  r.messages = {{"user", c.question + " Answer briefly."}};
  r.documents = c.documents;
  r.sampling.max_tokens = max_tokens;
  r.ratio = 0.15f;
  return r;
}

RuntimeConfig worker_config(const fs::path& dir, int storage_port, bool ram, bool ssd) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ram.enabled = ram;
  c.ssd.enabled = ssd;
  c.remote.enabled = true;
  c.remote.host = "127.0.0.1";
  c.remote.port = storage_port;
  c.remote.secret = kSecret;
  c.remote.write_back = true;
  c.remote.connect_timeout_s = 2;
  c.remote.io_timeout_s = 2;
  c.remote.retry_after_s = 0.5;
  return c;
}

// The request's chunk keys as the runtime makes them.
std::vector<ChunkKey> chunk_keys(Runtime& rt, const RuntimeRequest& req) {
  auto& ctx = rt.context();
  const auto prompt = assemble_rag_prompt(ctx.model->tokenizer(), ctx.model->chat_template(), req.messages, req.documents);
  std::vector<ChunkKey> keys;
  for (const auto& c : prompt.chunks) keys.push_back(ctx.engine->chunk_key(c));
  return keys;
}

// The remote writer pushes in the background: waits (at most 60 s) until the node has every key.
void wait_on_node(const DiskKvStore& node, const std::vector<ChunkKey>& keys) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto all = [&] {
    for (const auto& k : keys)
      if (!node.contains(k)) return false;
    return true;
  };
  while (!all() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(all()) << "the storage node never got the pushed chunks";
}

struct StoredOnNode {
  RequestResult cold, from_ram;
  std::vector<ChunkKey> keys;
};

// A first worker answers the request cold, stores its chunks (RAM, its SSD, the
// node) and answers again from RAM.
StoredOnNode store_through_first_worker(const fs::path& dir, int port, const DiskKvStore& node,
                                        const RuntimeRequest& req) {
  StoredOnNode out;
  Runtime rt(worker_config(dir / "worker-1", port, true, true));
  out.cold = rt.run(req);
  EXPECT_NE(out.cold.finish_reason, "error") << out.cold.error;
  EXPECT_EQ(out.cold.chunks_missed, 3);
  wait_stored(rt, req);
  out.keys = chunk_keys(rt, req);
  wait_on_node(node, out.keys);
  out.from_ram = rt.run(req);
  EXPECT_EQ(out.from_ram.chunks_from("ram"), 3);
  return out;
}

TEST(RuntimeRemoteTier, AWorkerWithNothingOfItsOwnLoadsTheNodesChunksAndAnswersAsFromRam) {
  REQUIRE_MODEL();
  TempDir dir;
  DiskKvStore node((dir.path() / "node").string(), int64_t{1} << 30);
  StorageServer server(node, {.bind_host = "127.0.0.1", .port = 0, .secret = kSecret});
  const auto req = request_for(testing::rag_cases(1)[0]);
  const auto stored = store_through_first_worker(dir.path(), server.port(), node, req);

  Runtime rt(worker_config(dir.path() / "worker-2", server.port(), /*ram=*/true, /*ssd=*/false));
  const auto r = rt.run(req);
  ASSERT_NE(r.finish_reason, "error") << r.error;
  EXPECT_EQ(r.chunks_from("remote"), 3);
  EXPECT_EQ(r.recomputed_tokens, stored.from_ram.recomputed_tokens);
  EXPECT_EQ(r.tokens, stored.from_ram.tokens);
  // Every layer came over the network, through the remote tier's loader.
  const auto t = json::parse(rt.traces_json(1))[0];
  int remote_layers = 0;
  for (const auto& e : t.at("events"))
    if (e.at("actor") == "loader-remote" && e.at("what") == "load") ++remote_layers;
  EXPECT_EQ(remote_layers, rt.context().model->config().n_layers);
  EXPECT_GT(server.stats().layers_served, 0);
  // A remote hit is promoted into RAM: the next request does not go out again.
  const auto again = rt.run(req);
  EXPECT_EQ(again.chunks_from("ram"), 3);
  EXPECT_EQ(again.tokens, stored.from_ram.tokens);
  const auto stores = json::parse(rt.stores_json());
  ASSERT_TRUE(stores.contains("remote"));
  EXPECT_GT(stores["remote"]["load_bytes"].get<int64_t>(), 0);
}

TEST(RuntimeRemoteTier, AStorageNodeThatIsGoneOrBreaksOffCostsARecomputeNeverAWrongAnswer) {
  REQUIRE_MODEL();
  TempDir dir;
  DiskKvStore node((dir.path() / "node").string(), int64_t{1} << 30);
  auto server = std::make_unique<StorageServer>(node, StorageServerOptions{.bind_host = "127.0.0.1", .port = 0,
                                                                            .secret = kSecret});
  const int port = server->port();
  const auto req = request_for(testing::rag_cases(1)[0]);
  const auto stored = store_through_first_worker(dir.path(), port, node, req);

  // Mid-transfer: the node closes the connection at layer 12 of the first chunk's
  // read; the request is redone without the remote tier and answers as a cold one.
  std::atomic<int> faults{0};
  server->set_fault_hook([&](const ChunkKey&, int layer) {
    if (layer == 12 && faults.fetch_add(1) == 0) return StorageServer::Fault::close;
    return StorageServer::Fault::none;
  });
  {
    auto cfg = worker_config(dir.path() / "worker-2", port, true, false);
    cfg.write_back = false;
    Runtime rt(cfg);
    const auto r = rt.run(req);
    ASSERT_NE(r.finish_reason, "error") << r.error;
    EXPECT_EQ(r.tokens, stored.cold.tokens);
    EXPECT_GE(faults.load(), 1);
    EXPECT_TRUE(json::parse(rt.traces_json(1))[0].at("fallback").get<bool>());
  }
  // Gone: nothing listens on the port any more. Misses, computed, same answer, and
  // within the connect timeout rather than the load timeout.
  server.reset();
  {
    auto cfg = worker_config(dir.path() / "worker-3", port, true, false);
    cfg.write_back = false;
    Runtime rt(cfg);
    const auto start = std::chrono::steady_clock::now();
    const auto r = rt.run(req);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_NE(r.finish_reason, "error") << r.error;
    EXPECT_EQ(r.chunks_from("remote"), 0);
    EXPECT_EQ(r.tokens, stored.cold.tokens);
    EXPECT_LT(seconds, 30.0);
    EXPECT_FALSE(rt.context().remote->last_error().empty());
  }
}

}  // namespace
}  // namespace bs

namespace bs {
namespace {

// A stored document (POST /v1/documents) in a cluster: the first worker computes it
// and pushes it to the node before answering; a second worker with nothing of its
// own loads it whole from the node instead of computing it, and both answer a
// request over it from RAM with the same tokens; erasing removes the node's copy
// too; a node that is gone leaves the document stored on the worker, said so.
TEST(RuntimeRemoteTier, StoredDocumentsGoToTheNodeAndOtherWorkersLoadThemFromThere) {
  REQUIRE_MODEL();
  TempDir dir;
  DiskKvStore node((dir.path() / "node").string(), int64_t{1} << 30);
  auto server = std::make_unique<StorageServer>(node, StorageServerOptions{.bind_host = "127.0.0.1", .port = 0,
                                                                            .secret = kSecret});
  const int port = server->port();
  const auto c = testing::rag_cases(1)[0];
  const auto req = request_for(c);
  Runtime first(worker_config(dir.path() / "worker-1", port, true, true));
  std::vector<std::string> ids;
  for (const auto& d : c.documents) {
    const auto s = first.store_document(d);
    EXPECT_EQ(s.source, "computed");
    EXPECT_FALSE(s.already_stored);
    EXPECT_TRUE(s.on_storage_node);  // synchronous: on the node now, no waiting
    ids.push_back(s.id);
  }
  for (const auto& k : chunk_keys(first, req)) EXPECT_TRUE(node.contains(k));
  const auto again = first.store_document(c.documents[0]);
  EXPECT_TRUE(again.already_stored);
  EXPECT_EQ(again.source, "local");
  const auto from_first = first.run(req);
  ASSERT_NE(from_first.finish_reason, "error") << from_first.error;
  EXPECT_EQ(from_first.chunks_from("ram"), 3);

  Runtime second(worker_config(dir.path() / "worker-2", port, /*ram=*/true, /*ssd=*/false));
  for (size_t i = 0; i < c.documents.size(); ++i) {
    const auto s = second.store_document(c.documents[i]);
    EXPECT_EQ(s.source, "remote");
    EXPECT_TRUE(s.on_storage_node);
    EXPECT_EQ(s.id, ids[i]);
  }
  const auto from_second = second.run(req);
  EXPECT_EQ(from_second.chunks_from("ram"), 3);  // loaded whole into RAM by the store
  EXPECT_EQ(from_second.tokens, from_first.tokens);

  // Erasing on one worker removes the node's copy; the other worker keeps its own.
  EXPECT_TRUE(second.erase_document(ids[0]));
  EXPECT_FALSE(node.contains(chunk_keys(first, req)[0]));
  EXPECT_TRUE(first.erase_document(ids[0]));   // its RAM and SSD
  EXPECT_FALSE(first.erase_document(ids[0]));  // nowhere any more

  // The node gone: the document is computed and stored here, not on the node.
  server.reset();
  Runtime third(worker_config(dir.path() / "worker-3", port, true, false));
  const auto alone = third.store_document(c.documents[1]);
  EXPECT_EQ(alone.source, "computed");
  EXPECT_FALSE(alone.on_storage_node);
  EXPECT_TRUE(third.store_document(c.documents[1]).already_stored);
}

}  // namespace
}  // namespace bs
