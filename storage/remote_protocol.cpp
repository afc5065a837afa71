#include "storage/remote_protocol.h"

#include <xxhash.h>

#include <cstring>
#include <stdexcept>

#include "kernels/kv_view.h"

namespace bs::remote {

namespace {

// Appends little-endian integers and raw bytes to a frame under construction.
class Writer {
 public:
  Writer(MsgType type, size_t payload_hint) : type_(type) {
    out_.reserve(kFrameHeaderBytes + payload_hint);
    out_.resize(kFrameHeaderBytes);
  }
  template <class T>
  void put(T x) {
    const auto* b = reinterpret_cast<const uint8_t*>(&x);
    out_.insert(out_.end(), b, b + sizeof x);
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void key(const ChunkKey& k) {
    put(k.hi);
    put(k.lo);
  }
  Bytes finish() {
    const size_t len = out_.size() - kFrameHeaderBytes;
    if (len > UINT32_MAX) throw std::length_error("remote frame: payload too long");
    encode_frame_header(out_.data(), type_, static_cast<uint32_t>(len));
    return std::move(out_);
  }
  size_t payload_size() const { return out_.size() - kFrameHeaderBytes; }
  const uint8_t* payload() const { return out_.data() + kFrameHeaderBytes; }

 private:
  MsgType type_;
  Bytes out_;
};

// Reads fields from a payload, remembering whether any read ran past its end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> p) : p_(p) {}
  template <class T>
  T get() {
    T x{};
    if (!take(sizeof x)) return x;
    std::memcpy(&x, p_.data() + pos_ - sizeof x, sizeof x);
    return x;
  }
  // A view of the next n bytes (empty and failed if fewer remain).
  std::span<const uint8_t> bytes(uint64_t n) {
    if (!take(n)) return {};
    return p_.subspan(static_cast<size_t>(pos_ - n), static_cast<size_t>(n));
  }
  ChunkKey key() {
    ChunkKey k;
    k.hi = get<uint64_t>();
    k.lo = get<uint64_t>();
    return k;
  }
  uint64_t remaining() const { return ok_ ? p_.size() - pos_ : 0; }
  bool ok() const { return ok_; }
  // Every byte read, none left over.
  bool done() const { return ok_ && pos_ == p_.size(); }

