// The remote-disk tier: a real StorageServer on loopback over a DiskKvStore in a temp
// dir, read through RemoteKvStore with real sockets. Byte-exact round trips (every
// layer equal to the SSD tier's own read), pipelining and out-of-order reads, the
// whole KvStore surface, concurrency, and every failure (wrong secret,
// corrupted/truncated/dropped/stalled slices, a node that stops or freezes) being a
// miss within its deadline, never a wrong answer, a hang or a throw. Hostile and idle
// peers: test_remote_store_peers.cpp; the frame codec: test_remote_codec.cpp.
#include "remote_store_test_helpers.h"

namespace bs {
namespace {

using namespace remote_store_test;  // NOLINT: the suites' shared helpers

// ---------------------------------------------------------------- the tier over TCP

TEST(RemoteStore, RoundTripsEveryLayerOfSeveralEntries) {
  Node node;
  std::mt19937 rng(1);
  std::vector<std::shared_ptr<ChunkKv>> kvs;
  for (auto dtype : {kernels::TensorType::F16, kernels::TensorType::F32, kernels::TensorType::BF16,
                     kernels::TensorType::F16}) {
    kvs.push_back(random_kv(rng, 6, 3, 37 + static_cast<int>(kvs.size()) * 50, 64, dtype));
    ASSERT_TRUE(node.disk->put(key_of(*kvs.back()), kvs.back()));
  }
  for (int lif : {1, 4}) {
    auto opt = node.client();
    opt.layers_in_flight = lif;
    RemoteKvStore remote(opt);
    EXPECT_EQ(remote.name(), "remote");
    for (const auto& kv : kvs) {
      auto reader = remote.open_layers(key_of(*kv));
      ASSERT_TRUE(reader) << remote.last_error();
      EXPECT_EQ(reader->tokens(), kv->tokens);
      EXPECT_EQ(reader->n_layers(), kv->n_layers);
      EXPECT_EQ(reader->kv_heads(), kv->kv_heads);
      EXPECT_EQ(reader->head_dim(), kv->head_dim);
      EXPECT_EQ(reader->dtype(), kv->dtype);
      EXPECT_EQ(reader->layer_bytes(), kv->layer_bytes());
      EXPECT_EQ(reader->k_view(0), nullptr);
      expect_layers_equal(*reader, *node.disk, key_of(*kv), in_order(kv->n_layers));
    }
    EXPECT_EQ(remote.stats().hits, static_cast<int64_t>(kvs.size()));
    EXPECT_EQ(remote.last_error(), "");
  }
  EXPECT_EQ(node.server->stats().layers_served, 2 * 4 * 6);
  EXPECT_EQ(node.server->stats().auth_failures, 0);
}

TEST(RemoteStore, OutOfOrderReadsAreCorrect) {
  Node node;
  std::mt19937 rng(2);
  auto kv = random_kv(rng, 10, 2, 40, 32, kernels::TensorType::F16);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  for (int lif : {1, 3, 16}) {
    auto opt = node.client();
    opt.layers_in_flight = lif;
    RemoteKvStore remote(opt);
    auto reader = remote.open_layers(key_of(*kv));
    ASSERT_TRUE(reader);
    // Backwards, repeated, skipping ahead and back, then the rest.
    expect_layers_equal(*reader, *node.disk, key_of(*kv), {5, 0, 0, 9, 1, 2, 8, 3, 4, 6, 7, 2});
    EXPECT_FALSE(reader->read_layer(10, nullptr, nullptr));  // out of range: refused, nothing read
    EXPECT_FALSE(reader->read_layer(-1, nullptr, nullptr));
  }
}

TEST(RemoteStore, GetContainsPutEraseStatsBudget) {
  Node node;
  std::mt19937 rng(3);
  auto stored = random_kv(rng, 4, 3, 64, 64, kernels::TensorType::F16);
  ASSERT_TRUE(node.disk->put(key_of(*stored), stored));
  RemoteKvStore remote(node.client());
  EXPECT_EQ(remote.budget(), int64_t{1} << 30);
  EXPECT_TRUE(remote.reachable());

  auto got = remote.get(key_of(*stored));
  ASSERT_TRUE(got) << remote.last_error();
  EXPECT_TRUE(same(*got, *stored));
  EXPECT_TRUE(remote.contains(key_of(*stored)));

  auto missing = random_kv(rng, 4, 3, 10, 64, kernels::TensorType::F16);
  EXPECT_FALSE(remote.contains(key_of(*missing)));
  EXPECT_EQ(remote.get(key_of(*missing)), nullptr);
  EXPECT_EQ(remote.open_layers(key_of(*missing)), nullptr);
  EXPECT_EQ(remote.last_error(), "");  // a miss is not a failure

  // put lands in the node's store, byte-exact...
  auto pushed = random_kv(rng, 5, 3, 100, 64, kernels::TensorType::F32);
  ASSERT_TRUE(remote.put(key_of(*pushed), pushed)) << remote.last_error();
  EXPECT_EQ(node.server->stats().puts, 1);
  EXPECT_TRUE(node.disk->contains(key_of(*pushed)));
  EXPECT_TRUE(remote.contains(key_of(*pushed)));
  auto back = remote.get(key_of(*pushed));
  ASSERT_TRUE(back);
  EXPECT_TRUE(same(*back, *pushed));
  EXPECT_FALSE(remote.put(key_of(*pushed), nullptr));

  const StoreStats s = remote.stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.bytes, node.disk->stats().bytes);
  EXPECT_EQ(s.puts, 1);
  EXPECT_EQ(s.hits, 2);    // the two gets of entries that exist
  EXPECT_EQ(s.misses, 2);  // the missing key, twice
  EXPECT_EQ(s.corrupt, 0);

