// The cluster's control plane over real CAF middleman connections on loopback:
// a member's control endpoint answers the frontend's monitor with its report; a
// wrong secret gets nothing; a member that goes away is marked down within
// 3 x heartbeat and is picked up again by itself when it returns on its port.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "actors/cluster_monitor.h"
#include "actors/control_endpoint.h"
#include "tests/process_fixture.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr const char* kSecret = "a-cluster-secret-of-some-length";

ControlEndpointOptions endpoint_options(int port, const std::string& secret = kSecret) {
  return {.node = "worker-1", .host = "127.0.0.1", .port = port, .secret = secret, .heartbeat_interval_s = 0.2,
          .connection_timeout_s = 1.0};
}

ClusterMonitorOptions monitor_options(int port, const std::string& secret = kSecret) {
  return {.self = "frontend", .secret = secret, .heartbeat_interval_s = 0.2, .connection_timeout_s = 1.0,
          .members = {{.name = "worker-1", .role = "worker", .host = "127.0.0.1", .port = port}}};
}

NodeReport worker_report(std::atomic<int64_t>& queued) {
  NodeReport r;
  r.node = "worker-1";
  r.role = "worker";
  r.queued = queued.load();
  r.max_requests = 8;
  r.fingerprint = 42;
  auto bloom = KeyBloom::sized_for(10);
  bloom.add({1, 2});
  r.bloom_words = bloom.words();
  r.bloom_probes = bloom.probes();
  r.chunks_held = 1;
  return r;
}

// Polls the monitor's view until pred holds or timeout_s passes.
template <class Pred>
bool eventually(const ClusterMonitor& m, double timeout_s, Pred pred) {
  const auto deadline = clock_type::now() + std::chrono::duration<double>(timeout_s);
  while (clock_type::now() < deadline) {
    if (pred(*m.view())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred(*m.view());
}

TEST(ClusterControl, MonitorGetsTheMembersReportAndItsHeldKeys) {
  std::atomic<int64_t> queued{3};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port), [&] { return worker_report(queued); });
  EXPECT_EQ(endpoint.port(), port);
  ClusterMonitor monitor(monitor_options(port));
  ASSERT_TRUE(monitor.wait_all_up(10));
  auto v = monitor.view();
  const MemberView* w = v->find("worker-1");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->report.node, "worker-1");
  EXPECT_EQ(w->report.queued, 3);
  EXPECT_EQ(w->report.fingerprint, 42u);
  EXPECT_TRUE(w->held.may_contain({1, 2}));
  EXPECT_FALSE(w->held.may_contain({3, 4}));
  // Reports keep coming every heartbeat: a change on the member shows up.
  queued = 7;
  EXPECT_TRUE(eventually(monitor, 3, [](const ClusterView& cv) { return cv.find("worker-1")->report.queued == 7; }));
  EXPECT_EQ(endpoint.refused(), 0);
}

TEST(ClusterControl, WrongSecretGetsNothing) {
  std::atomic<int64_t> queued{0};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port), [&] { return worker_report(queued); });
  ClusterMonitor monitor(monitor_options(port, "not-the-cluster-secret-at-all"));
  EXPECT_FALSE(monitor.wait_all_up(1.5));
  auto v = monitor.view();
  EXPECT_FALSE(v->find("worker-1")->up);
  EXPECT_NE(v->find("worker-1")->last_error.find("refused"), std::string::npos) << v->find("worker-1")->last_error;
  EXPECT_EQ(v->find("worker-1")->report.node, "") << "no report may reach a peer without the secret";
  EXPECT_GT(endpoint.refused(), 0);
}

TEST(ClusterControl, MemberGoneIsDownWithinThreeHeartbeatsAndComesBackByItself) {
  std::atomic<int64_t> queued{0};
  const int port = testing::free_port();
  auto endpoint = std::make_unique<ControlEndpoint>(endpoint_options(port), [&] { return worker_report(queued); });
  ClusterMonitor monitor(monitor_options(port));
  ASSERT_TRUE(monitor.wait_all_up(10));
  const auto gone = clock_type::now();
  endpoint.reset();
  ASSERT_TRUE(eventually(monitor, 5, [](const ClusterView& cv) { return !cv.find("worker-1")->up; }));
  const double noticed_s = std::chrono::duration<double>(clock_type::now() - gone).count();
  EXPECT_LE(noticed_s, 3 * 0.2 + 0.3) << "heartbeat 0.2 s";
  EXPECT_EQ(monitor.view()->find("worker-1")->downs, 1);
  // Back on the same port: picked up again without anyone asking.
  endpoint = std::make_unique<ControlEndpoint>(endpoint_options(port), [&] { return worker_report(queued); });
  EXPECT_TRUE(eventually(monitor, 10, [](const ClusterView& cv) { return cv.find("worker-1")->up; }));
}

TEST(ClusterControl, AReportThatThrowsIsAnErrorAnswerAndTheEndpointGoesOn) {
  std::atomic<int64_t> queued{0};
  std::atomic<bool> failing{true};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port), [&] {
    if (failing.load()) throw std::runtime_error("the tiers are gone");
    return worker_report(queued);
  });
  ClusterMonitor monitor(monitor_options(port));
  EXPECT_TRUE(eventually(monitor, 5, [](const ClusterView& cv) {
    return cv.find("worker-1")->last_error.find("report failed: the tiers are gone") != std::string::npos;
  })) << monitor.view()->find("worker-1")->last_error;
  EXPECT_FALSE(monitor.view()->find("worker-1")->up);
  failing = false;
  EXPECT_TRUE(monitor.wait_all_up(10)) << "the agent survived the failing reports";
}

TEST(ClusterControl, UnreachableMemberIsDownNotAHang) {
  const int port = testing::free_port();  // nothing listens there
  const auto start = clock_type::now();
  {
    ClusterMonitor monitor(monitor_options(port));
    EXPECT_FALSE(monitor.wait_all_up(1.0));
    EXPECT_FALSE(monitor.view()->find("worker-1")->up);
  }
  EXPECT_LT(std::chrono::duration<double>(clock_type::now() - start).count(), 5.0) << "shutdown must not wait on a dead peer";
}

}  // namespace
}  // namespace bs
