#include "storage/storage_server.h"

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it (GCC 12, C++20).
#include <utility>
// clang-format off
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
// clang-format on
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "storage/hmac_auth.h"
#include "storage/remote_protocol.h"
#include "storage/tls_context.h"

namespace bs {

namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using remote::MsgType;

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

class Session;

}  // namespace

// A TLS connection closed without a byte sooner than this after its accept is a
// probe, not a failed handshake.
constexpr std::chrono::milliseconds kProbeSeconds{500};

struct StorageServer::Impl {
  Impl(DiskKvStore& s, StorageServerOptions o) : store(s), opt(std::move(o)) {}

  void accept();
  // Sessions alive, and those of them from `address`.
  std::pair<size_t, size_t> live_sessions(const std::string& address);

  DiskKvStore& store;
  const StorageServerOptions opt;
  // The TLS context of every session; plaintext: an unused one (a stream needs one).
  std::shared_ptr<ssl::context> tls_ctx;
  bool tls = false;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{asio::make_work_guard(io)};
  // The disk's threads: every store call that touches a file (open, read, put,
  // erase) runs here, so a slow disk never holds a network thread.
  asio::thread_pool disk{static_cast<size_t>(opt.disk_threads)};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::vector<std::thread> threads;
  int port = 0;
  std::mutex stop_mu;
  std::atomic<bool> stopped{false};

  std::atomic<int64_t> connections{0}, refused_connections{0}, auth_failures{0}, tls_failures{0}, probes{0},
      bad_frames{0}, layers_served{0}, bytes_served{0}, puts{0};

  std::mutex hook_mu;
  std::function<Fault(const ChunkKey&, int)> hook;

  std::mutex sessions_mu;
  std::vector<std::weak_ptr<Session>> sessions;
};

namespace {

// One connection (TLS when the node has a context). All its handlers run on its
// strand (the socket's and the timer's executor), one at a time.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(StorageServer::Impl& srv, tcp::socket sock, std::string address)
      : srv_(srv), stream_(std::move(sock), *srv.tls_ctx), timer_(stream_.get_executor()),
        address_(std::move(address)) {}

  tcp::socket::executor_type executor() { return stream_.get_executor(); }
  const std::string& address() const { return address_; }  // the peer's IP address ("" if unknown)

  void start() {
    error_code ec;
    const auto ep = sock().remote_endpoint(ec);
    peer_ = ec ? std::string("?") : address_ + ":" + std::to_string(ep.port());
    sock().set_option(tcp::no_delay(true), ec);
    arm_deadline(srv_.opt.io_timeout_s);  // the whole handshake, TLS and the secret's
    if (!srv_.tls) return hello();
    const auto accepted = std::chrono::steady_clock::now();
    stream_.async_handshake(ssl::stream_base::server, [self = shared_from_this(), accepted](const error_code& e) {
      if (e) {
        // Closed at once without a ClientHello: a readiness probe (`blendctl cluster
        // up|status`) or a port scan. Neither counted nor logged; a peer that held
        // the connection without speaking TLS (a plaintext worker waiting for HELLO)
        // is.
        if ((e == asio::ssl::error::stream_truncated || e == asio::error::eof) &&
            std::chrono::steady_clock::now() - accepted < kProbeSeconds) {
          ++self->srv_.probes;
          return self->close();
        }
        ++self->srv_.tls_failures;
        const std::string why = e == asio::error::operation_aborted
                                    ? "no TLS handshake within " + std::to_string(self->srv_.opt.io_timeout_s) + " s"
                                    : e.message();
        std::fprintf(stderr, "blendserve storage: refused %s: TLS: %s\n", self->peer_.c_str(), why.c_str());
        return self->close();
      }
      self->hello();
    });
  }

  // Closes the socket (pending operations end with an error) and drops the entries.
  // No TLS close_notify: the peer sees the connection end either way.
  void close() {
    error_code ec;
    sock().shutdown(tcp::socket::shutdown_both, ec);
    sock().close(ec);
    deadline_armed_ = false;
    timer_.cancel();
    handles_.clear();
  }

 private:
  tcp::socket& sock() { return stream_.next_layer(); }

