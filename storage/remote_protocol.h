// The remote-disk tier's wire format: the frames a storage node (storage_server.h)
// and a worker (remote_store.h) exchange over TCP. Pure functions, no sockets: every
// decoder takes the bytes that arrived and either returns a value whose fields are
// all in range or nullopt, so the codec is unit-tested and fuzzed on its own
// (tests/fuzz/fuzz_remote_frame.cpp) and the socket code never parses.
//
// Frame: u32 payload length, u8 type, payload; integers little-endian (the byte
// order of every target we build for, checked at compile time below).
//   HELLO      server->client  u32 version, u8 server_nonce[32]
//   AUTH       client->server  u32 version, u8 client_nonce[32], u8 proof[32]
//   AUTH_OK    server->client  u8 proof[32], i64 budget (the node's byte budget)
//   OPEN       key             -> ENTRY or NOT_FOUND
//   ENTRY      u32 handle, u32 dtype (ggml numbering: 0 f32, 1 f16, 30 bf16),
//              u32 n_layers, u32 kv_heads, u32 head_dim, u64 m, i32 tokens[m],
//              u64 layer_sum[n_layers] (XXH3-64 over the layer's K then V: the value
//              the node's file keeps, disk_store.h)
//   NOT_FOUND  (empty)
//   READ       u32 handle, u32 layer -> SLICE or ERROR
//   SLICE      u32 handle, u32 layer, K [kv_heads, m, head_dim], V (same), of dtype
//   CLOSE      u32 handle (no reply)
//   CONTAINS   key -> RESULT;   ERASE key -> RESULT;   PING -> PONG (empty)
//   PUT        key, u32 dtype, u32 n_layers, u32 kv_heads, u32 head_dim, u64 m,
//              i32 tokens[m], K (all layers), V (all layers), u64 XXH3-64 of every
//              payload byte before it -> RESULT or ERROR
//   RESULT     u8 0|1
//   STATS      (empty) -> STATS_REPLY: i64 bytes, entries, budget, hits, misses,
//              puts, evictions, corrupt (the node's StoreStats)
//   ERROR      UTF-8 text, at most kMaxErrorBytes (the request failed; the server
//              closes the connection after an authentication or framing error)
//   key = u64 hi, u64 lo (ChunkKey)
// Why this shape:
// - Length first, then type: a reader knows how much to read before it allocates,
//   and refuses a length above its bound (kPreAuthMaxPayload before authentication,
//   so an unauthenticated peer cannot make a node allocate; max_frame_bytes after).
// - One SLICE is exactly one layer of one entry, K then V as the file holds them,
//   so the node reads it with one pread into the send buffer and the worker reads it
//   straight into the caller's k and v buffers (no copy). The receiver checks its
//   XXH3-64 against the layer_sum of the ENTRY: end to end from the node's file.
// - Handles instead of keys in READ: the node opens the file once per entry (the
//   open file keeps it readable even if evicted meanwhile, as DiskKvStore::Entry).
// - Mutual HMAC-SHA256 challenge-response (hmac_auth.h): both nonces in both proofs,
//   a distinct label per direction; the secret never crosses the wire.
// - A version in HELLO and AUTH: a node and a worker of different protocol versions
//   refuse each other at once instead of misreading frames.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "storage/chunk_kv.h"
#include "storage/kv_store.h"
#include "storage/layer_checksum.h"

