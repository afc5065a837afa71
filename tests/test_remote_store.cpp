// The remote-disk tier: a real StorageServer on loopback over a DiskKvStore in a temp
// dir, read through RemoteKvStore with real sockets. Byte-exact round trips (every
// layer equal to the SSD tier's own read), pipelining and out-of-order reads, the
// whole KvStore surface, concurrency, and every failure (wrong secret, hostile
// frames, corrupted/truncated/dropped/stalled slices, a node that stops or freezes)
// being a miss within its deadline, never a wrong answer, a hang or a throw. Also
// the frame codec on its own: round trips and every malformed case refused.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it.
#include <utility>
// clang-format off
#include <boost/asio.hpp>
// clang-format on

#include "kernels/kv_view.h"
#include "storage/disk_store.h"
#include "storage/hmac_auth.h"
#include "storage/remote_protocol.h"
#include "storage/remote_store.h"
#include "storage/storage_server.h"
#include "faulty_file_io.h"
#include "temp_dir.h"
#include "tests/random_kv.h"

namespace bs {
namespace {

using testing::key_of;
using testing::random_kv;

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;
using remote::MsgType;

constexpr char kSecret[] = "the cluster secret";

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Random bit patterns: equality below is bytewise.

bool same(const ChunkKv& a, const ChunkKv& b) {
  return a.tokens == b.tokens && a.n_layers == b.n_layers && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim &&
         a.dtype == b.dtype && a.k == b.k && a.v == b.v;
}

// A storage node: an SSD tier in a temp dir served on a loopback port.
struct Node {
  explicit Node(StorageServerOptions o = {}, int port = 0, std::shared_ptr<FileIo> io = nullptr) {
    disk = std::make_unique<DiskKvStore>(dir.path().string(), int64_t{1} << 30, false, DiskKvStore::EntryVisitor{},
                                         std::move(io));
    o.secret = o.secret.empty() ? kSecret : o.secret;
    o.port = port;
    if (o.io_timeout_s == StorageServerOptions{}.io_timeout_s) o.io_timeout_s = 2;
    opt = o;
    server = std::make_unique<StorageServer>(*disk, o);
  }
  RemoteStoreOptions client(std::string secret = kSecret) const {
    RemoteStoreOptions c;
    c.port = server->port();
    c.secret = std::move(secret);
    c.connect_timeout_s = 1;
    c.io_timeout_s = 0.5;
    c.retry_after_s = 0.3;
    return c;
  }
  testing::TempDir dir{"bs_remote"};
  std::unique_ptr<DiskKvStore> disk;
  StorageServerOptions opt;
  std::unique_ptr<StorageServer> server;
};

// Every layer through `reader` in `order`, checked against the SSD tier's own read.
void expect_layers_equal(LayerReader& reader, DiskKvStore& disk, const ChunkKey& key, const std::vector<int>& order) {
  auto e = disk.open(key);
  ASSERT_TRUE(e);
  const size_t lb = static_cast<size_t>(e->layer_bytes());
  ASSERT_EQ(static_cast<int64_t>(lb), reader.layer_bytes());
  std::vector<std::byte> k(lb), v(lb), dk(lb), dv(lb);
  for (int l : order) {
    ASSERT_TRUE(reader.read_layer(l, k.data(), v.data())) << "layer " << l;
    ASSERT_TRUE(disk.read_layer(*e, l, dk.data(), dv.data()));
    ASSERT_EQ(k, dk) << "layer " << l;
    ASSERT_EQ(v, dv) << "layer " << l;
  }
}

std::vector<int> in_order(int n) {
  std::vector<int> o(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) o[static_cast<size_t>(i)] = i;
  return o;
}

// ---------------------------------------------------------------- codec

std::span<const uint8_t> payload_of(const remote::Bytes& frame) {
  return std::span<const uint8_t>(frame).subspan(remote::kFrameHeaderBytes);
}

TEST(RemoteCodec, FrameHeader) {
  const auto f = remote::encode_empty(MsgType::Ping);
  ASSERT_EQ(f.size(), remote::kFrameHeaderBytes);
  auto h = remote::decode_frame_header(f, 0);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->type, MsgType::Ping);
  EXPECT_EQ(h->length, 0u);
  uint8_t b[5];
  remote::encode_frame_header(b, MsgType::Slice, 4096);
  EXPECT_TRUE(remote::decode_frame_header(b, 4096));
  EXPECT_FALSE(remote::decode_frame_header(b, 4095));  // above the bound
  EXPECT_FALSE(remote::decode_frame_header(std::span<const uint8_t>(b, 4), 1 << 20));  // short
  remote::encode_frame_header(b, MsgType::Slice, 0x80000000u);
  EXPECT_FALSE(remote::decode_frame_header(b, remote::kPreAuthMaxPayload));
  for (int t : {0, 19, 200, 255}) {
    b[4] = static_cast<uint8_t>(t);
    b[0] = b[1] = b[2] = b[3] = 0;
    EXPECT_FALSE(remote::decode_frame_header(b, 1 << 20)) << t;  // unknown type
  }
}

// Every strict prefix and one byte more are refused for a fixed-layout message.
template <class Decode>
void expect_exact_length(const remote::Bytes& frame, Decode decode) {
  const auto p = payload_of(frame);
  EXPECT_TRUE(decode(p));
  for (size_t n = 0; n < p.size(); ++n) EXPECT_FALSE(decode(p.first(n))) << "prefix " << n;
  std::vector<uint8_t> longer(p.begin(), p.end());
  longer.push_back(0);
  EXPECT_FALSE(decode(std::span<const uint8_t>(longer)));
}

TEST(RemoteCodec, HandshakeRoundTrips) {
  remote::Hello h{remote::kProtocolVersion, remote::random_nonce()};
  const auto fh = remote::encode_hello(h);
  auto dh = remote::decode_hello(payload_of(fh));
  ASSERT_TRUE(dh);
  EXPECT_EQ(dh->version, h.version);
  EXPECT_EQ(dh->nonce, h.nonce);
  expect_exact_length(fh, [](auto p) { return remote::decode_hello(p).has_value(); });

  remote::Auth a{7, remote::random_nonce(), {}};
  a.proof = remote::client_proof(kSecret, h.nonce, a.client_nonce);
  const auto fa = remote::encode_auth(a);
  auto da = remote::decode_auth(payload_of(fa));
  ASSERT_TRUE(da);
  EXPECT_EQ(da->version, 7u);
  EXPECT_EQ(da->client_nonce, a.client_nonce);
  EXPECT_EQ(da->proof, a.proof);
  expect_exact_length(fa, [](auto p) { return remote::decode_auth(p).has_value(); });

  remote::AuthOk ok{remote::server_proof(kSecret, h.nonce, a.client_nonce), 12345};
  const auto fo = remote::encode_auth_ok(ok);
  auto dok = remote::decode_auth_ok(payload_of(fo));
  ASSERT_TRUE(dok);
  EXPECT_EQ(dok->proof, ok.proof);
  EXPECT_EQ(dok->budget, 12345);
  expect_exact_length(fo, [](auto p) { return remote::decode_auth_ok(p).has_value(); });
  remote::AuthOk neg{ok.proof, -1};
  EXPECT_FALSE(remote::decode_auth_ok(payload_of(remote::encode_auth_ok(neg))));
}

TEST(RemoteCodec, Proofs) {
  const auto sn = remote::random_nonce(), cn = remote::random_nonce();
  EXPECT_NE(sn, cn);
  const auto c = remote::client_proof(kSecret, sn, cn);
  EXPECT_TRUE(remote::proofs_equal(c, remote::client_proof(kSecret, sn, cn)));
  EXPECT_FALSE(remote::proofs_equal(c, remote::server_proof(kSecret, sn, cn)));  // distinct labels
  EXPECT_FALSE(remote::proofs_equal(c, remote::client_proof("other", sn, cn)));
  EXPECT_FALSE(remote::proofs_equal(c, remote::client_proof(kSecret, cn, sn)));  // nonces not interchangeable
  auto flipped = c;
  flipped[31] ^= 1;
  EXPECT_FALSE(remote::proofs_equal(c, flipped));
}

TEST(RemoteCodec, RequestsAndRepliesRoundTrip) {
  const ChunkKey key{0x0123456789abcdefull, 0xfedcba9876543210ull};
  for (MsgType t : {MsgType::Open, MsgType::Contains, MsgType::Erase}) {
    const auto f = remote::encode_key_msg(t, key);
    EXPECT_EQ(remote::decode_frame_header(f, 1 << 20)->type, t);
    EXPECT_EQ(remote::decode_key_msg(payload_of(f)), key);
    expect_exact_length(f, [](auto p) { return remote::decode_key_msg(p).has_value(); });
  }
  EXPECT_THROW(remote::encode_key_msg(MsgType::Read, key), std::invalid_argument);

  const auto fr = remote::encode_read({5, 29});
  const auto r = remote::decode_read(payload_of(fr));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->handle, 5u);
  EXPECT_EQ(r->layer, 29u);
  expect_exact_length(fr, [](auto p) { return remote::decode_read(p).has_value(); });

