// The cluster's control plane over real connections on loopback (storage/framed_link.h,
// plaintext and TLS 1.3): a member's control endpoint answers the frontend's monitor
// with its report and its holdings as deltas; a wrong secret, a proof for another
// member, a certificate of another CA or of a member that is not the frontend get
// nothing; a byte flipped on the wire is an error, never a report; a member that
// goes away or freezes is marked down within 3 x heartbeat and is picked up again by
// itself when it returns; a port probe is not a TLS failure.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "actors/cluster/cluster_monitor.h"
#include "actors/cluster/control_endpoint.h"
#include "actors/cluster/control_wire.h"
#include "storage/framed_link.h"
#include "tests/process_fixture.h"
#include "tests/tls_fixture.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;
using testing::FlippingProxy;
using testing::Pki;
constexpr const char* kSecret = "a-cluster-secret-of-some-length";

ControlEndpointOptions endpoint_options(int port, const std::string& secret = kSecret, tls::Files tls = {}) {
  return {.node = "worker-1", .host = "127.0.0.1", .port = port, .secret = secret, .heartbeat_interval_s = 0.2,
          .connection_timeout_s = 1.0, .tls = std::move(tls), .tls_peers = {"frontend"}};
}

ClusterMonitorOptions monitor_options(int port, const std::string& secret = kSecret, tls::Files tls = {}) {
  return {.self = "frontend", .secret = secret, .heartbeat_interval_s = 0.2, .connection_timeout_s = 1.0,
          .tls = std::move(tls), .members = {{.name = "worker-1", .role = "worker", .host = "127.0.0.1", .port = port}}};
}

NodeReport worker_report(std::atomic<int64_t>& queued) {
  NodeReport r;
  r.node = "worker-1";
  r.role = "worker";
  r.queued = queued.load();
  r.max_requests = 8;
  r.fingerprint = 42;
  return r;
}

// A member's key set the test changes; the log's change mark is a counter bumped
// with every change (as the tiers' counters move).
struct Keys {
  std::mutex mu;
  std::vector<ChunkKey> keys;
  std::atomic<uint64_t> mark{0};
  int64_t listed = 0;  // how often the log listed them
  void set(std::vector<ChunkKey> k) {
    std::lock_guard<std::mutex> lock(mu);
    keys = std::move(k);
    ++mark;
  }
  std::shared_ptr<HoldingsLog> log() {
    return std::make_shared<HoldingsLog>(
        [this] {
          std::lock_guard<std::mutex> lock(mu);
          ++listed;
          return keys;
        },
        [this] { return mark.load(); });
  }
};

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

const MemberView& w1(const ClusterView& v) { return *v.find("worker-1"); }

// The frontend's request of `to`, with a proof made for `proof_to`.
ControlRequest request_for(const std::string& to, const std::string& proof_to) {
  ControlRequest req;
  req.from = "frontend";
  req.to = to;
  req.unix_ms = unix_ms_now();
  req.proof = control_proof(kSecret, req.from, proof_to, req.unix_ms);
  return req;
}

FramedClientOptions client_options(int port, tls::Files tls = {}) {
  FramedClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.tls = std::move(tls);
  o.peer_name = "worker-1";
  return o;
}