namespace bs::remote {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian, as the host");

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 5;       // u32 length + u8 type
inline constexpr int64_t kPreAuthMaxPayload = 4096;  // the bound before authentication
inline constexpr size_t kMaxErrorBytes = 1024;       // ERROR text, at most
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;
inline constexpr size_t kSliceHeadBytes = 8;  // SLICE's u32 handle, u32 layer before K and V
// Shape bounds for a decoded ENTRY or PUT, far above any real model (as the SSD tier's).
inline constexpr uint32_t kMaxDim = 1u << 20;
inline constexpr uint64_t kMaxTokens = uint64_t{1} << 30;

enum class MsgType : uint8_t {
  Hello = 1,
  Auth = 2,
  AuthOk = 3,
  Open = 4,
  Entry = 5,
  NotFound = 6,
  Read = 7,
  Slice = 8,
  Close = 9,
  Contains = 10,
  Result = 11,
  Put = 12,
  Erase = 13,
  Stats = 14,
  StatsReply = 15,
  Error = 16,
  Ping = 17,
  Pong = 18,
};
const char* msg_type_name(MsgType t);  // "HELLO", ...; "?" for a value outside the enum

using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;
using Bytes = std::vector<uint8_t>;

struct FrameHeader {
  uint32_t length = 0;  // payload bytes (after the 5 header bytes)
  MsgType type = MsgType::Error;
};
// The header in the first kFrameHeaderBytes of `bytes`; nullopt if fewer bytes, an
// unknown type, or a length above max_payload.
std::optional<FrameHeader> decode_frame_header(std::span<const uint8_t> bytes, int64_t max_payload);
// Writes the 5 header bytes to out[0..5).
void encode_frame_header(uint8_t* out, MsgType type, uint32_t length);

struct Hello {
  uint32_t version = kProtocolVersion;
  Nonce nonce{};
};
struct Auth {
  uint32_t version = kProtocolVersion;
  Nonce client_nonce{};
  Proof proof{};
};
struct AuthOk {
  Proof proof{};
  int64_t budget = 0;  // >= 0
};
// The shape and checksums of an opened entry (ENTRY).
struct EntryInfo {
  uint32_t handle = 0;
  kernels::TensorType dtype = kernels::TensorType::F32;
  int n_layers = 0, kv_heads = 0, head_dim = 0;
  std::vector<int32_t> tokens;
  std::vector<uint64_t> layer_sums;  // n_layers values
  // Bytes in K (and in V) of one layer.
  int64_t layer_bytes() const;
};
struct ReadReq {
  uint32_t handle = 0;
  uint32_t layer = 0;
};
struct SliceHead {
  uint32_t handle = 0;
  uint32_t layer = 0;
};
struct RemoteStats {
  int64_t bytes = 0, entries = 0, budget = 0, hits = 0, misses = 0, puts = 0, evictions = 0, corrupt = 0;
};

// ---- encoders: each returns a whole frame (header + payload) ----
Bytes encode_hello(const Hello& m);
Bytes encode_auth(const Auth& m);
Bytes encode_auth_ok(const AuthOk& m);
// OPEN, CONTAINS and ERASE carry a key alone; `type` is one of the three.
Bytes encode_key_msg(MsgType type, const ChunkKey& key);
// Throws std::invalid_argument for a shape outside the bounds (the server only
// encodes entries its own store opened).
Bytes encode_entry(const EntryInfo& m);
Bytes encode_empty(MsgType type);  // NOT_FOUND, STATS, PING, PONG
Bytes encode_read(const ReadReq& m);
Bytes encode_close(uint32_t handle);
Bytes encode_result(bool ok);
Bytes encode_stats_reply(const RemoteStats& m);
// At most kMaxErrorBytes of `message` (longer text is cut).
Bytes encode_error(std::string_view message);
// A SLICE frame's header and slice head (kFrameHeaderBytes + kSliceHeadBytes bytes)
// for a layer of `layer_bytes` bytes in K (and in V); K and V follow on the wire.
// nullopt if the payload would not fit a u32 length.
std::optional<std::array<uint8_t, kFrameHeaderBytes + kSliceHeadBytes>> encode_slice_head(uint32_t handle,
                                                                                           uint32_t layer,
                                                                                           int64_t layer_bytes);
// PUT of `kv` under `key`; nullopt if kv is inconsistent, outside the bounds, or the
// frame would be longer than max_payload.
std::optional<Bytes> encode_put(const ChunkKey& key, const ChunkKv& kv, int64_t max_payload);

// ---- decoders: the payload (after the 5 header bytes) of a frame of that type ----
// Every field is checked: exact lengths, known dtypes, shapes within the bounds and
// consistent with the length, checksums. nullopt for anything off.
std::optional<Hello> decode_hello(std::span<const uint8_t> payload);
std::optional<Auth> decode_auth(std::span<const uint8_t> payload);
std::optional<AuthOk> decode_auth_ok(std::span<const uint8_t> payload);
std::optional<ChunkKey> decode_key_msg(std::span<const uint8_t> payload);
std::optional<EntryInfo> decode_entry(std::span<const uint8_t> payload);
std::optional<ReadReq> decode_read(std::span<const uint8_t> payload);
std::optional<uint32_t> decode_close(std::span<const uint8_t> payload);
std::optional<bool> decode_result(std::span<const uint8_t> payload);
std::optional<RemoteStats> decode_stats_reply(std::span<const uint8_t> payload);
// The text, with bytes outside printable ASCII replaced by '?' (it ends up in logs).
std::optional<std::string> decode_error(std::span<const uint8_t> payload);
bool decode_empty(std::span<const uint8_t> payload);  // true iff empty
// The first kSliceHeadBytes of a SLICE payload.
std::optional<SliceHead> decode_slice_head(std::span<const uint8_t> head);
// A whole SLICE payload for a layer of `layer_bytes` bytes in K (and V): its head
// and views of K and V inside `payload`; nullopt if the length is not exactly
// kSliceHeadBytes + 2 * layer_bytes.
struct SliceView {
  SliceHead head;
  std::span<const uint8_t> k, v;
};
std::optional<SliceView> decode_slice(std::span<const uint8_t> payload, int64_t layer_bytes);
struct PutMsg {
  ChunkKey key;
  std::shared_ptr<ChunkKv> kv;  // consistent(), within the bounds
};
// Verifies the trailing checksum before it copies anything.
std::optional<PutMsg> decode_put(std::span<const uint8_t> payload);

// What ENTRY's layer_sums hold for a layer: the SSD file's own per-layer checksum.
using bs::layer_checksum;

}  // namespace bs::remote
