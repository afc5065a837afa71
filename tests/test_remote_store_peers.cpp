// The storage node against hostile and idle peers, spoken to by hand over raw sockets:
// a huge unauthenticated frame, a silent peer, connections beyond the limit, a thousand
// idle connections from one host; the members are served throughout.
#include "remote_store_test_helpers.h"

namespace bs {
namespace {

using namespace remote_store_test;  // NOLINT: the suites' shared helpers

// A raw socket with a receive timeout, for speaking to the node by hand.
struct RawClient {
  explicit RawClient(int port) : sock(io) {
    sock.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    timeval tv{5, 0};
    ::setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  // Reads until the node closes the connection (true) or 5 s pass (false).
  bool closed_by_peer() {
    std::array<uint8_t, 4096> buf{};
    for (;;) {
      boost::system::error_code ec;
      sock.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::eof || ec == asio::error::connection_reset) return true;
      if (ec) return false;  // timeout
    }
  }
  asio::io_context io;
  tcp::socket sock;
};

TEST(RemoteStore, HugeUnauthenticatedFrameIsClosedAndOthersAreServed) {
  Node node;
  std::mt19937 rng(8);
  auto kv = random_kv(rng, 3, 2, 16, 32, kernels::TensorType::F16);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  RawClient raw(node.server->port());
  std::array<uint8_t, remote::kFrameHeaderBytes> hdr{};
  remote::encode_frame_header(hdr.data(), MsgType::Auth, 0x80000000u);  // 2 GiB
  asio::write(raw.sock, asio::buffer(hdr));
  const auto t0 = clock_type::now();
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_LT(since(t0), 3.0);
  EXPECT_EQ(node.server->stats().bad_frames, 1);

  RemoteKvStore remote(node.client());
  auto got = remote.get(key_of(*kv));
  ASSERT_TRUE(got) << remote.last_error();
  EXPECT_TRUE(same(*got, *kv));
}

TEST(RemoteStore, SilentUnauthenticatedPeerIsClosedAfterTheTimeout) {
  StorageServerOptions o;
  o.io_timeout_s = 0.3;
  Node node(o);
  RawClient raw(node.server->port());  // reads HELLO, never answers
  const auto t0 = clock_type::now();
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_LT(since(t0), 3.0);
}

TEST(RemoteStore, ConnectionsBeyondTheLimitAreClosed) {
  StorageServerOptions o;
  o.max_connections = 1;
  Node node(o);
  RawClient first(node.server->port());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // accepted and counted
  RawClient second(node.server->port());
  EXPECT_TRUE(second.closed_by_peer());
  EXPECT_EQ(node.server->stats().connections, 1);
}

// One host that opens a thousand idle connections (raw TCP from 127.0.0.9, never a
// byte sent) holds at most max_connections_per_peer of them; the rest are closed at
// once and counted, and a member on another address is served meanwhile.
TEST(RemoteStore, AThousandIdleConnectionsFromOneHostLeaveTheMembersServed) {
  // Enough descriptors for the thousand (the soft limit may be 1024).
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  const rlim_t want = std::min<rlim_t>(lim.rlim_max, 4096);
  if (lim.rlim_cur < want) {
    lim.rlim_cur = want;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  const int n = static_cast<int>(std::min<rlim_t>(1000, want - 200));
  Node node;  // 64 connections in all, 32 per peer
  std::mt19937 rng(21);
  auto kv = random_kv(rng, 4, 2, 64, 64, kernels::TensorType::F16);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  std::vector<int> idle;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(0x7f000009);  // 127.0.0.9
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(static_cast<uint16_t>(node.server->port()));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0) << i;
    idle.push_back(fd);
  }
  // The node has taken them in: all but the per-peer share closed and counted.
  const auto t0 = clock_type::now();
  while (node.server->stats().connections + node.server->stats().refused_connections < n && since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto st = node.server->stats();
  EXPECT_EQ(st.connections, 32);
  EXPECT_EQ(st.refused_connections, n - 32);
  // A member (from 127.0.0.1) is served while the thousand sockets stay open.
  const auto t1 = clock_type::now();
  RemoteKvStore member(node.client());
  auto got = member.get(key_of(*kv));
  ASSERT_TRUE(got) << member.last_error();
  EXPECT_TRUE(same(*got, *kv));
  EXPECT_LT(since(t1), 2.0);
  for (int fd : idle) ::close(fd);
}
}  // namespace
}  // namespace bs
