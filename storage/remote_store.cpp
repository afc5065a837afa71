#include "storage/remote_store.h"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cstring>
// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it (GCC 12, C++20).
#include <utility>
// clang-format off
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
// clang-format on
#include <deque>
#include <optional>
#include <stdexcept>
#include <utility>

#include "storage/hmac_auth.h"
#include "storage/remote_protocol.h"
#include "storage/tls_context.h"

namespace bs {

namespace remote {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using clock = std::chrono::steady_clock;

namespace {
clock::duration seconds(double s) {
  return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

// One authenticated connection to the node (TLS when the store has a context), with
// its own io_context: every operation is an Asio async operation run with
// run_until(deadline), so nothing waits past its deadline. On any failure the
// connection is `broken` (its socket closed) and `error` says why; a broken
// connection is never reused.
class Connection {
 public:
  // `tls`: the store's client context, or null for plaintext (then the stream's TLS
  // layer is never used; it needs some context, so it gets a plain one).
  Connection(const RemoteStoreOptions& opt, ssl::context* tls)
      : opt_(opt), plain_(tls ? nullptr : std::make_unique<ssl::context>(ssl::context::tls_client)),
        stream_(io_, tls ? *tls : *plain_), tls_(tls != nullptr) {}

  bool broken() const { return broken_; }
  void set_broken() {
    broken_ = true;
    error_code ec;
    sock().close(ec);
  }
  const std::string& error() const { return error_; }
  int64_t budget() const { return budget_; }
  void touch() { last_used_ = clock::now(); }

  // An idle pooled connection is still usable if it has not idled past
  // idle_timeout_s and nothing is readable on it: the node never speaks unasked, so
  // readable means it closed (restarted, timed out) or sent garbage.
  bool idle_alive() {
    if (broken_ || !sock().is_open()) return false;
    if (clock::now() - last_used_ > seconds(opt_.idle_timeout_s)) return false;
    pollfd p{sock().native_handle(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }

  // Connects and authenticates (both ways) before `deadline`.
  bool connect(clock::time_point deadline) {
    error_code ec;
    tcp::endpoint ep;
    const auto addr = asio::ip::make_address(opt_.host, ec);
    if (!ec) {
      ep = tcp::endpoint(addr, static_cast<unsigned short>(opt_.port));
    } else {
      // A host name: the system resolver (getaddrinfo), under its own timeouts.
      tcp::resolver resolver(io_);
      const auto eps = resolver.resolve(opt_.host, std::to_string(opt_.port), tcp::resolver::numeric_service, ec);
      if (ec || eps.empty()) return fail("cannot resolve " + opt_.host + ": " + (ec ? ec.message() : "no address"));
      ep = *eps.begin();
    }
    const std::string where = opt_.host + ":" + std::to_string(opt_.port);
    if (!run([&](auto handler) { sock().async_connect(ep, handler); }, deadline, "connecting to " + where))
      return false;
    sock().set_option(tcp::no_delay(true), ec);
    if (tls_) {
      // The node must be the member the cluster file names; then ours is checked.
      tls::set_peer_name(stream_, opt_.tls_peer_name.empty() ? opt_.host : opt_.tls_peer_name);
      if (!run([&](auto handler) { stream_.async_handshake(ssl::stream_base::client, handler); }, deadline,
               "the TLS handshake with " + where))
        return false;
    }

    std::vector<uint8_t> payload;
    auto h = read_frame(payload, deadline, kPreAuthMaxPayload, "HELLO");
    if (!h) return false;
    if (h->type == MsgType::Error) return fail(where + " refused: " + decode_error(payload).value_or("?"));
    const auto hello = h->type == MsgType::Hello ? decode_hello(payload) : std::nullopt;
    if (!hello) return fail(where + " sent no valid HELLO");
    if (hello->version != kProtocolVersion)
      return fail(where + " speaks protocol version " + std::to_string(hello->version) + ", this worker " +
                  std::to_string(kProtocolVersion));
    Auth auth;
    try {
      auth.client_nonce = random_nonce();
      auth.proof = client_proof(opt_.secret, hello->nonce, auth.client_nonce);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    if (!write(encode_auth(auth), deadline, "AUTH")) return false;
    h = read_frame(payload, deadline, kPreAuthMaxPayload, "AUTH_OK");
    if (!h) return false;
    if (h->type == MsgType::Error)
      return fail(where + " refused authentication: " + decode_error(payload).value_or("?"));
    const auto ok = h->type == MsgType::AuthOk ? decode_auth_ok(payload) : std::nullopt;
    if (!ok) return fail(where + " sent no valid AUTH_OK");
    if (!proofs_equal(ok->proof, server_proof(opt_.secret, hello->nonce, auth.client_nonce)))
      return fail(where + " failed to prove the cluster secret");
    budget_ = ok->budget;
    return true;
  }

  bool write(const std::vector<uint8_t>& frame, clock::time_point deadline, const std::string& what) {
    return run(
        [&](auto handler) {
          if (tls_) asio::async_write(stream_, asio::buffer(frame), handler);
          else asio::async_write(sock(), asio::buffer(frame), handler);
        },
        deadline, "sending " + what);
  }

  // Reads exactly the bytes `buffers` (an Asio buffer sequence) holds.
  template <class Buffers>
  bool read(const Buffers& buffers, clock::time_point deadline, const std::string& what) {
    return run(
        [&](auto handler) {
          if (tls_) asio::async_read(stream_, buffers, handler);
          else asio::async_read(sock(), buffers, handler);
        },
        deadline, "reading " + what);
  }

  // A frame header within `bound`, or nullopt (failure recorded).
  std::optional<FrameHeader> read_header(clock::time_point deadline, int64_t bound, const std::string& what) {
    std::array<uint8_t, kFrameHeaderBytes> hdr{};
    if (!read(asio::buffer(hdr), deadline, what)) return std::nullopt;
    const auto h = decode_frame_header(hdr, bound);
    if (!h) {
      uint32_t len = 0;
      std::memcpy(&len, hdr.data(), 4);
      fail("malformed frame header for " + what + " (type " + std::to_string(hdr[4]) + ", length " +
           std::to_string(len) + ", bound " + std::to_string(bound) + ")");
    }
    return h;
  }

  // A whole frame: its header, and its payload into `payload`.
  std::optional<FrameHeader> read_frame(std::vector<uint8_t>& payload, clock::time_point deadline, int64_t bound,
                                        const std::string& what) {
    const auto h = read_header(deadline, bound, what);
    if (!h) return std::nullopt;
    payload.resize(h->length);
    if (!payload.empty() && !read(asio::buffer(payload), deadline, what)) return std::nullopt;
    return h;
  }

  bool fail(const std::string& why) {
    if (error_.empty()) error_ = why;
    set_broken();
    return false;
  }

 private:
  // Starts one async operation (`start(handler)`) and runs this connection's
  // io_context until it completes or `deadline` passes; then the socket is closed
  // and the aborted operation's handler runs, so nothing is left pending.
  template <class Start>
  bool run(Start&& start, clock::time_point deadline, const std::string& what) {
    if (broken_) return fail(what + ": connection already broken");
    std::optional<error_code> result;
    start([&result](const error_code& ec, auto&&...) { result = ec; });
    io_.restart();
    io_.run_until(deadline);
    if (!result) {
      error_code ignore;
      sock().close(ignore);
      io_.restart();
      io_.run();  // the aborted operation's handler
      return fail(what + ": timed out");
    }
    if (*result) return fail(what + ": " + (*result == asio::error::eof ? "connection closed by the node" : result->message()));
    return true;
  }

  tcp::socket& sock() { return stream_.next_layer(); }

  const RemoteStoreOptions& opt_;
  asio::io_context io_{1};
  std::unique_ptr<ssl::context> plain_;  // plaintext: the unused TLS layer's context
  ssl::stream<tcp::socket> stream_;
  bool tls_;
  clock::time_point last_used_ = clock::now();
  bool broken_ = false;
  std::string error_;
  int64_t budget_ = 0;
};

// An entry opened on the node, read layer by layer with up to layers_in_flight
// READs outstanding on its connection.
class RemoteLayerReader final : public LayerReader {
 public:
  RemoteLayerReader(const RemoteKvStore& store, std::unique_ptr<Connection> conn, EntryInfo info)
      : store_(store), conn_(std::move(conn)), info_(std::move(info)), lb_(info_.layer_bytes()) {}

  ~RemoteLayerReader() override {
    if (!conn_) return;
    if (failed_ || !inflight_.empty()) {
      conn_->set_broken();  // slices still coming: not worth draining
    } else {
      conn_->write(encode_close(info_.handle), clock::now() + seconds(store_.opt_.io_timeout_s), "CLOSE");
    }
    store_.release(std::move(conn_));
  }

  const std::vector<int32_t>& tokens() const override { return info_.tokens; }
  int n_layers() const override { return info_.n_layers; }
  int kv_heads() const override { return info_.kv_heads; }
  int head_dim() const override { return info_.head_dim; }
  kernels::TensorType dtype() const override { return info_.dtype; }

  bool read_layer(int layer, std::byte* k, std::byte* v) override {
    if (layer < 0 || layer >= info_.n_layers) return false;
    if (failed_ || !conn_) {
      store_.count_miss();
      return false;
    }
    if (std::find(inflight_.begin(), inflight_.end(), layer) == inflight_.end()) {
      // Not asked for yet (first read, or out of order): what is in flight is read
      // and dropped, and the pipeline restarts here.
      while (!inflight_.empty())
        if (!receive(inflight_.front(), nullptr, nullptr)) return false;
      next_ = layer;
    }
    while (inflight_.empty() || inflight_.front() != layer) {
      if (inflight_.empty()) {
        if (!fill()) return false;
      } else if (!receive(inflight_.front(), nullptr, nullptr)) {
        return false;
      }
    }
    if (!receive(layer, k, v)) return false;
    return fill();  // the next layers travel while the caller computes
  }

 private:
  // Requests layers from next_ on until layers_in_flight are outstanding (or none is
  // left), in one write.
  bool fill() {
    std::vector<uint8_t> frames;
    while (static_cast<int>(inflight_.size()) < store_.opt_.layers_in_flight && next_ < info_.n_layers) {
      const auto f = encode_read({info_.handle, static_cast<uint32_t>(next_)});
      frames.insert(frames.end(), f.begin(), f.end());
      inflight_.push_back(next_++);
    }
    if (frames.empty()) return true;
    if (!conn_->write(frames, clock::now() + seconds(store_.opt_.io_timeout_s), "READ"))
      return failure(RemoteKvStore::Failure::transport, conn_->error());
    return true;
  }

  // Receives the next slice, which must be layer `layer`, into k and v (nullptr:
  // into a scratch buffer, dropped) and checks it against the ENTRY's layer sum.
  bool receive(int layer, std::byte* k, std::byte* v) {
    const auto deadline = clock::now() + seconds(store_.opt_.io_timeout_s);
    const std::string what = "layer " + std::to_string(layer) + " of " + key_hex();
    const auto h = conn_->read_header(deadline, store_.opt_.max_frame_bytes, what);
    if (!h) return failure(RemoteKvStore::Failure::transport, conn_->error());
    if (h->type == MsgType::Error) {
      std::vector<uint8_t> payload(h->length);
      if (!conn_->read(asio::buffer(payload), deadline, what))
        return failure(RemoteKvStore::Failure::transport, conn_->error());
      return failure(RemoteKvStore::Failure::reply, "node: " + decode_error(payload).value_or("?") + " (" + what + ")");
    }
    if (h->type != MsgType::Slice || h->length != kSliceHeadBytes + 2 * static_cast<uint64_t>(lb_))
      return failure(RemoteKvStore::Failure::transport,
                     std::string("unexpected ") + msg_type_name(h->type) + " of " + std::to_string(h->length) +
                         " bytes for " + what);
    std::array<uint8_t, kSliceHeadBytes> head{};
    const bool keep = k && v;
    if (!keep) {
      scratch_.resize(2 * static_cast<size_t>(lb_));
      k = scratch_.data();
      v = scratch_.data() + lb_;
    }
    const std::array<asio::mutable_buffer, 3> bufs{asio::buffer(head), asio::buffer(k, static_cast<size_t>(lb_)),
                                                   asio::buffer(v, static_cast<size_t>(lb_))};
    if (!conn_->read(bufs, deadline, what)) return failure(RemoteKvStore::Failure::transport, conn_->error());
    const auto sh = decode_slice_head(head);
    if (!sh || sh->handle != info_.handle || sh->layer != static_cast<uint32_t>(layer))
      return failure(RemoteKvStore::Failure::transport, "slice out of step for " + what);
    inflight_.pop_front();
    if (keep &&
        layer_checksum(k, v, static_cast<size_t>(lb_)) != info_.layer_sums[static_cast<size_t>(layer)])
      return failure(RemoteKvStore::Failure::corrupt, what + " failed its checksum");
    return true;
  }

  bool failure(RemoteKvStore::Failure kind, const std::string& why) {
    failed_ = true;
    conn_->set_broken();
    store_.fail(kind, why);
    if (kind != RemoteKvStore::Failure::corrupt) store_.count_miss();
    return false;
  }

  std::string key_hex() const { return "handle " + std::to_string(info_.handle); }

  const RemoteKvStore& store_;
  std::unique_ptr<Connection> conn_;
  EntryInfo info_;
  int64_t lb_;
  std::deque<int> inflight_;  // layers requested, not yet received, in order
  int next_ = 0;              // the next layer to request
  bool failed_ = false;
  std::vector<std::byte> scratch_;
};

}  // namespace remote

using remote::MsgType;

RemoteKvStore::RemoteKvStore(RemoteStoreOptions opt) : opt_(std::move(opt)) {
  if (opt_.secret.empty()) throw std::invalid_argument("remote store: the cluster secret is required");
  if (opt_.port < 1 || opt_.port > 65535 || !(opt_.connect_timeout_s > 0) || !(opt_.io_timeout_s > 0) ||
      !(opt_.retry_after_s >= 0) || opt_.layers_in_flight < 1 || opt_.max_connections < 1 ||
      opt_.max_frame_bytes < remote::kPreAuthMaxPayload || !(opt_.idle_timeout_s > 0))
    throw std::invalid_argument("remote store: options out of range");
  if (opt_.tls.enabled()) tls_ = tls::client_context(opt_.tls);
}

RemoteKvStore::~RemoteKvStore() = default;

bool RemoteKvStore::down() const {
  const int64_t until = down_until_ns_.load(std::memory_order_relaxed);
  return until != 0 && clock::now().time_since_epoch().count() < until;
}

void RemoteKvStore::fail(Failure kind, const std::string& what) const {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    last_error_ = what;
  }
  if (kind == Failure::corrupt) corrupt_.fetch_add(1, std::memory_order_relaxed);
  if (kind != Failure::transport) return;
  down_until_ns_.store((clock::now() + remote::seconds(opt_.retry_after_s)).time_since_epoch().count(),
                       std::memory_order_relaxed);
  // The idle connections are likely as dead as this one (a stopped or frozen node):
  // drop them rather than have each cost a timeout later.
  std::vector<std::unique_ptr<remote::Connection>> drop;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    drop.swap(idle_);
    open_ -= static_cast<int>(drop.size());
  }
  pool_cv_.notify_all();
}

std::string RemoteKvStore::last_error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return last_error_;
}

std::unique_ptr<remote::Connection> RemoteKvStore::acquire() const {
  if (down()) return nullptr;
  const auto deadline = clock::now() + remote::seconds(opt_.connect_timeout_s);
  std::vector<std::unique_ptr<remote::Connection>> dead;  // closed outside the lock
  {
    std::unique_lock<std::mutex> lock(pool_mu_);
    for (;;) {
      while (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        if (c->idle_alive()) return c;
        --open_;  // the node closed it meanwhile (restarted): a fresh one below
        dead.push_back(std::move(c));
      }
      if (open_ < opt_.max_connections) break;
      if (pool_cv_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
          open_ >= opt_.max_connections) {
        lock.unlock();
        fail(Failure::reply, "all " + std::to_string(opt_.max_connections) + " connections to the node are busy");
        return nullptr;
      }
      if (down()) return nullptr;
    }
    ++open_;
  }
  dead.clear();
  auto c = std::make_unique<remote::Connection>(opt_, tls_.get());
  if (!c->connect(deadline)) {
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      --open_;
    }
    pool_cv_.notify_one();
    fail(Failure::transport, c->error());
    return nullptr;
  }
  budget_.store(c->budget(), std::memory_order_relaxed);
  down_until_ns_.store(0, std::memory_order_relaxed);
  return c;
}

void RemoteKvStore::release(std::unique_ptr<remote::Connection> c) const {
  if (!c) return;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (c->broken()) {
      --open_;
    } else {
      c->touch();
      idle_.push_back(std::move(c));
    }
  }
  pool_cv_.notify_one();
}

std::optional<RemoteKvStore::Reply> RemoteKvStore::call(const std::vector<uint8_t>& request) const {
  auto c = acquire();
  if (!c) return std::nullopt;
  const auto deadline = clock::now() + remote::seconds(opt_.io_timeout_s);
  const std::string what = remote::msg_type_name(static_cast<MsgType>(request[4]));
  Reply r;
  std::optional<remote::FrameHeader> h;
  if (c->write(request, deadline, what)) h = c->read_frame(r.payload, deadline, opt_.max_frame_bytes, what + "'s reply");
  if (!h) {
    fail(Failure::transport, c->error());
    release(std::move(c));
    return std::nullopt;
  }
  r.type = static_cast<uint8_t>(h->type);
  if (h->type == MsgType::Error)
    fail(Failure::reply, "node: " + remote::decode_error(r.payload).value_or("?") + " (" + what + ")");
  release(std::move(c));
  return r;
}

std::unique_ptr<LayerReader> RemoteKvStore::open_layers(const ChunkKey& key) {
  auto c = acquire();
  if (!c) {
    count_miss();
    return nullptr;
  }
  const auto deadline = clock::now() + remote::seconds(opt_.io_timeout_s);
  std::vector<uint8_t> payload;
  std::optional<remote::FrameHeader> h;
  if (c->write(remote::encode_key_msg(MsgType::Open, key), deadline, "OPEN"))
    h = c->read_frame(payload, deadline, opt_.max_frame_bytes, "OPEN's reply");
  std::optional<remote::EntryInfo> info;
  if (h && h->type == MsgType::Entry) {
    info = remote::decode_entry(payload);
    if (!info) c->fail("malformed ENTRY for " + key.hex());
    // Its slices must fit the frame bound, or reading them would fail later anyway.
    else if (2 * info->layer_bytes() + static_cast<int64_t>(remote::kSliceHeadBytes) > opt_.max_frame_bytes)
      c->fail("entry " + key.hex() + "'s layers exceed max_frame_bytes");
  } else if (h && h->type == MsgType::Error) {
    fail(Failure::reply, "node: " + remote::decode_error(payload).value_or("?") + " (OPEN " + key.hex() + ")");
  } else if (h && (h->type != MsgType::NotFound || !payload.empty())) {
    c->fail(std::string("unexpected ") + remote::msg_type_name(h->type) + " in reply to OPEN");
  }
  if (c->broken()) {
    fail(Failure::transport, c->error());
    release(std::move(c));
    count_miss();
    return nullptr;
  }
  if (!info) {
    release(std::move(c));
    count_miss();
    return nullptr;
  }
  count_hit();
  return std::make_unique<remote::RemoteLayerReader>(*this, std::move(c), std::move(*info));
}

std::shared_ptr<const ChunkKv> RemoteKvStore::get(const ChunkKey& key) {
  auto reader = open_layers(key);
  if (!reader) return nullptr;
  auto kv = std::make_shared<ChunkKv>();
  kv->tokens = reader->tokens();
  kv->n_layers = reader->n_layers(), kv->kv_heads = reader->kv_heads(), kv->head_dim = reader->head_dim();
  kv->dtype = reader->dtype();
  kv->allocate();
  for (int l = 0; l < kv->n_layers; ++l)
    if (!reader->read_layer(l, kv->k_layer(l), kv->v_layer(l))) return nullptr;
  return kv;
}

bool RemoteKvStore::contains(const ChunkKey& key) const {
  const auto r = call(remote::encode_key_msg(MsgType::Contains, key));
  return r && r->type == static_cast<uint8_t>(MsgType::Result) && remote::decode_result(r->payload).value_or(false);
}

bool RemoteKvStore::put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
  if (!kv) return false;
  const auto frame = remote::encode_put(key, *kv, opt_.max_frame_bytes);
  if (!frame) return false;
  const auto r = call(*frame);
  const bool ok =
      r && r->type == static_cast<uint8_t>(MsgType::Result) && remote::decode_result(r->payload).value_or(false);
  if (ok) puts_.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

bool RemoteKvStore::erase(const ChunkKey& key) {
  const auto r = call(remote::encode_key_msg(MsgType::Erase, key));
  return r && r->type == static_cast<uint8_t>(MsgType::Result) && remote::decode_result(r->payload).value_or(false);
}

StoreStats RemoteKvStore::stats() const {
  if (const auto r = call(remote::encode_empty(MsgType::Stats));
      r && r->type == static_cast<uint8_t>(MsgType::StatsReply))
    if (const auto s = remote::decode_stats_reply(r->payload)) {
      node_bytes_.store(s->bytes, std::memory_order_relaxed);
      node_entries_.store(s->entries, std::memory_order_relaxed);
      budget_.store(s->budget, std::memory_order_relaxed);
    }
  StoreStats st;
  st.hits = hits_.load(std::memory_order_relaxed);
  st.misses = misses_.load(std::memory_order_relaxed);
  st.puts = puts_.load(std::memory_order_relaxed);
  st.corrupt = corrupt_.load(std::memory_order_relaxed);
  st.bytes = node_bytes_.load(std::memory_order_relaxed);
  st.entries = node_entries_.load(std::memory_order_relaxed);
  return st;
}

int64_t RemoteKvStore::budget() const {
  if (budget_.load(std::memory_order_relaxed) < 0) release(acquire());  // AUTH_OK carries it
  return std::max<int64_t>(0, budget_.load(std::memory_order_relaxed));
}

bool RemoteKvStore::reachable() {
  const auto r = call(remote::encode_empty(MsgType::Ping));
  return r && r->type == static_cast<uint8_t>(MsgType::Pong);
}

}  // namespace bs
