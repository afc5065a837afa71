// The remote tier over several storage nodes (storage/replicated_store.h), with real
// StorageServers on loopback: rendezvous placement (the same on every worker, spread
// over the nodes), writes on every replica, reads that go on when a replica is down
// (no miss, the same bytes), a write acknowledged with one replica down and counted,
// and a node that comes back empty repaired by read-through.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "storage/disk_store.h"
#include "storage/remote_store.h"
#include "storage/replicated_store.h"
#include "storage/storage_server.h"
#include "temp_dir.h"
#include "tests/random_kv.h"

namespace bs {
namespace {

using testing::key_of;
using testing::random_kv;

constexpr char kSecret[] = "the cluster secret";


// A storage node that can be stopped and started again on its port (its files kept,
// or wiped: a node that comes back empty).
struct Node {
  explicit Node(std::string n) : name(std::move(n)) { start(); }
  void start() {
    disk = std::make_unique<DiskKvStore>(dir.path().string(), int64_t{1} << 30, false);
    StorageServerOptions o;
    o.secret = kSecret;
    o.port = port;
    o.io_timeout_s = 2;
    server = std::make_unique<StorageServer>(*disk, o);
    port = server->port();
  }
  void stop() {
    server.reset();
    disk.reset();
  }
  void wipe() {
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) std::filesystem::remove_all(e.path());
  }
  ReplicaNode replica() const {
    RemoteStoreOptions c;
    c.port = port;
    c.secret = kSecret;
    c.connect_timeout_s = 1;
    c.io_timeout_s = 1;
    c.retry_after_s = 0.3;
    return {name, c};
  }
  std::string name;
  testing::TempDir dir{"bs_replica"};
  int port = 0;
  std::unique_ptr<DiskKvStore> disk;
  std::unique_ptr<StorageServer> server;
};

struct Cluster {
  Cluster() {
    for (const char* n : {"storage-a", "storage-b", "storage-c"}) nodes.push_back(std::make_unique<Node>(n));
  }
  std::unique_ptr<ReplicatedKvStore> worker(int replication = 2) const {
    std::vector<ReplicaNode> r;
    for (const auto& n : nodes) r.push_back(n->replica());
    return std::make_unique<ReplicatedKvStore>(std::move(r), replication);
  }
  std::vector<std::unique_ptr<Node>> nodes;
};

bool same(const ChunkKv& a, const ChunkKv& b) { return a.tokens == b.tokens && a.k == b.k && a.v == b.v; }

TEST(RemoteReplication, EveryWorkerPlacesAChunkOnTheSameNodesAndTheChunksSpread) {
  Cluster c;
  auto w1 = c.worker(), w2 = c.worker();
  std::mt19937 rng(1);
  std::map<size_t, int> held;
  for (int i = 0; i < 300; ++i) {
    std::vector<int32_t> tokens{static_cast<int32_t>(rng()), static_cast<int32_t>(rng())};
    const ChunkKey key = make_chunk_key(11, KvKind::Chunk, tokens);
    const auto r = w1->replicas(key);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_NE(r[0], r[1]);
    EXPECT_EQ(r, w2->replicas(key));
    for (size_t n : r) ++held[n];
  }
  // 600 copies over 3 nodes: each within 40% of its share.
  for (size_t n = 0; n < 3; ++n) EXPECT_NEAR(held[n], 200, 80) << c.nodes[n]->name;
  EXPECT_THROW(c.worker(4), std::invalid_argument);
  EXPECT_THROW(c.worker(0), std::invalid_argument);
  EXPECT_THROW(ReplicatedKvStore({}, 1), std::invalid_argument);
}

TEST(RemoteReplication, AWriteLandsOnEveryReplicaAndAReadSurvivesAReplicaDown) {
  Cluster c;
  auto w = c.worker();
  std::mt19937 rng(2);
  std::vector<std::shared_ptr<ChunkKv>> kvs;
  for (int i = 0; i < 6; ++i) {
    kvs.push_back(random_kv(rng, 4, 2, 40, 32));
    ASSERT_TRUE(w->put(key_of(*kvs.back()), kvs.back())) << w->last_error();
  }
  for (const auto& kv : kvs) {
    const auto r = w->replicas(key_of(*kv));
    for (size_t n = 0; n < 3; ++n)
      EXPECT_EQ(c.nodes[n]->disk->contains(key_of(*kv)), std::find(r.begin(), r.end(), n) != r.end())
          << c.nodes[n]->name;
  }
  EXPECT_EQ(w->replication_stats().under_replicated, 0);
  // One node gone: every chunk is still read, whole, and no read misses.
  c.nodes[0]->stop();
  for (const auto& kv : kvs) {
    auto got = w->get(key_of(*kv));
    ASSERT_TRUE(got) << w->last_error();
    EXPECT_TRUE(same(*got, *kv));
    auto reader = w->open_layers(key_of(*kv));
    ASSERT_TRUE(reader);
    std::vector<std::byte> k(static_cast<size_t>(kv->layer_bytes())), v(k.size());
    for (int l = 0; l < kv->n_layers; ++l) ASSERT_TRUE(reader->read_layer(l, k.data(), v.data()));
  }
  EXPECT_EQ(w->stats().misses, 0);
  // A write with a replica down: acknowledged (one copy is there), counted.
  std::shared_ptr<ChunkKv> kv;
  do kv = random_kv(rng, 4, 2, 40, 32);
  while (w->replicas(key_of(*kv))[0] != 0 && w->replicas(key_of(*kv))[1] != 0);
  EXPECT_TRUE(w->put(key_of(*kv), kv));
  EXPECT_EQ(w->replication_stats().under_replicated, 1);
  EXPECT_TRUE(w->contains(key_of(*kv)));
}

// A node that comes back empty is filled by what is read: each read that its better
// placed copy missed copies the chunk there from the replica that had it.
TEST(RemoteReplication, ANodeThatComesBackEmptyIsRepairedByReadThrough) {
  Cluster c;
  auto w = c.worker();
  std::mt19937 rng(3);
  std::vector<std::shared_ptr<ChunkKv>> on_a;  // chunks with a copy on storage-a
  while (on_a.size() < 4) {
    auto kv = random_kv(rng, 3, 2, 30, 32);
    const auto r = w->replicas(key_of(*kv));
    if (r[0] != 0 && r[1] != 0) continue;
    ASSERT_TRUE(w->put(key_of(*kv), kv));
    on_a.push_back(kv);
  }
  c.nodes[0]->stop();
  c.nodes[0]->wipe();
  c.nodes[0]->start();  // same port, nothing on its disk
  for (const auto& kv : on_a) EXPECT_FALSE(c.nodes[0]->disk->contains(key_of(*kv)));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past retry_after_s, if it was marked down
  for (const auto& kv : on_a) {
    auto got = w->get(key_of(*kv));
    ASSERT_TRUE(got) << w->last_error();
    EXPECT_TRUE(same(*got, *kv));
  }
  ASSERT_TRUE(w->wait_repairs_idle(10));
  for (const auto& kv : on_a) EXPECT_TRUE(c.nodes[0]->disk->contains(key_of(*kv)));
  const auto st = w->replication_stats();
  EXPECT_EQ(st.repairs, 4);
  EXPECT_EQ(st.repairs_failed, 0);
  // Repaired copies are whole: read from storage-a alone.
  for (const auto& kv : on_a) {
    auto got = w->node(0).get(key_of(*kv));
    ASSERT_TRUE(got);
    EXPECT_TRUE(same(*got, *kv));
  }
}

}  // namespace
}  // namespace bs