 private:
  bool take(uint64_t n) {
    if (!ok_ || n > p_.size() - pos_) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> p_;
  uint64_t pos_ = 0;
  bool ok_ = true;
};

std::optional<kernels::TensorType> dtype_of(uint32_t field) {
  const auto type = static_cast<kernels::TensorType>(field);
  if (field > 1000 || !kernels::is_kv_dtype(type)) return std::nullopt;
  return type;
}

// Bytes in K (and V) of one layer of this shape; nullopt if out of bounds or huge.
std::optional<uint64_t> layer_bytes_of(uint32_t kv_heads, uint32_t head_dim, uint64_t m, kernels::TensorType dtype) {
  if (kv_heads < 1 || kv_heads > kMaxDim || head_dim < 1 || head_dim > kMaxDim || m > kMaxTokens) return std::nullopt;
  uint64_t n = 0;
  if (__builtin_mul_overflow(uint64_t{kv_heads}, uint64_t{head_dim}, &n) || __builtin_mul_overflow(n, m, &n) ||
      __builtin_mul_overflow(n, static_cast<uint64_t>(kernels::kv_dtype_bytes(dtype)), &n) || n > (uint64_t{1} << 50))
    return std::nullopt;
  return n;
}

struct Shape {
  kernels::TensorType dtype;
  uint32_t n_layers, kv_heads, head_dim;
  uint64_t m, layer_bytes;
};
// dtype, n_layers, kv_heads, head_dim, m as ENTRY and PUT carry them; checked.
std::optional<Shape> read_shape(Reader& r) {
  const uint32_t dt = r.get<uint32_t>(), n_layers = r.get<uint32_t>(), kv_heads = r.get<uint32_t>(),
                 head_dim = r.get<uint32_t>();
  const uint64_t m = r.get<uint64_t>();
  if (!r.ok()) return std::nullopt;
  const auto dtype = dtype_of(dt);
  if (!dtype || n_layers < 1 || n_layers > kMaxDim) return std::nullopt;
  const auto lb = layer_bytes_of(kv_heads, head_dim, m, *dtype);
  if (!lb) return std::nullopt;
  return Shape{*dtype, n_layers, kv_heads, head_dim, m, *lb};
}

std::vector<int32_t> read_tokens(Reader& r, uint64_t m) {
  // m <= kMaxTokens, so 4 * m cannot overflow; bytes() fails if the payload is shorter.
  const auto b = r.bytes(4 * m);
  std::vector<int32_t> tokens;
  if (!r.ok()) return tokens;
  tokens.resize(static_cast<size_t>(m));
  if (m) std::memcpy(tokens.data(), b.data(), b.size());
  return tokens;
}

}  // namespace

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::Hello: return "HELLO";
    case MsgType::Auth: return "AUTH";
    case MsgType::AuthOk: return "AUTH_OK";
    case MsgType::Open: return "OPEN";
    case MsgType::Entry: return "ENTRY";
    case MsgType::NotFound: return "NOT_FOUND";
    case MsgType::Read: return "READ";
    case MsgType::Slice: return "SLICE";
    case MsgType::Close: return "CLOSE";
    case MsgType::Contains: return "CONTAINS";
    case MsgType::Result: return "RESULT";
    case MsgType::Put: return "PUT";
    case MsgType::Erase: return "ERASE";
    case MsgType::Stats: return "STATS";
    case MsgType::StatsReply: return "STATS_REPLY";
    case MsgType::Error: return "ERROR";
    case MsgType::Ping: return "PING";
    case MsgType::Pong: return "PONG";
  }
  return "?";
}

std::optional<FrameHeader> decode_frame_header(std::span<const uint8_t> bytes, int64_t max_payload) {
  if (bytes.size() < kFrameHeaderBytes) return std::nullopt;
  FrameHeader h;
  std::memcpy(&h.length, bytes.data(), 4);
  const uint8_t t = bytes[4];
  if (t < static_cast<uint8_t>(MsgType::Hello) || t > static_cast<uint8_t>(MsgType::Pong)) return std::nullopt;
  h.type = static_cast<MsgType>(t);
  if (max_payload < 0 || int64_t{h.length} > max_payload) return std::nullopt;
  return h;
}

void encode_frame_header(uint8_t* out, MsgType type, uint32_t length) {
  std::memcpy(out, &length, 4);
  out[4] = static_cast<uint8_t>(type);
}

int64_t EntryInfo::layer_bytes() const {
  return static_cast<int64_t>(kv_heads) * static_cast<int64_t>(tokens.size()) * head_dim *
         kernels::kv_dtype_bytes(dtype);
}

// ---- encoders ----

Bytes encode_hello(const Hello& m) {
  Writer w(MsgType::Hello, 4 + kNonceBytes);
  w.put(m.version);
  w.raw(m.nonce.data(), m.nonce.size());
  return w.finish();
}

Bytes encode_auth(const Auth& m) {
  Writer w(MsgType::Auth, 4 + kNonceBytes + kProofBytes);
  w.put(m.version);
  w.raw(m.client_nonce.data(), m.client_nonce.size());
  w.raw(m.proof.data(), m.proof.size());
  return w.finish();
}

Bytes encode_auth_ok(const AuthOk& m) {
  Writer w(MsgType::AuthOk, kProofBytes + 8);
  w.raw(m.proof.data(), m.proof.size());
  w.put(m.budget);
  return w.finish();
}

Bytes encode_key_msg(MsgType type, const ChunkKey& key) {
  if (type != MsgType::Open && type != MsgType::Contains && type != MsgType::Erase)
    throw std::invalid_argument("remote frame: not a key message");
  Writer w(type, 16);
  w.key(key);
  return w.finish();
}