  const auto fc = remote::encode_close(77);
  EXPECT_EQ(remote::decode_close(payload_of(fc)), 77u);
  expect_exact_length(fc, [](auto p) { return remote::decode_close(p).has_value(); });

  EXPECT_EQ(remote::decode_result(payload_of(remote::encode_result(true))), true);
  EXPECT_EQ(remote::decode_result(payload_of(remote::encode_result(false))), false);
  const uint8_t two = 2;
  EXPECT_FALSE(remote::decode_result(std::span<const uint8_t>(&two, 1)));
  expect_exact_length(remote::encode_result(true), [](auto p) { return remote::decode_result(p).has_value(); });

  remote::RemoteStats s{1, 2, 3, 4, 5, 6, 7, 8};
  const auto fs = remote::encode_stats_reply(s);
  const auto ds = remote::decode_stats_reply(payload_of(fs));
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->bytes, 1);
  EXPECT_EQ(ds->budget, 3);
  EXPECT_EQ(ds->corrupt, 8);
  expect_exact_length(fs, [](auto p) { return remote::decode_stats_reply(p).has_value(); });
  s.entries = -1;
  EXPECT_FALSE(remote::decode_stats_reply(payload_of(remote::encode_stats_reply(s))));

  EXPECT_TRUE(remote::decode_empty(payload_of(remote::encode_empty(MsgType::NotFound))));
  const uint8_t one = 1;
  EXPECT_FALSE(remote::decode_empty(std::span<const uint8_t>(&one, 1)));
  EXPECT_THROW(remote::encode_empty(MsgType::Open), std::invalid_argument);

  EXPECT_EQ(remote::decode_error(payload_of(remote::encode_error("no such layer"))), "no such layer");
  EXPECT_EQ(remote::decode_error(payload_of(remote::encode_error(std::string("a\nb\x01", 4)))), "a?b?");
  EXPECT_EQ(remote::encode_error(std::string(5000, 'x')).size(), remote::kFrameHeaderBytes + remote::kMaxErrorBytes);
  std::vector<uint8_t> long_error(remote::kMaxErrorBytes + 1, 'x');
  EXPECT_FALSE(remote::decode_error(long_error));
}