TEST(ClusterControl, MonitorGetsTheMembersReportAndItsHoldingsAsDeltas) {
  std::atomic<int64_t> queued{3};
  Keys keys;
  keys.set({{1, 2}, {5, 6}});
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port), [&] { return worker_report(queued); }, keys.log());
  EXPECT_EQ(endpoint.port(), port);
  ClusterMonitor monitor(monitor_options(port));
  ASSERT_TRUE(monitor.wait_all_up(10));
  auto v = monitor.view();
  EXPECT_EQ(w1(*v).report.node, "worker-1");
  EXPECT_EQ(w1(*v).report.queued, 3);
  EXPECT_EQ(w1(*v).report.fingerprint, 42u);
  EXPECT_EQ(w1(*v).report.chunks_held, 2);
  EXPECT_TRUE(w1(*v).held->contains({1, 2}));
  EXPECT_TRUE(w1(*v).held->contains({5, 6}));
  EXPECT_FALSE(w1(*v).held->contains({3, 4}));
  // Reports keep coming every heartbeat: a change on the member shows up; with the
  // holdings unchanged, the next reports carry no keys at all.
  queued = 7;
  ASSERT_TRUE(eventually(monitor, 3, [](const ClusterView& cv) { return w1(cv).report.queued == 7; }));
  v = monitor.view();
  EXPECT_FALSE(w1(*v).report.holdings.full);
  EXPECT_TRUE(w1(*v).report.holdings.added.empty());
  EXPECT_TRUE(w1(*v).report.holdings.removed.empty());
  EXPECT_EQ(w1(*v).held->size(), 2u);
  {
    std::lock_guard<std::mutex> lock(keys.mu);
    EXPECT_EQ(keys.listed, 1) << "the keys are listed again only when the change mark moves";
  }
  // One key evicted, one added: a delta of exactly those two.
  keys.set({{1, 2}, {7, 8}});
  ASSERT_TRUE(eventually(monitor, 3, [](const ClusterView& cv) { return w1(cv).held->contains({7, 8}); }));
  v = monitor.view();
  EXPECT_FALSE(w1(*v).held->contains({5, 6}));
  EXPECT_TRUE(w1(*v).held->contains({1, 2}));
  EXPECT_EQ(w1(*v).held->size(), 2u);
  const HoldingsDelta& d = w1(*v).report.holdings;
  EXPECT_FALSE(d.full);
  ASSERT_EQ(d.added.size(), 1u);
  EXPECT_EQ(d.added[0], (ChunkKey{7, 8}));
  ASSERT_EQ(d.removed.size(), 1u);
  EXPECT_EQ(d.removed[0], (ChunkKey{5, 6}));
  EXPECT_EQ(endpoint.refused(), 0);
}

TEST(ClusterControl, WrongSecretGetsNothing) {
  std::atomic<int64_t> queued{0};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port), [&] { return worker_report(queued); });
  ClusterMonitor monitor(monitor_options(port, "not-the-cluster-secret-at-all"));
  EXPECT_FALSE(monitor.wait_all_up(1.5));
  auto v = monitor.view();
  EXPECT_FALSE(w1(*v).up);
  EXPECT_NE(w1(*v).last_error.find("refused"), std::string::npos) << w1(*v).last_error;
  EXPECT_EQ(w1(*v).report.node, "") << "no report may reach a peer without the secret";
  EXPECT_GT(endpoint.refused(), 0);
}

// A proof names its receiver: one made for worker-2 opens nothing on worker-1.
TEST(ClusterControl, AProofForAnotherMemberGetsNothing) {
  std::atomic<int64_t> queued{0};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port), [&] { return worker_report(queued); });
  FramedClient client(client_options(port));
  ControlRequest req = request_for("worker-2", "worker-2");
  std::string why;
  auto reply = client.call(encode_control_request(req), 2, 2, &why);
  ASSERT_TRUE(reply) << why;
  EXPECT_FALSE(decode_report_reply(*reply, &why));
  EXPECT_NE(why.find("refused"), std::string::npos) << why;
  // The same proof sent to worker-1 as if for it: refused too.
  req.to = "worker-1";
  reply = client.call(encode_control_request(req), 2, 2, &why);
  ASSERT_TRUE(reply) << why;
  EXPECT_FALSE(decode_report_reply(*reply, &why));
  EXPECT_EQ(endpoint.refused(), 2);
  // Its own proof: answered.
  req = request_for("worker-1", "worker-1");
  reply = client.call(encode_control_request(req), 2, 2, &why);
  ASSERT_TRUE(reply) << why;
  EXPECT_TRUE(decode_report_reply(*reply, &why)) << why;
}