Bytes encode_entry(const EntryInfo& m) {
  if (!dtype_of(static_cast<uint32_t>(m.dtype)) || m.n_layers < 1 || static_cast<uint32_t>(m.n_layers) > kMaxDim ||
      m.kv_heads < 1 || m.head_dim < 1 ||
      !layer_bytes_of(static_cast<uint32_t>(m.kv_heads), static_cast<uint32_t>(m.head_dim), m.tokens.size(),
                      m.dtype) ||
      m.layer_sums.size() != static_cast<size_t>(m.n_layers))
    throw std::invalid_argument("remote frame: entry shape out of bounds");
  Writer w(MsgType::Entry, 28 + 4 * m.tokens.size() + 8 * m.layer_sums.size());
  w.put(m.handle);
  w.put(static_cast<uint32_t>(m.dtype));
  w.put(static_cast<uint32_t>(m.n_layers));
  w.put(static_cast<uint32_t>(m.kv_heads));
  w.put(static_cast<uint32_t>(m.head_dim));
  w.put(static_cast<uint64_t>(m.tokens.size()));
  w.raw(m.tokens.data(), 4 * m.tokens.size());
  w.raw(m.layer_sums.data(), 8 * m.layer_sums.size());
  return w.finish();
}

Bytes encode_empty(MsgType type) {
  if (type != MsgType::NotFound && type != MsgType::Stats && type != MsgType::Ping && type != MsgType::Pong)
    throw std::invalid_argument("remote frame: not an empty message");
  return Writer(type, 0).finish();
}

Bytes encode_read(const ReadReq& m) {
  Writer w(MsgType::Read, 8);
  w.put(m.handle);
  w.put(m.layer);
  return w.finish();
}

Bytes encode_close(uint32_t handle) {
  Writer w(MsgType::Close, 4);
  w.put(handle);
  return w.finish();
}

Bytes encode_result(bool ok) {
  Writer w(MsgType::Result, 1);
  w.put(static_cast<uint8_t>(ok ? 1 : 0));
  return w.finish();
}

Bytes encode_stats_reply(const RemoteStats& m) {
  Writer w(MsgType::StatsReply, 64);
  for (int64_t x : {m.bytes, m.entries, m.budget, m.hits, m.misses, m.puts, m.evictions, m.corrupt}) w.put(x);
  return w.finish();
}

Bytes encode_error(std::string_view message) {
  if (message.size() > kMaxErrorBytes) message = message.substr(0, kMaxErrorBytes);
  Writer w(MsgType::Error, message.size());
  w.raw(message.data(), message.size());
  return w.finish();
}

std::optional<std::array<uint8_t, kFrameHeaderBytes + kSliceHeadBytes>> encode_slice_head(uint32_t handle,
                                                                                           uint32_t layer,
                                                                                           int64_t layer_bytes) {
  if (layer_bytes < 0 || layer_bytes > (int64_t{UINT32_MAX} - static_cast<int64_t>(kSliceHeadBytes)) / 2)
    return std::nullopt;
  std::array<uint8_t, kFrameHeaderBytes + kSliceHeadBytes> out{};
  encode_frame_header(out.data(), MsgType::Slice, static_cast<uint32_t>(kSliceHeadBytes + 2 * layer_bytes));
  std::memcpy(out.data() + kFrameHeaderBytes, &handle, 4);
  std::memcpy(out.data() + kFrameHeaderBytes + 4, &layer, 4);
  return out;
}