remote::EntryInfo sample_entry(kernels::TensorType dtype) {
  remote::EntryInfo e;
  e.handle = 3;
  e.dtype = dtype;
  e.n_layers = 4, e.kv_heads = 2, e.head_dim = 8;
  e.tokens = {1, 2, 3, 99999};
  e.layer_sums = {10, 20, 30, 40};
  return e;
}

TEST(RemoteCodec, EntryRoundTripAndMalformed) {
  for (auto dtype : {kernels::TensorType::F32, kernels::TensorType::F16, kernels::TensorType::BF16}) {
    const auto e = sample_entry(dtype);
    const auto f = remote::encode_entry(e);
    const auto d = remote::decode_entry(payload_of(f));
    ASSERT_TRUE(d);
    EXPECT_EQ(d->handle, 3u);
    EXPECT_EQ(d->dtype, dtype);
    EXPECT_EQ(d->n_layers, 4);
    EXPECT_EQ(d->kv_heads, 2);
    EXPECT_EQ(d->head_dim, 8);
    EXPECT_EQ(d->tokens, e.tokens);
    EXPECT_EQ(d->layer_sums, e.layer_sums);
    EXPECT_EQ(d->layer_bytes(), 2 * 4 * 8 * kernels::kv_dtype_bytes(dtype));
    expect_exact_length(f, [](auto p) { return remote::decode_entry(p).has_value(); });
  }
  // Field by field: offsets in the payload (handle 0, dtype 4, n_layers 8, kv_heads 12,
  // head_dim 16, m 20).
  const auto good = remote::encode_entry(sample_entry(kernels::TensorType::F16));
  auto with = [&](size_t off, uint64_t value, size_t width) {
    std::vector<uint8_t> p(payload_of(good).begin(), payload_of(good).end());
    std::memcpy(p.data() + off, &value, width);
    return remote::decode_entry(p);
  };
  EXPECT_FALSE(with(4, 2, 4));                    // Q4_0 is not a KV dtype
  EXPECT_FALSE(with(4, 1000000, 4));              // no dtype at all
  EXPECT_FALSE(with(8, 0, 4));                    // no layers
  EXPECT_FALSE(with(8, 5, 4));                    // more layers than sums
  EXPECT_FALSE(with(8, remote::kMaxDim + 1, 4));  // absurd
  EXPECT_FALSE(with(12, 0, 4));
  EXPECT_FALSE(with(16, remote::kMaxDim + 1, 4));
  EXPECT_FALSE(with(20, 5, 8));                     // more tokens than bytes
  EXPECT_FALSE(with(20, 3, 8));                     // fewer
  EXPECT_FALSE(with(20, uint64_t{1} << 62, 8));     // a lie about a huge entry: no allocation
  EXPECT_FALSE(with(20, remote::kMaxTokens + 1, 8));
  EXPECT_TRUE(with(0, 123, 4));  // any handle
  EXPECT_THROW(remote::encode_entry(remote::EntryInfo{}), std::invalid_argument);
}

