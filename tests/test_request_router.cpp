// The frontend's routing choice over a cluster view built by hand (the monitor's
// job is tested in test_cluster_control): KV-aware sends a request where most of
// its document tokens are held, ties and full workers go by load, round robin takes
// turns, down or excluded workers get nothing, and a routed request's chunks count
// as held by its worker before the next report says so.
#include <gtest/gtest.h>

#include <map>

#include "actors/request_router.h"
#include "storage/chunk_kv.h"

namespace bs {
namespace {

constexpr uint64_t kFingerprint = 7;

std::vector<int32_t> doc(int seed, int n = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = seed * 1000 + i;
  return t;
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
  m.held = KeyBloom::sized_for(64);
  for (const auto& d : held) m.held.add(make_chunk_key(kFingerprint, KvKind::Chunk, d));
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

TEST(RequestRouter, TiesGoToTheLeastLoadedAndFullWorkersAreAvoided) {
  ClusterView v;
  v.members = {worker("w1", {doc(1)}, 3), worker("w2", {doc(1)}, 1)};
  RequestRouter r(RoutingPolicy::kv_aware);
  EXPECT_EQ(r.choose(v, {doc(1)})->worker, "w2");
  // w2 full (in flight + queued >= max_requests + max_queue): w1 even without the document.
  v.members[1].report.in_flight = 8;
  v.members[0].held = KeyBloom::sized_for(8);
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