  // Reads or writes exactly `buffers`, through TLS when the node speaks it.
  template <class Buffers, class Handler>
  void read_exactly(const Buffers& buffers, Handler&& h) {
    if (srv_.tls) asio::async_read(stream_, buffers, std::forward<Handler>(h));
    else asio::async_read(sock(), buffers, std::forward<Handler>(h));
  }
  template <class Buffers, class Handler>
  void write_all(const Buffers& buffers, Handler&& h) {
    if (srv_.tls) asio::async_write(stream_, buffers, std::forward<Handler>(h));
    else asio::async_write(sock(), buffers, std::forward<Handler>(h));
  }

  void hello() {
    try {
      server_nonce_ = remote::random_nonce();
    } catch (const std::exception&) {
      return close();
    }
    out_ = remote::encode_hello({remote::kProtocolVersion, server_nonce_});
    send(false);
  }

  void arm_deadline() { arm_deadline(srv_.opt.io_timeout_s); }
  void arm_deadline(double s) {
    deadline_armed_ = true;
    timer_.expires_after(seconds(s));
    timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (ec == asio::error::operation_aborted) return;
      if (self->deadline_armed_ && self->timer_.expiry() <= std::chrono::steady_clock::now()) self->close();
    });
  }
  void disarm_deadline() {
    deadline_armed_ = false;
    timer_.cancel();
  }

  // The next request. Authenticated: its header may take idle_timeout_s to come (an
  // idle pooled connection), then the rest comes under io_timeout_s. (Read through
  // the TLS layer, which may already hold the next request: so no wait on the bare
  // socket.) Before: the handshake's deadline runs.
  void read_next() {
    if (authed_) arm_deadline(srv_.opt.idle_timeout_s);
    read_header();
  }

  void read_header() {
    read_exactly(asio::buffer(hdr_), [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      if (self->authed_) self->arm_deadline();
      self->on_header();
    });
  }

  void on_header() {
    const int64_t bound = authed_ ? srv_.opt.max_frame_bytes : remote::kPreAuthMaxPayload;
    const auto h = remote::decode_frame_header(hdr_, bound);
    if (!h) return bad_frame("malformed or oversized frame header");
    type_ = h->type;
    try {
      in_.resize(h->length);
    } catch (const std::bad_alloc&) {
      return bad_frame("frame too large for this node's memory");
    }
    if (in_.empty()) return on_frame();
    read_exactly(asio::buffer(in_), [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      self->on_frame();
    });
  }

  void on_frame() {
    disarm_deadline();
    if (!authed_) return on_auth();
    try {
      dispatch();
    } catch (const std::exception& e) {  // e.g. bad_alloc: this connection ends, the node goes on
      std::fprintf(stderr, "blendserve storage: %s: %s\n", peer_.c_str(), e.what());
      close();
    }
    if (in_.capacity() > (size_t{1} << 20)) in_ = {};  // after a PUT: do not keep its buffer
  }

  void on_auth() {
    const auto auth = type_ == MsgType::Auth ? remote::decode_auth(in_) : std::nullopt;
    if (!auth) return bad_frame("expected AUTH");
    const char* why = nullptr;
    if (auth->version != remote::kProtocolVersion)
      why = "protocol version mismatch";
    else if (!remote::proofs_equal(auth->proof,
                                   remote::client_proof(srv_.opt.secret, server_nonce_, auth->client_nonce)))
      why = "authentication failed";
    if (why) {
      ++srv_.auth_failures;
      std::fprintf(stderr, "blendserve storage: refused %s: %s\n", peer_.c_str(), why);
      arm_deadline();
      out_ = remote::encode_error(why);
      return send(true);
    }
    authed_ = true;
    arm_deadline();
    out_ = remote::encode_auth_ok(
        {remote::server_proof(srv_.opt.secret, server_nonce_, auth->client_nonce), srv_.store.budget()});
    send(false);
  }

  void dispatch() {
    switch (type_) {
      case MsgType::Open: return on_open();
      case MsgType::Read: return on_read();
      case MsgType::Close: {
        const auto h = remote::decode_close(in_);
        if (!h) return bad_frame("malformed CLOSE");
        handles_.erase(*h);
        return read_next();
      }
      case MsgType::Contains: {
        const auto key = remote::decode_key_msg(in_);
        if (!key) return bad_frame("malformed CONTAINS");
        return reply(remote::encode_result(srv_.store.contains(*key)));
      }
      case MsgType::Put: {
        if (!srv_.opt.accept_puts) return reply(remote::encode_error("this node does not accept puts"));
        auto put = remote::decode_put(in_);
        if (!put) return bad_frame("malformed PUT (shape, length or checksum)");
        // Written and fsynced on a disk thread.
        asio::post(srv_.disk, [self = shared_from_this(), key = put->key, kv = std::move(put->kv)]() mutable {
          const bool ok = self->srv_.store.put(key, std::move(kv));
          asio::dispatch(self->executor(), [self, ok] {
            if (!ok)
              // Said as an error, so the worker's last_error names it (its entry stays on
              // the worker; the node stays up for reads).
              return self->reply(remote::encode_error(
                  "the storage node could not store the entry: its disk refused the write (full or failing; its "
                  "SSD tier counts write errors)"));
            ++self->srv_.puts;
            self->reply(remote::encode_result(true));
          });
        });
        return;
      }
      case MsgType::Erase: {
        const auto key = remote::decode_key_msg(in_);
        if (!key) return bad_frame("malformed ERASE");
        if (!srv_.opt.accept_puts) return reply(remote::encode_error("this node does not accept changes"));
        asio::post(srv_.disk, [self = shared_from_this(), key = *key] {
          const bool erased = self->srv_.store.erase(key);
          asio::dispatch(self->executor(), [self, erased] { self->reply(remote::encode_result(erased)); });
        });
        return;
      }
      case MsgType::Stats: {
        if (!remote::decode_empty(in_)) return bad_frame("malformed STATS");
        const StoreStats s = srv_.store.stats();
        return reply(remote::encode_stats_reply(
            {s.bytes, s.entries, srv_.store.budget(), s.hits, s.misses, s.puts, s.evictions, s.corrupt}));
      }
      case MsgType::Ping:
        if (!remote::decode_empty(in_)) return bad_frame("malformed PING");
        return reply(remote::encode_empty(MsgType::Pong));
      default:
        return bad_frame(std::string("unexpected ") + remote::msg_type_name(type_));
    }
  }

  // OPEN: the file is opened and its header checked on a disk thread; the answer is
  // sent from the session's strand.
  void on_open() {
    const auto key = remote::decode_key_msg(in_);
    if (!key) return bad_frame("malformed OPEN");
    if (handles_.size() >= StorageServer::kMaxHandles) return reply(remote::encode_error("too many open entries"));
    asio::post(srv_.disk, [self = shared_from_this(), key = *key] {
      std::shared_ptr<DiskKvStore::Entry> e;
      if (auto opened = self->srv_.store.open(key)) e = std::make_shared<DiskKvStore::Entry>(std::move(*opened));
      asio::dispatch(self->executor(), [self, e = std::move(e)]() mutable { self->opened(std::move(e)); });
    });
  }

  void opened(std::shared_ptr<DiskKvStore::Entry> e) {
    if (!e) return reply(remote::encode_empty(MsgType::NotFound));
    remote::EntryInfo info;
    info.handle = next_handle_++;
    info.dtype = e->dtype;
    info.n_layers = e->n_layers, info.kv_heads = e->kv_heads, info.head_dim = e->head_dim;
    info.tokens = e->tokens;
    info.layer_sums = e->layer_sums();  // checked with the header at open(): the file this entry reads
    if (2 * e->layer_bytes() + static_cast<int64_t>(remote::kSliceHeadBytes) > srv_.opt.max_frame_bytes)
      return reply(remote::encode_error("entry's layers exceed the frame bound"));
    handles_.emplace(info.handle, std::move(e));
    reply(remote::encode_entry(info));
  }

  // READ: the slice is read (and its checksum checked) into the reply buffer on a disk
  // thread, then sent from the strand. No other handler of this session runs
  // meanwhile (the next request is read after this reply), except a close, which
  // leaves the buffer and the entry (held here) alone.
  void on_read() {
    const auto req = remote::decode_read(in_);
    if (!req) return bad_frame("malformed READ");
    const auto it = handles_.find(req->handle);
    if (it == handles_.end()) return reply(remote::encode_error("unknown handle"));
    std::shared_ptr<const DiskKvStore::Entry> e = it->second;
    if (req->layer >= static_cast<uint32_t>(e->n_layers)) return reply(remote::encode_error("no such layer"));
    const int64_t lb = e->layer_bytes();
    const auto head = remote::encode_slice_head(req->handle, req->layer, lb);
    if (!head) return reply(remote::encode_error("layer too large"));
    out_.resize(head->size() + 2 * static_cast<size_t>(lb));
    std::memcpy(out_.data(), head->data(), head->size());
    asio::post(srv_.disk, [self = shared_from_this(), e, handle = req->handle, layer = static_cast<int>(req->layer),
                           at = head->size(), lb] {
      auto* k = reinterpret_cast<std::byte*>(self->out_.data() + at);
      const bool ok = self->srv_.store.read_layer(*e, layer, k, k + lb);
      asio::dispatch(self->executor(), [self, e, handle, layer, at, lb, ok] { self->read_done(*e, handle, layer, at, lb, ok); });
    });
  }

  void read_done(const DiskKvStore::Entry& e, uint32_t handle, int layer, size_t head_size, int64_t lb, bool ok) {
    if (!ok) {  // the store has dropped the file
      const std::string msg = "layer " + std::to_string(layer) + " of " + e.key.hex() + " failed its read or checksum";
      handles_.erase(handle);
      return reply(remote::encode_error(msg));
    }
    StorageServer::Fault fault = StorageServer::Fault::none;
    {
      std::function<StorageServer::Fault(const ChunkKey&, int)> hook;
      {
        std::lock_guard<std::mutex> lock(srv_.hook_mu);
        hook = srv_.hook;
      }
      if (hook) fault = hook(e.key, layer);
    }
    switch (fault) {
      case StorageServer::Fault::none: break;
      case StorageServer::Fault::corrupt:
        if (lb > 0) out_[head_size + static_cast<size_t>(lb)] ^= 0x5a;
        break;
      case StorageServer::Fault::truncate: {
        arm_deadline();
        write_all(asio::buffer(out_.data(), out_.size() / 2),
                  [self = shared_from_this()](const error_code&, size_t) { self->close(); });
        return;
      }
      case StorageServer::Fault::close: return close();
      case StorageServer::Fault::stall: return arm_deadline();  // nothing sent; the deadline closes it
    }
    send(false, 2 * lb);
  }

  void reply(remote::Bytes frame) {
    out_ = std::move(frame);
    arm_deadline();
    send(false);
  }

  // A frame that breaks the protocol: counted, answered with an ERROR, closed.
  void bad_frame(const std::string& why) {
    ++srv_.bad_frames;
    out_ = remote::encode_error(why);
    arm_deadline();
    send(true);
  }

  // Writes out_ under the armed deadline; then the next request, or closes.
  // slice_bytes >= 0: a SLICE of that many K+V bytes, counted once written.
  void send(bool close_after, int64_t slice_bytes = -1) {
    write_all(asio::buffer(out_),
              [self = shared_from_this(), close_after, slice_bytes](const error_code& ec, size_t) {
                        if (ec || close_after) return self->close();
                        if (slice_bytes >= 0) {
                          ++self->srv_.layers_served;
                          self->srv_.bytes_served += slice_bytes;
                        }
                        self->read_next();
                      });
  }

  StorageServer::Impl& srv_;
  ssl::stream<tcp::socket> stream_;
  asio::steady_timer timer_;
  bool deadline_armed_ = false;
  const std::string address_;  // the peer's IP address, for the per-peer limit (read by the acceptor)
  std::string peer_;     // address:port, for messages
  remote::Nonce server_nonce_{};
  bool authed_ = false;
  std::array<uint8_t, remote::kFrameHeaderBytes> hdr_{};
  MsgType type_ = MsgType::Error;
  std::vector<uint8_t> in_;   // the request payload
  std::vector<uint8_t> out_;  // the reply frame (at most one layer slice)
  // Shared with a disk thread's read in progress (a close clears the map meanwhile).
  std::map<uint32_t, std::shared_ptr<const DiskKvStore::Entry>> handles_;
  uint32_t next_handle_ = 1;
};

}  // namespace