TEST(ClusterControl, MemberGoneIsDownWithinThreeHeartbeatsAndComesBackByItself) {
  std::atomic<int64_t> queued{0};
  const int port = testing::free_port();
  auto endpoint = std::make_unique<ControlEndpoint>(endpoint_options(port), [&] { return worker_report(queued); });
  ClusterMonitor monitor(monitor_options(port));
  ASSERT_TRUE(monitor.wait_all_up(10));
  const auto gone = clock_type::now();
  endpoint.reset();
  ASSERT_TRUE(eventually(monitor, 5, [](const ClusterView& cv) { return !w1(cv).up; }));
  const double noticed_s = std::chrono::duration<double>(clock_type::now() - gone).count();
  EXPECT_LE(noticed_s, 3 * 0.2 + 0.3) << "heartbeat 0.2 s";
  EXPECT_EQ(monitor.view()->find("worker-1")->downs, 1);
  // Back on the same port: picked up again without anyone asking.
  endpoint = std::make_unique<ControlEndpoint>(endpoint_options(port), [&] { return worker_report(queued); });
  EXPECT_TRUE(eventually(monitor, 10, [](const ClusterView& cv) { return w1(cv).up; }));
}

// A member that stops answering but keeps its connection (frozen: here its report
// blocks) is down within 3 x heartbeat, and up again once it answers in time.
TEST(ClusterControl, AFrozenMemberIsDownWithinThreeHeartbeats) {
  std::atomic<int64_t> queued{0};
  std::atomic<bool> frozen{false};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port), [&] {
    while (frozen.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return worker_report(queued);
  });
  ClusterMonitor monitor(monitor_options(port));
  ASSERT_TRUE(monitor.wait_all_up(10));
  const auto t0 = clock_type::now();
  frozen = true;
  ASSERT_TRUE(eventually(monitor, 5, [](const ClusterView& cv) { return !w1(cv).up; }));
  EXPECT_LE(std::chrono::duration<double>(clock_type::now() - t0).count(), 3 * 0.2 + 0.3);
  // Its link's deadline (no reply within 2 x heartbeat) or the monitor's own count.
  EXPECT_NE(monitor.view()->find("worker-1")->last_error.find("within 0.4 s"), std::string::npos)
      << monitor.view()->find("worker-1")->last_error;
  frozen = false;
  EXPECT_TRUE(eventually(monitor, 5, [](const ClusterView& cv) { return w1(cv).up; }));
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
    return w1(cv).last_error.find("report failed: the tiers are gone") != std::string::npos;
  })) << monitor.view()->find("worker-1")->last_error;
  EXPECT_FALSE(monitor.view()->find("worker-1")->up);
  failing = false;
  EXPECT_TRUE(monitor.wait_all_up(10)) << "the endpoint survived the failing reports";
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

// ---- TLS ----

TEST(ClusterControlTls, TheFrontendWithTheClusterCertificateGetsTheReport) {
  Pki pki;
  std::atomic<int64_t> queued{4};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port, kSecret, pki.member("worker-1")),
                           [&] { return worker_report(queued); });
  ClusterMonitor monitor(monitor_options(port, kSecret, pki.member("frontend")));
  ASSERT_TRUE(monitor.wait_all_up(10)) << monitor.view()->find("worker-1")->last_error;
  EXPECT_EQ(monitor.view()->find("worker-1")->report.queued, 4);
  EXPECT_EQ(endpoint.tls_failures(), 0);
}