TEST(RemoteCodec, SliceHead) {
  const auto head = remote::encode_slice_head(9, 4, 100);
  ASSERT_TRUE(head);
  const auto h = remote::decode_frame_header(*head, 1 << 20);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->type, MsgType::Slice);
  EXPECT_EQ(h->length, remote::kSliceHeadBytes + 200);
  const auto sh = remote::decode_slice_head(std::span<const uint8_t>(*head).subspan(remote::kFrameHeaderBytes));
  ASSERT_TRUE(sh);
  EXPECT_EQ(sh->handle, 9u);
  EXPECT_EQ(sh->layer, 4u);
  EXPECT_FALSE(remote::encode_slice_head(1, 1, int64_t{1} << 31));  // does not fit a u32 length
  EXPECT_FALSE(remote::decode_slice_head(std::span<const uint8_t>(head->data(), 7)));

  std::vector<uint8_t> payload(remote::kSliceHeadBytes + 2 * 16);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i);
  const auto v = remote::decode_slice(payload, 16);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->k.size(), 16u);
  EXPECT_EQ(v->k[0], remote::kSliceHeadBytes);
  EXPECT_EQ(v->v[0], remote::kSliceHeadBytes + 16);
  EXPECT_FALSE(remote::decode_slice(payload, 15));
  EXPECT_FALSE(remote::decode_slice(payload, 17));
  EXPECT_FALSE(remote::decode_slice(std::span<const uint8_t>(payload).first(payload.size() - 1), 16));
  EXPECT_FALSE(remote::decode_slice(std::span<const uint8_t>(payload).first(4), 0));
}

TEST(RemoteCodec, PutRoundTripAndMalformed) {
  std::mt19937 rng(5);
  for (auto dtype : {kernels::TensorType::F32, kernels::TensorType::F16, kernels::TensorType::BF16}) {
    auto kv = random_kv(rng, 3, 2, 5, 8, dtype);
    const ChunkKey key = key_of(*kv);
    const auto f = remote::encode_put(key, *kv, int64_t{1} << 20);
    ASSERT_TRUE(f);
    const auto d = remote::decode_put(payload_of(*f));
    ASSERT_TRUE(d);
    EXPECT_EQ(d->key, key);
    EXPECT_TRUE(same(*d->kv, *kv));
    const auto p = payload_of(*f);
    for (size_t n = 0; n < p.size(); ++n) EXPECT_FALSE(remote::decode_put(p.first(n))) << n;
    // Any flipped byte fails the checksum (or, in the checksum itself, the compare).
    for (size_t i = 0; i < p.size(); i += 7) {
      std::vector<uint8_t> bad(p.begin(), p.end());
      bad[i] ^= 0x10;
      EXPECT_FALSE(remote::decode_put(bad)) << i;
    }
    EXPECT_FALSE(remote::encode_put(key, *kv, static_cast<int64_t>(p.size()) - 1));  // over the bound
  }
  // A frame whose checksum is right but whose shape lies about its length.
  auto kv = random_kv(rng, 2, 1, 4, 4, kernels::TensorType::F32);
  auto f = *remote::encode_put(key_of(*kv), *kv, 1 << 20);
  std::vector<uint8_t> p(payload_of(f).begin(), payload_of(f).end() - 8);
  const uint32_t three = 3;
  std::memcpy(p.data() + 16 + 4, &three, 4);  // n_layers 3, data for 2
  const uint64_t sum = XXH3_64bits(p.data(), p.size());
  p.insert(p.end(), reinterpret_cast<const uint8_t*>(&sum), reinterpret_cast<const uint8_t*>(&sum) + 8);
  EXPECT_FALSE(remote::decode_put(p));
  // An inconsistent ChunkKv is not encoded.
  auto broken = std::make_shared<ChunkKv>(*kv);
  broken->v.pop_back();
  EXPECT_FALSE(remote::encode_put(key_of(*kv), *broken, 1 << 20));
}

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
