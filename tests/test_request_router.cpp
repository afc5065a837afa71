// The frontend's routing choice over a cluster view built by hand (the monitor's
// job is tested in test_cluster_control): KV-aware sends a request where most of
// its document tokens are held, ties and full workers go by load, round robin takes
// turns, down or excluded workers get nothing, and a routed request's chunks count
// as held by its worker before the next report says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "actors/cluster/request_router.h"
#include "storage/chunk_kv.h"

namespace bs {
namespace {

constexpr uint64_t kFingerprint = 7;

std::vector<int32_t> doc(int seed, int n = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = seed * 1000 + i;
  return t;
}

std::shared_ptr<const HeldKeys> held_keys(const std::vector<std::vector<int32_t>>& docs) {
  std::vector<ChunkKey> keys;
  for (const auto& d : docs) keys.push_back(make_chunk_key(kFingerprint, KvKind::Chunk, d));
  std::sort(keys.begin(), keys.end(), chunk_key_less);
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return std::make_shared<const HeldKeys>(1, 1, std::move(keys));
}

MemberView worker(const std::string& name, const std::vector<std::vector<int32_t>>& held, int64_t load = 0,
                  bool up = true) {
  MemberView m;
  m.member = {name, "worker", "127.0.0.1", 1};
  m.up = up;
  m.report.node = name;
  m.report.role = "worker";
  m.report.fingerprint = kFingerprint;
  m.report.in_flight = load;
  m.report.max_requests = 4;
  m.report.max_queue = 4;
  m.held = held_keys(held);
  return m;
}

MemberView storage_node(const std::string& name, const std::vector<std::vector<int32_t>>& held, bool up = true) {
  MemberView m;
  m.member = {name, "storage", "127.0.0.1", 2};
  m.up = up;
  m.report.node = name;
  m.report.role = "storage";
  m.held = held_keys(held);
  return m;
}

TEST(RequestRouter, KvAwareGoesWhereMostDocumentTokensAre) {
  ClusterView v;
  v.members = {worker("w1", {doc(1)}), worker("w2", {doc(2, 300), doc(3)}), worker("w3", {})};
  RequestRouter r(RoutingPolicy::kv_aware);
  auto c = r.choose(v, {doc(2, 300), doc(1)});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->worker, "w2");
  EXPECT_EQ(c->held_tokens, 300);
  c = r.choose(v, {doc(1), doc(9)});
  EXPECT_EQ(c->worker, "w1");
  EXPECT_EQ(c->held_tokens, 100);
}

// What an up storage node holds counts for a worker with the remote tier (it loads
// instead of computing), less than what it holds itself; a down node counts nothing.
TEST(RequestRouter, StorageHoldingsCountForWorkersThatLoadFromStorage) {
  ClusterView v;
  v.members = {worker("w1", {doc(1)}), worker("w2", {}), storage_node("s1", {doc(2, 300), doc(1)})};
  v.members[1].report.uses_storage = true;
  RequestRouter r(RoutingPolicy::kv_aware);
  // w1 holds doc 1 itself (100 tokens) but has no remote tier; w2 loads both
  // documents from s1 (400 tokens): w2 computes less.
  auto c = r.choose(v, {doc(2, 300), doc(1)});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->worker, "w2");
  EXPECT_EQ(c->held_tokens, 0);
  EXPECT_EQ(c->storage_tokens, 400);
  // Both reach s1: the same left to compute, and w1 holds doc 1 itself.
  v.members[0].report.uses_storage = true;
  c = r.choose(v, {doc(2, 300), doc(1)});
  EXPECT_EQ(c->worker, "w1");
  EXPECT_EQ(c->held_tokens, 100);
  EXPECT_EQ(c->storage_tokens, 300);
  // s1 down: its keys count for nobody.
  v.members[2].up = false;
  v.members[0].report.uses_storage = false;
  c = r.choose(v, {doc(2, 300), doc(1)});
  EXPECT_EQ(c->worker, "w1");
  EXPECT_EQ(c->storage_tokens, 0);
  // s1 up again, the request's documents not on it: nothing from storage.
  v.members[2].up = true;
  c = r.choose(v, {doc(8), doc(9)});
  EXPECT_EQ(c->storage_tokens, 0);
}

