// The remote tier's frame codec (storage/remote_protocol.h) on its own: every frame
// round-trips, and every malformed or wrong-length frame is refused.
#include "remote_store_test_helpers.h"

namespace bs {
namespace {

using namespace remote_store_test;  // NOLINT: the suites' shared helpers

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

}  // namespace
}  // namespace bs