std::pair<size_t, size_t> StorageServer::Impl::live_sessions(const std::string& address) {
  std::lock_guard<std::mutex> lock(sessions_mu);
  std::erase_if(sessions, [](const std::weak_ptr<Session>& s) { return s.expired(); });
  size_t from_address = 0;
  for (const auto& w : sessions)
    if (const auto s = w.lock(); s && s->address() == address) ++from_address;
  return {sessions.size(), from_address};
}

void StorageServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(io), [this](const error_code& ec, tcp::socket sock) {
    if (stopped.load()) return;
    if (ec == asio::error::operation_aborted) return;
    if (ec) {  // e.g. out of file descriptors: try again shortly instead of spinning
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](const error_code& e) {
        if (!e && !stopped.load()) accept();
      });
      return;
    }
    error_code aec;
    const auto ep = sock.remote_endpoint(aec);
    std::string address = aec ? std::string() : ep.address().to_string();
    const auto [live, from_peer] = live_sessions(address);
    if (live >= static_cast<size_t>(opt.max_connections) ||
        from_peer >= static_cast<size_t>(opt.max_connections_per_peer)) {
      ++refused_connections;
      error_code ignore;
      sock.close(ignore);
    } else {
      auto s = std::make_shared<Session>(*this, std::move(sock), std::move(address));
      {
        std::lock_guard<std::mutex> lock(sessions_mu);
        sessions.push_back(s);
      }
      ++connections;
      // Started on its own strand, like every later handler of it.
      asio::dispatch(s->executor(), [s] { s->start(); });
    }
    accept();
  });
}