// Every peer that is not the frontend of this cluster's CA gets nothing: a frontend
// certificate from another CA, a member of this CA that is not the frontend, a
// plaintext peer; and a frontend that reaches a control port whose certificate
// names another member does not talk to it.
TEST(ClusterControlTls, EveryoneElseGetsNothing) {
  Pki pki;
  std::atomic<int64_t> queued{0};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port, kSecret, pki.member("worker-1")),
                           [&] { return worker_report(queued); });
  struct Case {
    const char* what;
    tls::Files files;
  };
  const Case cases[] = {{"a frontend of another CA", pki.stranger("frontend")},
                        {"worker-2 posing as the frontend", pki.member("worker-2")},
                        {"plaintext", {}}};
  int64_t failures = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    ClusterMonitorOptions mo = monitor_options(port, kSecret, c.files);
    mo.self = "frontend";
    ClusterMonitor monitor(mo);
    EXPECT_FALSE(monitor.wait_all_up(1.0));
    const MemberView& m = *monitor.view()->find("worker-1");
    EXPECT_FALSE(m.up);
    EXPECT_EQ(m.report.node, "");
    EXPECT_NE(m.last_error, "");
    ASSERT_TRUE(testing::eventually_true(3, [&] { return endpoint.tls_failures() > failures; }));
    failures = endpoint.tls_failures();
  }
  EXPECT_EQ(endpoint.refused(), 0) << "no request got as far as the proof check";
  // The monitor checks the member's name: worker-2's certificate on worker-1's port.
  const int port2 = testing::free_port();
  ControlEndpoint impostor(endpoint_options(port2, kSecret, pki.member("worker-2")),
                           [&] { return worker_report(queued); });
  ClusterMonitor monitor(monitor_options(port2, kSecret, pki.member("frontend")));
  EXPECT_FALSE(monitor.wait_all_up(1.0));
  EXPECT_NE(monitor.view()->find("worker-1")->last_error.find("TLS"), std::string::npos)
      << monitor.view()->find("worker-1")->last_error;
}

// One byte of the member's answer flipped on the way: the record's MAC fails, the
// monitor counts an error, never a report with the flipped byte in it.
TEST(ClusterControlTls, AByteFlippedOnTheWireIsAnErrorNeverAReport) {
  Pki pki;
  std::atomic<int64_t> queued{5};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port, kSecret, pki.member("worker-1")),
                           [&] { return worker_report(queued); });
  const tls::Files frontend = pki.member("frontend");
  // Past the handshake (a few KiB from the member): into the first answer.
  std::string why;
  int64_t handshake_bytes = 0;
  {
    FlippingProxy measure(port, int64_t{1} << 40);  // flips nothing
    FramedClient c(client_options(measure.port(), frontend));
    const ControlRequest req = request_for("worker-1", "worker-1");
    ASSERT_TRUE(c.call(encode_control_request(req), 2, 2, &why)) << why;
    handshake_bytes = measure.bytes_from_server();
  }
  ASSERT_GT(handshake_bytes, 100);
  FlippingProxy proxy(port, handshake_bytes + 40);
  FramedClient c(client_options(proxy.port(), frontend));
  const ControlRequest req = request_for("worker-1", "worker-1");
  EXPECT_TRUE(c.call(encode_control_request(req), 2, 2, &why)) << "the first answer is clean: " << why;
  EXPECT_FALSE(proxy.flipped());
  const auto second = c.call(encode_control_request(req), 2, 2, &why);
  EXPECT_TRUE(proxy.flipped());
  EXPECT_FALSE(second) << "a flipped byte must not come through";
  EXPECT_FALSE(why.empty());
}

// A readiness probe (connect, close at once without a byte) is neither a TLS failure
// nor a log line; a peer that sends something that is not TLS, or holds the
// connection silent, is.
TEST(ClusterControlTls, APortProbeIsNoTlsFailure) {
  Pki pki;
  std::atomic<int64_t> queued{0};
  const int port = testing::free_port();
  ControlEndpoint endpoint(endpoint_options(port, kSecret, pki.member("worker-1")),
                           [&] { return worker_report(queued); });
  // Connects, sends `send`, holds the connection `hold_ms`, closes.
  auto connect_and = [&](const std::string& send, int hold_ms = 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    if (!send.empty()) {
      ASSERT_EQ(::write(fd, send.data(), send.size()), static_cast<ssize_t>(send.size()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    ::close(fd);
  };
  for (int i = 0; i < 5; ++i) connect_and("");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(endpoint.tls_failures(), 0);
  connect_and("GET / HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(testing::eventually_true(3, [&] { return endpoint.tls_failures() == 1; }));
  // Held silent past the probe's half second, then closed: a failure too.
  connect_and("", 700);
  EXPECT_TRUE(testing::eventually_true(3, [&] { return endpoint.tls_failures() == 2; }));
}

}  // namespace
}  // namespace bs