std::optional<Bytes> encode_put(const ChunkKey& key, const ChunkKv& kv, int64_t max_payload) {
  if (!kv.consistent() || kv.n_layers < 1 || static_cast<uint32_t>(kv.n_layers) > kMaxDim || kv.kv_heads < 1 ||
      kv.head_dim < 1 ||
      !layer_bytes_of(static_cast<uint32_t>(kv.kv_heads), static_cast<uint32_t>(kv.head_dim), kv.tokens.size(),
                      kv.dtype))
    return std::nullopt;
  const uint64_t payload = 16 + 24 + 4 * kv.tokens.size() + kv.k.size() + kv.v.size() + 8;
  if (max_payload < 0 || payload > static_cast<uint64_t>(max_payload) || payload > UINT32_MAX) return std::nullopt;
  Writer w(MsgType::Put, static_cast<size_t>(payload));
  w.key(key);
  w.put(static_cast<uint32_t>(kv.dtype));
  w.put(static_cast<uint32_t>(kv.n_layers));
  w.put(static_cast<uint32_t>(kv.kv_heads));
  w.put(static_cast<uint32_t>(kv.head_dim));
  w.put(static_cast<uint64_t>(kv.tokens.size()));
  w.raw(kv.tokens.data(), 4 * kv.tokens.size());
  w.raw(kv.k.data(), kv.k.size());
  w.raw(kv.v.data(), kv.v.size());
  w.put(static_cast<uint64_t>(XXH3_64bits(w.payload(), w.payload_size())));
  return w.finish();
}

// ---- decoders ----

std::optional<Hello> decode_hello(std::span<const uint8_t> payload) {
  Reader r(payload);
  Hello m;
  m.version = r.get<uint32_t>();
  const auto n = r.bytes(kNonceBytes);
  if (!r.done()) return std::nullopt;
  std::memcpy(m.nonce.data(), n.data(), kNonceBytes);
  return m;
}

std::optional<Auth> decode_auth(std::span<const uint8_t> payload) {
  Reader r(payload);
  Auth m;
  m.version = r.get<uint32_t>();
  const auto n = r.bytes(kNonceBytes);
  const auto p = r.bytes(kProofBytes);
  if (!r.done()) return std::nullopt;
  std::memcpy(m.client_nonce.data(), n.data(), kNonceBytes);
  std::memcpy(m.proof.data(), p.data(), kProofBytes);
  return m;
}

std::optional<AuthOk> decode_auth_ok(std::span<const uint8_t> payload) {
  Reader r(payload);
  AuthOk m;
  const auto p = r.bytes(kProofBytes);
  m.budget = r.get<int64_t>();
  if (!r.done() || m.budget < 0) return std::nullopt;
  std::memcpy(m.proof.data(), p.data(), kProofBytes);
  return m;
}

std::optional<ChunkKey> decode_key_msg(std::span<const uint8_t> payload) {
  Reader r(payload);
  const ChunkKey k = r.key();
  if (!r.done()) return std::nullopt;
  return k;
}

std::optional<EntryInfo> decode_entry(std::span<const uint8_t> payload) {
  Reader r(payload);
  EntryInfo m;
  m.handle = r.get<uint32_t>();
  const auto shape = read_shape(r);
  if (!shape) return std::nullopt;
  // The rest must be exactly the tokens and the sums: checked before allocating.
  if (r.remaining() != 4 * shape->m + 8 * uint64_t{shape->n_layers}) return std::nullopt;
  m.dtype = shape->dtype;
  m.n_layers = static_cast<int>(shape->n_layers);
  m.kv_heads = static_cast<int>(shape->kv_heads);
  m.head_dim = static_cast<int>(shape->head_dim);
  m.tokens = read_tokens(r, shape->m);
  const auto sums = r.bytes(8 * uint64_t{shape->n_layers});
  if (!r.done()) return std::nullopt;
  m.layer_sums.resize(shape->n_layers);
  std::memcpy(m.layer_sums.data(), sums.data(), sums.size());
  return m;
}

std::optional<ReadReq> decode_read(std::span<const uint8_t> payload) {
  Reader r(payload);
  ReadReq m;
  m.handle = r.get<uint32_t>();
  m.layer = r.get<uint32_t>();
  if (!r.done()) return std::nullopt;
  return m;
}