  // erase
  EXPECT_TRUE(remote.erase(key_of(*stored)));
  EXPECT_FALSE(remote.erase(key_of(*stored)));
  EXPECT_FALSE(node.disk->contains(key_of(*stored)));
  EXPECT_EQ(remote.stats().entries, 1);

  // ... and survives the node's restart (a new DiskKvStore on the same directory).
  const std::string dir = node.disk->dir();
  node.server->stop();
  node.server.reset();
  node.disk.reset();
  DiskKvStore reopened(dir, int64_t{1} << 30);
  auto e = reopened.get(key_of(*pushed));
  ASSERT_TRUE(e);
  EXPECT_TRUE(same(*e, *pushed));
  EXPECT_FALSE(reopened.contains(key_of(*stored)));
}

TEST(RemoteStore, RefusedPutsAndOversizedPuts) {
  StorageServerOptions o;
  o.accept_puts = false;
  Node node(o);
  std::mt19937 rng(4);
  auto kv = random_kv(rng, 2, 1, 8, 16, kernels::TensorType::F16);
  RemoteKvStore remote(node.client());
  EXPECT_FALSE(remote.put(key_of(*kv), kv));
  EXPECT_NE(remote.last_error().find("does not accept puts"), std::string::npos) << remote.last_error();
  EXPECT_FALSE(node.disk->contains(key_of(*kv)));
  EXPECT_TRUE(remote.reachable());  // an ERROR answer does not make the node "down"

  auto opt = node.client();
  opt.max_frame_bytes = 4096;
  RemoteKvStore small(opt);
  auto big = random_kv(rng, 2, 2, 64, 64, kernels::TensorType::F32);
  EXPECT_FALSE(small.put(key_of(*big), big));  // refused before sending
}

// The storage node's disk fills up (tests/faulty_file_io.h: a disk of N bytes under
// the node's SSD tier). Room for one and a half entries: a second put evicts the first
// and is stored. An entry twice that size cannot be made room for (all the node holds
// is smaller): the put is refused with an error that says so, nothing is evicted, the
// node stays up and serves what it holds.
TEST(RemoteStore, ANodeWhoseDiskIsFullMakesRoomOrRefusesThePutAndServesOn) {
  auto io = std::make_shared<testing::FaultyFileIo>();
  Node node({}, 0, io);
  std::mt19937 rng(12);
  auto a = random_kv(rng, 2, 2, 32, 16, kernels::TensorType::F16);
  auto b = random_kv(rng, 2, 2, 32, 16, kernels::TensorType::F16);
  auto c = random_kv(rng, 2, 2, 64, 16, kernels::TensorType::F16);
  RemoteKvStore remote(node.client());
  ASSERT_TRUE(remote.put(key_of(*a), a));
  const int64_t entry = static_cast<int64_t>(std::filesystem::file_size(node.disk->path_of(key_of(*a))));
  io->set_capacity(node.dir.path().string(), entry + entry / 2);
  ASSERT_TRUE(remote.put(key_of(*b), b)) << remote.last_error();
  EXPECT_FALSE(node.disk->contains(key_of(*a)));  // evicted to make room
  EXPECT_EQ(node.disk->stats().write_errors, 1);
  auto got = remote.get(key_of(*b));
  ASSERT_NE(got, nullptr);
  EXPECT_TRUE(same(*got, *b));
  EXPECT_FALSE(remote.put(key_of(*c), c));
  EXPECT_NE(remote.last_error().find("could not store the entry"), std::string::npos) << remote.last_error();
  EXPECT_TRUE(remote.reachable());
  got = remote.get(key_of(*b));  // what the node held before it is served on
  ASSERT_NE(got, nullptr);
  EXPECT_TRUE(same(*got, *b));
}

TEST(RemoteStore, ConcurrentReaders) {
  Node node;
  std::mt19937 rng(6);
  std::vector<std::shared_ptr<ChunkKv>> kvs;
  for (int i = 0; i < 6; ++i) {
    kvs.push_back(random_kv(rng, 8, 3, 60 + i, 64, i % 2 ? kernels::TensorType::F32 : kernels::TensorType::F16));
    ASSERT_TRUE(node.disk->put(key_of(*kvs.back()), kvs.back()));
  }
  auto opt = node.client();
  opt.max_connections = 3;  // fewer than the threads: they take turns
  opt.connect_timeout_s = 5;
  opt.io_timeout_s = 5;
  RemoteKvStore remote(opt);
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        const auto& kv = kvs[static_cast<size_t>((t + round) % kvs.size())];
        auto got = remote.get(key_of(*kv));
        (got && same(*got, *kv) ? ok : bad)++;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 20);
  EXPECT_EQ(bad.load(), 0) << remote.last_error();
}

