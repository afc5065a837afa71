// TLS 1.3 with mutual authentication on the KV data path (storage/tls.h): certificates
// made by storage/tls.cpp and checked by the real `openssl` tool; a real StorageServer
// on loopback read through RemoteKvStore over TLS, byte for byte; every peer without
// a certificate of the cluster's CA, or not the member it must be, gets nothing (a
// worker from another CA, a node from another CA, a member posing as the node, a
// plaintext peer either way); a loopback proxy that flips one byte mid-transfer makes
// the read fail (the record's MAC), never a wrong slice; a node's idle timeout
// closes a pooled connection and the worker reconnects without counting the node down.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "storage/disk_store.h"
#include "storage/remote_store.h"
#include "storage/storage_server.h"
#include "storage/tls.h"
#include "tests/random_kv.h"
#include "tests/tls_fixture.h"

namespace bs {
namespace {

using testing::FlippingProxy;
using testing::key_of;
using testing::Pki;
using testing::random_kv;

namespace fs = std::filesystem;
constexpr char kSecret[] = "the cluster secret";

// `cmd`'s stdout and exit status (stderr folded in).
std::pair<std::string, int> run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {"", -1};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {out, WIFEXITED(st) ? WEXITSTATUS(st) : -1};
}

bool have_openssl_tool() { return run("openssl version").second == 0; }


// Whether `pred` holds within 3 s (the node counts a refusal on its own thread).
template <class Pred>
bool within_3s(Pred&& pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A storage node named "storage" on loopback, with TLS unless `files` is empty.
struct Node {
  Node(tls::Files files, std::vector<std::string> peers = {}, double idle_timeout_s = 120) {
    disk = std::make_unique<DiskKvStore>(dir.path().string(), int64_t{1} << 30, false);
    StorageServerOptions o;
    o.secret = kSecret;
    o.io_timeout_s = 1;
    o.idle_timeout_s = idle_timeout_s;
    o.tls = std::move(files);
    o.tls_peers = std::move(peers);
    server = std::make_unique<StorageServer>(*disk, o);
  }
  RemoteStoreOptions client(tls::Files files, int port = 0) const {
    RemoteStoreOptions c;
    c.port = port ? port : server->port();
    c.secret = kSecret;
    c.connect_timeout_s = 3;  // longer than the node's handshake deadline
    c.io_timeout_s = 1;
    c.retry_after_s = 0.2;
    c.tls = std::move(files);
    c.tls_peer_name = "storage";
    return c;
  }
  testing::TempDir dir{"bs_tls_node"};
  std::unique_ptr<DiskKvStore> disk;
  std::unique_ptr<StorageServer> server;
};

TEST(TlsFiles, TheCaAndAMemberCertificateAreWhatOpensslExpects) {
  if (!have_openssl_tool()) GTEST_SKIP() << "the openssl tool is not installed (tools/setup.sh installs it)";
  Pki pki;
  const auto f = pki.member("storage", {"127.0.0.3", "node3.example"});
  auto [verify, rc] = run("openssl verify -CAfile " + pki.path("ca.pem") + " " + f.cert);
  EXPECT_EQ(rc, 0) << verify;
  EXPECT_NE(verify.find(": OK"), std::string::npos) << verify;
  // The other CA does not vouch for it.
  std::tie(verify, rc) = run("openssl verify -CAfile " + pki.path("other-ca.pem") + " " + f.cert);
  EXPECT_NE(rc, 0) << verify;
  const auto [text, rc2] = run("openssl x509 -in " + f.cert + " -noout -text");
  ASSERT_EQ(rc2, 0) << text;
  EXPECT_NE(text.find("CN = storage"), std::string::npos) << text;
  EXPECT_NE(text.find("DNS:storage"), std::string::npos) << text;
  EXPECT_NE(text.find("IP Address:127.0.0.3"), std::string::npos) << text;
  EXPECT_NE(text.find("DNS:node3.example"), std::string::npos) << text;
  EXPECT_NE(text.find("TLS Web Server Authentication, TLS Web Client Authentication"), std::string::npos) << text;
  EXPECT_NE(text.find("CA:FALSE"), std::string::npos) << text;
  EXPECT_NE(text.find("prime256v1"), std::string::npos) << text;
  const auto [ca_text, rc3] = run("openssl x509 -in " + pki.path("ca.pem") + " -noout -text");
  ASSERT_EQ(rc3, 0);
  EXPECT_NE(ca_text.find("CA:TRUE"), std::string::npos) << ca_text;
  // Private keys are the owner's alone.
  EXPECT_EQ(fs::status(f.key).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(fs::status(pki.path("ca.key")).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(tls::common_name(f.cert), "storage");
}

TEST(TlsFiles, CheckFilesNamesWhatIsWrong) {
  Pki pki;
  const auto good = pki.member("worker-1");
  EXPECT_NO_THROW(tls::check_files(good));
  const auto other = pki.member("worker-1", {"127.0.0.1"}, /*other=*/true);
  auto message = [](const tls::Files& f) {
    try {
      tls::check_files(f);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Signed by another CA than the cluster's.
  EXPECT_NE(message({good.ca, other.cert, other.key}).find("does not verify against the CA"), std::string::npos);
  // A key that is not the certificate's.
  EXPECT_NE(message({good.ca, good.cert, other.key}).find("is not the key of"), std::string::npos);
  // Missing, partly set, not PEM.
  EXPECT_NE(message({good.ca, good.cert, pki.path("nope.key")}).find("cannot open the private key"),
            std::string::npos);
  EXPECT_NE(message({good.ca, "", good.key}).find("cert is not set"), std::string::npos);
  EXPECT_NE(message({good.ca, good.key, good.key}).find("is not a PEM certificate"), std::string::npos);
  EXPECT_THROW(tls::make_ca("x", pki.path("x.pem"), pki.path("x.key"), 0), std::invalid_argument);
}

TEST(RemoteTls, EveryLayerRoundTripsOverMutualTls) {
  Pki pki;
  Node node(pki.member("storage"), {"worker-1"});
  std::mt19937 rng(1);
  auto kv = random_kv(rng, 5, 3, 200, 64);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  RemoteKvStore worker(node.client(pki.member("worker-1")));
  auto got = worker.get(key_of(*kv));
  ASSERT_TRUE(got) << worker.last_error();
  EXPECT_EQ(got->tokens, kv->tokens);
  EXPECT_EQ(got->k, kv->k);
  EXPECT_EQ(got->v, kv->v);
  // Write-back over the same link.
  auto kv2 = random_kv(rng, 5, 3, 50, 64);
  EXPECT_TRUE(worker.put(key_of(*kv2), kv2)) << worker.last_error();
  EXPECT_TRUE(node.disk->contains(key_of(*kv2)));
  EXPECT_TRUE(worker.reachable());
  const auto st = node.server->stats();
  EXPECT_EQ(st.tls_failures, 0);
  EXPECT_EQ(st.auth_failures, 0);
  EXPECT_EQ(st.layers_served, 5);
}

// Whoever the cluster's CA did not sign, or who is not the member it must be, gets
// nothing: no HELLO, no byte of KV; the node goes on serving its members.
TEST(RemoteTls, APeerWithoutTheClustersCertificateGetsNothing) {
  Pki pki;
  const auto worker_files = pki.member("worker-1");
  Node node(pki.member("storage"), {"worker-1", "worker-2"});
  std::mt19937 rng(2);
  auto kv = random_kv(rng, 3, 2, 32, 32);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  // A worker of another CA refuses the node first (it trusts its own CA). TLS 1.3
  // checks the client's certificate after the client's side of the handshake ended:
  // a member the node does not serve learns it from the node's alert, reading HELLO.
  struct Case {
    const char* name;
    tls::Files files;
    const char* error;  // in the worker's last_error
  };
  const std::vector<Case> cases = {
      {"a worker from another CA", pki.member("worker-1", {"127.0.0.1"}, true), "certificate verify failed"},
      {"a member of the CA the node does not serve", pki.member("intruder"), "alert"},
      {"a plaintext worker", {}, "closed by the node"},
  };
  int64_t refused = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RemoteKvStore w(node.client(c.files));
    EXPECT_EQ(w.open_layers(key_of(*kv)), nullptr);
    EXPECT_NE(w.last_error().find(c.error), std::string::npos) << w.last_error();
    ++refused;
    EXPECT_TRUE(within_3s([&] { return node.server->stats().tls_failures == refused; }))
        << node.server->stats().tls_failures;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past retry_after_s
    EXPECT_FALSE(w.put(key_of(*kv), kv));
    ++refused;
    EXPECT_TRUE(within_3s([&] { return node.server->stats().tls_failures == refused; }))
        << node.server->stats().tls_failures;
  }
  EXPECT_EQ(node.server->stats().layers_served, 0);
  EXPECT_EQ(node.server->stats().auth_failures, 0);  // none got as far as the secret
  // The member is served.
  RemoteKvStore member(node.client(worker_files));
  ASSERT_TRUE(member.get(key_of(*kv))) << member.last_error();
  // Counted once each slice's write completed, on the node's thread.
  EXPECT_TRUE(within_3s([&] { return node.server->stats().layers_served == 3; }))
      << node.server->stats().layers_served;
}

// The worker, in turn, trusts only the node its cluster file names, signed by its CA.
TEST(RemoteTls, AWorkerTrustsOnlyTheNodeItMeant) {
  Pki pki;
  const auto worker_files = pki.member("worker-1");
  std::mt19937 rng(3);
  auto kv = random_kv(rng, 3, 2, 32, 32);
  struct Case {
    const char* name;
    tls::Files node_files;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"a node from another CA", pki.member("storage", {"127.0.0.1"}, true), "certificate verify failed"},
      {"a member posing as the node", pki.member("worker-2"), "certificate verify failed"},
      {"a plaintext node", {}, "TLS handshake"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Node node(c.node_files);
    ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
    RemoteKvStore w(node.client(worker_files));
    EXPECT_EQ(w.open_layers(key_of(*kv)), nullptr);
    EXPECT_NE(w.last_error().find(c.error), std::string::npos) << w.last_error();
    EXPECT_EQ(node.server->stats().layers_served, 0);
  }
}

// A readiness probe (connect, close at once) is neither a TLS failure nor a log
// line; a peer that holds the connection without speaking TLS, then closes, is.
TEST(RemoteTls, APortProbeIsNoTlsFailure) {
  Pki pki;
  Node node(pki.member("storage"));
  auto connect = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(node.server->port()));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
  };
  for (int i = 0; i < 5; ++i) ::close(connect());
  EXPECT_TRUE(within_3s([&] { return node.server->stats().probes == 5; })) << node.server->stats().probes;
  EXPECT_EQ(node.server->stats().tls_failures, 0);
  const int silent = connect();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ::close(silent);
  EXPECT_TRUE(within_3s([&] { return node.server->stats().tls_failures == 1; })) << node.server->stats().tls_failures;
  EXPECT_EQ(node.server->stats().probes, 5);
}

// One byte flipped on the wire in the middle of the KV: the read fails (TLS's record
// MAC), the worker answers a miss, never the wrong bytes; the next read through a
// clean path succeeds.
TEST(RemoteTls, AByteFlippedOnTheWireIsAnErrorNeverAWrongAnswer) {
  Pki pki;
  Node node(pki.member("storage"));
  std::mt19937 rng(4);
  auto kv = random_kv(rng, 6, 3, 300, 64);  // ~115 KB a layer: the flip lands mid-stream
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  FlippingProxy proxy(node.server->port(), 400000);
  RemoteKvStore worker(node.client(pki.member("worker-1"), proxy.port()));
  auto reader = worker.open_layers(key_of(*kv));
  ASSERT_TRUE(reader) << worker.last_error();
  const size_t lb = static_cast<size_t>(kv->layer_bytes());
  std::vector<std::byte> k(lb), v(lb);
  int good = 0;
  for (int l = 0; l < kv->n_layers; ++l) {
    if (!reader->read_layer(l, k.data(), v.data())) break;
    ASSERT_EQ(0, std::memcmp(k.data(), kv->k_layer(l), lb)) << "layer " << l << " came back wrong";
    ASSERT_EQ(0, std::memcmp(v.data(), kv->v_layer(l), lb)) << "layer " << l << " came back wrong";
    ++good;
  }
  EXPECT_TRUE(proxy.flipped());
  EXPECT_LT(good, kv->n_layers) << "a flipped byte went unnoticed";
  EXPECT_FALSE(worker.last_error().empty());
  reader.reset();
  // The flip was once: after retry_after_s the node is reached again, whole.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto again = worker.get(key_of(*kv));
  ASSERT_TRUE(again) << worker.last_error();
  EXPECT_EQ(again->k, kv->k);
}

// The node closes a pooled connection idle past its idle timeout; the worker's next
// call opens a new one by itself (no failure, the node not counted down).
TEST(RemoteTls, AnIdleConnectionClosedByTheNodeIsReplacedQuietly) {
  Pki pki;
  Node node(pki.member("storage"), {}, /*idle_timeout_s=*/0.3);
  std::mt19937 rng(5);
  auto kv = random_kv(rng, 2, 2, 16, 32);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  auto opt = node.client(pki.member("worker-1"));
  opt.idle_timeout_s = 60;  // the worker would keep it
  RemoteKvStore worker(opt);
  ASSERT_TRUE(worker.contains(key_of(*kv))) << worker.last_error();
  EXPECT_EQ(node.server->stats().connections, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  ASSERT_TRUE(worker.contains(key_of(*kv))) << worker.last_error();
  EXPECT_EQ(node.server->stats().connections, 2);
  EXPECT_TRUE(worker.last_error().empty()) << worker.last_error();
}

TEST(RemoteTls, FilesThatDoNotLoadAreAnErrorAtStart) {
  Pki pki;
  auto bad = pki.member("storage");
  bad.key = pki.member("other").key;  // not the certificate's key
  DiskKvStore disk((pki.dir.path() / "kv").string(), int64_t{1} << 20, false);
  StorageServerOptions o;
  o.secret = kSecret;
  o.tls = bad;
  EXPECT_THROW(StorageServer(disk, o), std::runtime_error);
  RemoteStoreOptions c;
  c.port = 1;
  c.secret = kSecret;
  c.tls = bad;
  EXPECT_THROW(RemoteKvStore{c}, std::runtime_error);
}

}  // namespace
}  // namespace bs