std::optional<uint32_t> decode_close(std::span<const uint8_t> payload) {
  Reader r(payload);
  const auto h = r.get<uint32_t>();
  if (!r.done()) return std::nullopt;
  return h;
}

std::optional<bool> decode_result(std::span<const uint8_t> payload) {
  if (payload.size() != 1 || payload[0] > 1) return std::nullopt;
  return payload[0] == 1;
}

std::optional<RemoteStats> decode_stats_reply(std::span<const uint8_t> payload) {
  Reader r(payload);
  RemoteStats m;
  for (int64_t* x : {&m.bytes, &m.entries, &m.budget, &m.hits, &m.misses, &m.puts, &m.evictions, &m.corrupt}) {
    *x = r.get<int64_t>();
    if (*x < 0) return std::nullopt;
  }
  if (!r.done()) return std::nullopt;
  return m;
}

std::optional<std::string> decode_error(std::span<const uint8_t> payload) {
  if (payload.size() > kMaxErrorBytes) return std::nullopt;
  std::string s(payload.size(), '?');
  for (size_t i = 0; i < payload.size(); ++i)
    if (payload[i] >= 0x20 && payload[i] < 0x7f) s[i] = static_cast<char>(payload[i]);
  return s;
}

bool decode_empty(std::span<const uint8_t> payload) { return payload.empty(); }

std::optional<SliceHead> decode_slice_head(std::span<const uint8_t> head) {
  if (head.size() < kSliceHeadBytes) return std::nullopt;
  SliceHead h;
  std::memcpy(&h.handle, head.data(), 4);
  std::memcpy(&h.layer, head.data() + 4, 4);
  return h;
}

std::optional<SliceView> decode_slice(std::span<const uint8_t> payload, int64_t layer_bytes) {
  if (layer_bytes < 0 || payload.size() < kSliceHeadBytes ||
      (payload.size() - kSliceHeadBytes) / 2 != static_cast<uint64_t>(layer_bytes) ||
      (payload.size() - kSliceHeadBytes) % 2 != 0)
    return std::nullopt;
  const auto head = decode_slice_head(payload);
  if (!head) return std::nullopt;
  const size_t lb = static_cast<size_t>(layer_bytes);
  return SliceView{*head, payload.subspan(kSliceHeadBytes, lb), payload.subspan(kSliceHeadBytes + lb, lb)};
}

std::optional<PutMsg> decode_put(std::span<const uint8_t> payload) {
  if (payload.size() < 8) return std::nullopt;
  uint64_t sum = 0;
  std::memcpy(&sum, payload.data() + payload.size() - 8, 8);
  if (XXH3_64bits(payload.data(), payload.size() - 8) != sum) return std::nullopt;
  Reader r(payload.first(payload.size() - 8));
  PutMsg m;
  m.key = r.key();
  const auto shape = read_shape(r);
  if (!shape) return std::nullopt;
  // Exactly the tokens, K and V must remain: no allocation on a lie.
  uint64_t data = 0;
  if (__builtin_mul_overflow(shape->layer_bytes, uint64_t{shape->n_layers} * 2, &data) ||
      r.remaining() != 4 * shape->m + data)
    return std::nullopt;
  auto kv = std::make_shared<ChunkKv>();
  kv->dtype = shape->dtype;
  kv->n_layers = static_cast<int>(shape->n_layers);
  kv->kv_heads = static_cast<int>(shape->kv_heads);
  kv->head_dim = static_cast<int>(shape->head_dim);
  kv->tokens = read_tokens(r, shape->m);
  const auto k = r.bytes(data / 2);
  const auto v = r.bytes(data / 2);
  if (!r.done()) return std::nullopt;
  kv->k.resize(k.size());
  kv->v.resize(v.size());
  if (!k.empty()) std::memcpy(kv->k.data(), k.data(), k.size());
  if (!v.empty()) std::memcpy(kv->v.data(), v.data(), v.size());
  if (!kv->consistent()) return std::nullopt;
  m.kv = std::move(kv);
  return m;
}

}  // namespace bs::remote