TEST(RemoteStore, WrongSecretGetsNothing) {
  Node node;
  std::mt19937 rng(7);
  auto kv = random_kv(rng, 3, 2, 16, 32, kernels::TensorType::F16);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  RemoteKvStore intruder(node.client("not the secret"));
  EXPECT_EQ(intruder.open_layers(key_of(*kv)), nullptr);
  EXPECT_NE(intruder.last_error().find("refused"), std::string::npos) << intruder.last_error();
  EXPECT_FALSE(intruder.contains(key_of(*kv)));  // down now: no second attempt
  const auto st = node.server->stats();
  EXPECT_EQ(st.auth_failures, 1);
  EXPECT_EQ(st.layers_served, 0);
  EXPECT_EQ(st.bytes_served, 0);
  EXPECT_EQ(intruder.stats().misses, 1);
  EXPECT_THROW(RemoteKvStore(RemoteStoreOptions{}), std::invalid_argument);  // no secret
  StorageServerOptions no_secret;
  EXPECT_THROW(StorageServer(*node.disk, no_secret), std::invalid_argument);
}

// The disk has threads of its own: while a slow disk reads a slice (a throttle of
// 200 KB/s: ~1 s a 230 KB layer), the one network thread answers another
// connection's PING and CONTAINS at once.
TEST(RemoteStore, ASlowDiskHoldsNoNetworkThread) {
  StorageServerOptions o;
  o.threads = 1;
  o.disk_threads = 1;
  Node node(o);
  std::mt19937 rng(22);
  auto kv = random_kv(rng, 3, 3, 300, 64, kernels::TensorType::F16);  // 115 KB of K a layer
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  node.disk->set_read_throttle(200e3);
  auto opt = node.client();
  opt.io_timeout_s = 10;
  RemoteKvStore slow(opt);
  auto reader = slow.open_layers(key_of(*kv));
  ASSERT_TRUE(reader) << slow.last_error();
  std::atomic<bool> read_ok{false};
  std::thread t([&] {
    const size_t lb = static_cast<size_t>(kv->layer_bytes());
    std::vector<std::byte> k(lb), v(lb);
    read_ok = reader->read_layer(0, k.data(), v.data()) && std::memcmp(k.data(), kv->k_layer(0), lb) == 0;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the disk is busy with it now
  RemoteKvStore other(node.client());
  const auto t0 = clock_type::now();
  EXPECT_TRUE(other.reachable()) << other.last_error();
  EXPECT_TRUE(other.contains(key_of(*kv))) << other.last_error();
  EXPECT_LT(since(t0), 0.3) << "the network thread waited for the disk";
  t.join();
  EXPECT_TRUE(read_ok);
}

struct FaultCase {
  StorageServer::Fault fault;
  const char* name;
};

// With layers_in_flight 1 the failure shows exactly at the faulty layer. With 4, a
// node that closes while later READs sit unread in its socket resets the connection
// (TCP RST), which may take slices already on their way with it: then an earlier
// layer fails too, still a miss and never wrong bytes.
TEST(RemoteStore, FaultsAreMissesNeverWrongBytes) {
  for (const FaultCase fc : {FaultCase{StorageServer::Fault::corrupt, "corrupt"},
                             FaultCase{StorageServer::Fault::truncate, "truncate"},
                             FaultCase{StorageServer::Fault::close, "close"},
                             FaultCase{StorageServer::Fault::stall, "stall"}})
    for (int lif : {1, 4}) {
      SCOPED_TRACE(std::string(fc.name) + ", layers_in_flight " + std::to_string(lif));
      Node node;
      std::mt19937 rng(9);
      auto kv = random_kv(rng, 6, 3, 100, 64, kernels::TensorType::F16);
      ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
      node.server->set_fault_hook(
          [&](const ChunkKey&, int layer) { return layer == 3 ? fc.fault : StorageServer::Fault::none; });
      auto opt = node.client();  // io_timeout 0.5 s
      opt.layers_in_flight = lif;
      RemoteKvStore remote(opt);
      auto reader = remote.open_layers(key_of(*kv));
      ASSERT_TRUE(reader);
      const size_t lb = static_cast<size_t>(kv->layer_bytes());
      std::vector<std::byte> k(lb), v(lb);
      const auto t0 = clock_type::now();
      int l = 0;
      for (; l < kv->n_layers; ++l) {
        if (!reader->read_layer(l, k.data(), v.data())) break;
        EXPECT_EQ(0, std::memcmp(k.data(), kv->k_layer(l), lb)) << l;
        EXPECT_EQ(0, std::memcmp(v.data(), kv->v_layer(l), lb)) << l;
      }
      const bool may_reset = lif > 1 && (fc.fault == StorageServer::Fault::truncate ||
                                         fc.fault == StorageServer::Fault::close);
      if (may_reset) {
        EXPECT_LE(l, 3);
      } else {
        EXPECT_EQ(l, 3);
      }
      EXPECT_LT(since(t0), 3.0);
      EXPECT_FALSE(reader->read_layer(4, k.data(), v.data()));  // the reader stays failed
      EXPECT_FALSE(remote.last_error().empty());
      if (fc.fault == StorageServer::Fault::corrupt) {
        EXPECT_EQ(remote.stats().corrupt, 1);
        EXPECT_NE(remote.last_error().find("checksum"), std::string::npos) << remote.last_error();
      }
      if (fc.fault == StorageServer::Fault::stall) {
        EXPECT_NE(remote.last_error().find("timed out"), std::string::npos) << remote.last_error();
      }
    }
}

TEST(RemoteStore, ADamagedFileOnTheNodeIsAMiss) {
  Node node;
  std::mt19937 rng(10);
  auto kv = random_kv(rng, 4, 2, 64, 64, kernels::TensorType::F16);
  const ChunkKey key = key_of(*kv);
  ASSERT_TRUE(node.disk->put(key, kv));
  RemoteKvStore remote(node.client());
  auto reader = remote.open_layers(key);
  ASSERT_TRUE(reader);
  {  // flip a byte in the last layer of the file (layers are 4096-aligned after the header)
    std::fstream f(node.disk->path_of(key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = static_cast<int64_t>(f.tellg());
    f.seekp(size - 4096 - 10);
    f.put('\x7f');
  }
  const size_t lb = static_cast<size_t>(kv->layer_bytes());
  std::vector<std::byte> k(lb), v(lb);
  for (int l = 0; l < 3; ++l) ASSERT_TRUE(reader->read_layer(l, k.data(), v.data()));
  EXPECT_FALSE(reader->read_layer(3, k.data(), v.data()));
  EXPECT_NE(remote.last_error().find("checksum"), std::string::npos) << remote.last_error();
  EXPECT_FALSE(node.disk->contains(key));  // the node dropped it
  EXPECT_TRUE(remote.reachable());
}

TEST(RemoteStore, ServerStoppedMidTransfer) {
  Node node;
  std::mt19937 rng(11);
  auto kv = random_kv(rng, 12, 3, 200, 64, kernels::TensorType::F16);
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  auto opt = node.client();
  opt.layers_in_flight = 2;
  RemoteKvStore remote(opt);
  auto reader = remote.open_layers(key_of(*kv));
  ASSERT_TRUE(reader);
  const size_t lb = static_cast<size_t>(kv->layer_bytes());
  std::vector<std::byte> k(lb), v(lb);
  ASSERT_TRUE(reader->read_layer(0, k.data(), v.data()));
  node.server->stop();
  const auto t0 = clock_type::now();
  int l = 1;
  for (; l < kv->n_layers; ++l) {
    if (!reader->read_layer(l, k.data(), v.data())) break;
    // What arrived before the stop is whole and right.
    EXPECT_EQ(0, std::memcmp(k.data(), kv->k_layer(l), lb));
    EXPECT_EQ(0, std::memcmp(v.data(), kv->v_layer(l), lb));
  }
  EXPECT_LT(l, kv->n_layers);
  EXPECT_LT(since(t0), 3.0);
}

// A peer that accepts and never says anything (a SIGSTOPped node): misses within the
// connect timeout, then the node is "down" and calls miss at once.
TEST(RemoteStore, FrozenPeerIsAMissWithinTheConnectTimeout) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::vector<std::shared_ptr<tcp::socket>> held;
  std::function<void()> accept = [&] {
    auto s = std::make_shared<tcp::socket>(io);
    acceptor.async_accept(*s, [&, s](const boost::system::error_code& ec) {
      if (ec) return;
      held.push_back(s);
      accept();
    });
  };
  accept();
  std::thread t([&] { io.run(); });
  RemoteStoreOptions opt;
  opt.port = acceptor.local_endpoint().port();
  opt.secret = kSecret;
  opt.connect_timeout_s = 0.5;
  opt.retry_after_s = 30;
  RemoteKvStore remote(opt);
  const ChunkKey key{1, 2};
  auto t0 = clock_type::now();
  EXPECT_EQ(remote.open_layers(key), nullptr);
  EXPECT_LT(since(t0), 2.0);
  EXPECT_GE(since(t0), 0.4);
  EXPECT_NE(remote.last_error().find("timed out"), std::string::npos) << remote.last_error();
  t0 = clock_type::now();
  EXPECT_EQ(remote.open_layers(key), nullptr);
  EXPECT_FALSE(remote.contains(key));
  EXPECT_FALSE(remote.reachable());
  EXPECT_LT(since(t0), 0.1);  // down: no second timeout
  asio::post(io, [&] {
    acceptor.close();
    held.clear();
  });
  io.stop();
  t.join();
}

TEST(RemoteStore, DownThenBackByItself) {
  auto node = std::make_unique<Node>();
  std::mt19937 rng(12);
  auto kv = random_kv(rng, 3, 2, 32, 32, kernels::TensorType::F16);
  ASSERT_TRUE(node->disk->put(key_of(*kv), kv));
  auto opt = node->client();
  opt.retry_after_s = 0.5;
  RemoteKvStore remote(opt);
  ASSERT_TRUE(remote.get(key_of(*kv)));
  const int port = node->server->port();
  const std::string dir = node->disk->dir();
  node->server->stop();

  auto t0 = clock_type::now();
  EXPECT_EQ(remote.get(key_of(*kv)), nullptr);  // the pooled connection is dead, a new one refused
  EXPECT_LT(since(t0), 1.5);
  EXPECT_FALSE(remote.last_error().empty());
  t0 = clock_type::now();
  EXPECT_EQ(remote.open_layers(key_of(*kv)), nullptr);
  EXPECT_LT(since(t0), 0.05);  // down: at once

  // The node comes back on the same port; within retry_after_s the worker still
  // counts it down, then finds it by itself.
  node->server.reset();
  node->server = std::make_unique<StorageServer>(*node->disk, [&] {
    StorageServerOptions o = node->opt;
    o.port = port;
    return o;
  }());
  EXPECT_EQ(remote.open_layers(key_of(*kv)), nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto got = remote.get(key_of(*kv));
  ASSERT_TRUE(got) << remote.last_error();
  EXPECT_TRUE(same(*got, *kv));
  EXPECT_TRUE(remote.reachable());
}

// A node that authenticates correctly and then answers OPEN with a frame header
// claiming 1 GiB: refused from the header alone, at once, without allocating it.
TEST(RemoteStore, ReplyLongerThanTheBoundIsRefused) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::thread fake([&] {
    try {
      tcp::socket s(io);
      acceptor.accept(s);
      const auto sn = remote::random_nonce();
      asio::write(s, asio::buffer(remote::encode_hello({remote::kProtocolVersion, sn})));
      auto read_frame = [&] {
        std::array<uint8_t, remote::kFrameHeaderBytes> h{};
        asio::read(s, asio::buffer(h));
        uint32_t len = 0;
        std::memcpy(&len, h.data(), 4);
        std::vector<uint8_t> p(len);
        asio::read(s, asio::buffer(p));
        return p;
      };
      const auto auth = remote::decode_auth(read_frame());
      if (!auth) return;
      asio::write(s, asio::buffer(remote::encode_auth_ok(
                         {remote::server_proof(kSecret, sn, auth->client_nonce), 1 << 20})));
      read_frame();  // OPEN
      std::array<uint8_t, remote::kFrameHeaderBytes> big{};
      remote::encode_frame_header(big.data(), MsgType::Entry, 1u << 30);
      asio::write(s, asio::buffer(big));
      std::array<uint8_t, 64> sink{};
      boost::system::error_code ec;
      while (!ec) s.read_some(asio::buffer(sink), ec);  // until the worker hangs up
    } catch (const std::exception&) {
    }
  });
  RemoteStoreOptions opt;
  opt.port = acceptor.local_endpoint().port();
  opt.secret = kSecret;
  opt.max_frame_bytes = 1 << 20;
  opt.io_timeout_s = 2;
  RemoteKvStore remote(opt);
  const auto t0 = clock_type::now();
  EXPECT_EQ(remote.open_layers(ChunkKey{3, 4}), nullptr);
  EXPECT_LT(since(t0), 1.0);
  EXPECT_NE(remote.last_error().find("length 1073741824"), std::string::npos) << remote.last_error();
  fake.join();
}

// A real node whose entry's layers would not fit the worker's frame bound: a miss at
// OPEN rather than a failure halfway.
TEST(RemoteStore, EntryLargerThanTheFrameBoundIsAMiss) {
  Node node;
  std::mt19937 rng(13);
  auto kv = random_kv(rng, 2, 4, 256, 64, kernels::TensorType::F32);  // 256 KiB per K
  ASSERT_TRUE(node.disk->put(key_of(*kv), kv));
  auto opt = node.client();
  opt.max_frame_bytes = 64 << 10;
  RemoteKvStore remote(opt);
  EXPECT_EQ(remote.open_layers(key_of(*kv)), nullptr);
  EXPECT_NE(remote.last_error().find("max_frame_bytes"), std::string::npos) << remote.last_error();
}

TEST(RemoteStore, ServerBindFailureIsASystemError) {
  Node node;
  StorageServerOptions o;
  o.secret = kSecret;
  o.port = node.server->port();
  // SO_REUSEADDR lets a new listener take a TIME_WAIT port, not a listening one.
  EXPECT_THROW(StorageServer(*node.disk, o), std::system_error);
}

}  // namespace
}  // namespace bs