TEST(RequestRouter, TiesGoToTheLeastLoadedAndFullWorkersAreAvoided) {
  ClusterView v;
  v.members = {worker("w1", {doc(1)}, 3), worker("w2", {doc(1)}, 1)};
  RequestRouter r(RoutingPolicy::kv_aware);
  EXPECT_EQ(r.choose(v, {doc(1)})->worker, "w2");
  // w2 full (in flight + queued >= max_requests + max_queue): w1 even without the document.
  v.members[1].report.in_flight = 8;
  v.members[0].held = held_keys({});
  auto c = r.choose(v, {doc(1)});
  EXPECT_EQ(c->worker, "w1");
  EXPECT_FALSE(c->overloaded);
  v.members[0].report.in_flight = 8;
  c = r.choose(v, {doc(1)});
  EXPECT_TRUE(c->overloaded) << "everyone full: still an answer (the worker queues or refuses)";
}

TEST(RequestRouter, DownAndExcludedWorkersGetNothing) {
  ClusterView v;
  v.members = {worker("w1", {doc(1)}, 0, false), worker("w2", {})};
  RequestRouter r(RoutingPolicy::kv_aware);
  EXPECT_EQ(r.choose(v, {doc(1)})->worker, "w2");
  EXPECT_FALSE(r.choose(v, {doc(1)}, {"w2"}).has_value());
  MemberView storage;
  storage.member = {"s", "storage", "127.0.0.1", 2};
  storage.up = true;
  ClusterView only_storage;
  only_storage.members = {storage};
  EXPECT_FALSE(r.choose(only_storage, {}).has_value());
}

TEST(RequestRouter, RoundRobinTakesTurnsWhateverIsHeld) {
  ClusterView v;
  v.members = {worker("w1", {doc(1)}), worker("w2", {}), worker("w3", {})};
  RequestRouter r(RoutingPolicy::round_robin);
  std::map<std::string, int> n;
  for (int i = 0; i < 9; ++i) ++n[r.choose(v, {doc(1)})->worker];
  EXPECT_EQ(n["w1"], 3);
  EXPECT_EQ(n["w2"], 3);
  EXPECT_EQ(n["w3"], 3);
}

// A cluster view lists the frontend and the storage node too: the turns go over
// the workers alone, strictly alternating (a turn counted over every member gave
// one worker three requests of four).
TEST(RequestRouter, RoundRobinAlternatesWithOtherRolesInTheView) {
  ClusterView v;
  MemberView frontend, storage;
  frontend.member = {"frontend", "frontend", "127.0.0.1", 1};
  storage.member = {"storage", "storage", "127.0.0.1", 2};
  frontend.up = storage.up = true;
  v.members = {frontend, worker("w1", {}), worker("w2", {}), storage};
  RequestRouter r(RoutingPolicy::round_robin);
  std::string last;
  for (int i = 0; i < 8; ++i) {
    const std::string w = r.choose(v, {})->worker;
    EXPECT_NE(w, last) << "turn " << i;
    last = w;
  }
}

TEST(RequestRouter, RoutedChunksCountAsHeldUntilReportsCatchUp) {
  ClusterView v;
  v.members = {worker("w1", {}), worker("w2", {})};
  RequestRouter r(RoutingPolicy::kv_aware);
  const auto first = r.choose(v, {doc(5)});
  r.started(v, first->worker, {doc(5)});
  r.finished(first->worker);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.choose(v, {doc(5)})->worker, first->worker);
  EXPECT_EQ(r.in_flight(first->worker), 0);
  RequestRouter short_memory(RoutingPolicy::kv_aware, 0.0);
  short_memory.started(v, "w1", {doc(5)});
  short_memory.finished("w1");
  std::map<std::string, int> n;
  for (int i = 0; i < 4; ++i) ++n[short_memory.choose(v, {doc(5)})->worker];
  EXPECT_EQ(n["w1"], 2) << "expired: ties again, in turn";
}

}  // namespace
}  // namespace bs