StorageServer::StorageServer(DiskKvStore& store, StorageServerOptions opt) {
  if (opt.secret.empty()) throw std::invalid_argument("storage server: the cluster secret is required");
  if (opt.threads < 1 || opt.disk_threads < 1 || opt.max_connections < 1 || opt.max_connections_per_peer < 1 ||
      !(opt.io_timeout_s > 0) ||
      opt.max_frame_bytes < remote::kPreAuthMaxPayload || opt.max_frame_bytes > UINT32_MAX || opt.port < 0 ||
      opt.port > 65535 || !(opt.idle_timeout_s > 0))
    throw std::invalid_argument("storage server: options out of range");
  impl_ = std::make_unique<Impl>(store, std::move(opt));
  Impl& s = *impl_;
  s.tls = s.opt.tls.enabled();
  s.tls_ctx = s.tls ? tls::server_context(s.opt.tls, s.opt.tls_peers)
                    : std::make_shared<ssl::context>(ssl::context::tls_server);
  auto fail = [&](const error_code& ec, const char* what) {
    throw std::system_error(std::error_code(ec.value(), std::system_category()),
                            "storage server: " + std::string(what) + " " + s.opt.bind_host + ":" +
                                std::to_string(s.opt.port) + ": " + ec.message());
  };
  error_code ec;
  tcp::resolver resolver(s.io);
  const auto eps = resolver.resolve(s.opt.bind_host, std::to_string(s.opt.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || eps.empty()) fail(ec ? ec : asio::error::host_not_found, "cannot resolve");
  const tcp::endpoint ep = *eps.begin();
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail(ec, "cannot listen on");
  s.port = s.acceptor.local_endpoint(ec).port();
  s.accept();
  for (int i = 0; i < s.opt.threads; ++i)
    s.threads.emplace_back([&s] {
      for (;;) {
        try {
          s.io.run();
          return;
        } catch (const std::exception& e) {  // a handler threw: its connection is gone, serving goes on
          std::fprintf(stderr, "blendserve storage: %s\n", e.what());
        }
      }
    });
}

StorageServer::~StorageServer() { stop(); }

int StorageServer::port() const { return impl_->port; }

void StorageServer::stop() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.stop_mu);
  if (s.stopped.exchange(true)) return;
  s.work.reset();
  s.io.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  // The disk's work queued is dropped, what runs finishes (one read or write); what
  // it posts back lands in the stopped io_context and is run or dropped below.
  s.disk.stop();
  s.disk.join();
  // No handler runs now: close everything from here, then let the aborted
  // operations' handlers run once so the sessions (and their open files) go.
  error_code ec;
  s.acceptor.close(ec);
  s.accept_retry.cancel();
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> l(s.sessions_mu);
    for (auto& w : s.sessions)
      if (auto p = w.lock()) live.push_back(std::move(p));
    s.sessions.clear();
  }
  for (auto& p : live) p->close();
  live.clear();
  s.io.restart();
  s.io.poll();
}

StorageServer::Stats StorageServer::stats() const {
  const Impl& s = *impl_;
  Stats st;
  st.connections = s.connections.load();
  st.refused_connections = s.refused_connections.load();
  st.auth_failures = s.auth_failures.load();
  st.tls_failures = s.tls_failures.load();
  st.probes = s.probes.load();
  st.bad_frames = s.bad_frames.load();
  st.layers_served = s.layers_served.load();
  st.bytes_served = s.bytes_served.load();
  st.puts = s.puts.load();
  return st;
}

void StorageServer::set_fault_hook(std::function<Fault(const ChunkKey&, int layer)> hook) {
  std::lock_guard<std::mutex> lock(impl_->hook_mu);
  impl_->hook = std::move(hook);
}

}  // namespace bs
