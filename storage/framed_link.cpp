#include "storage/framed_link.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without it.
#include <utility>
// clang-format off
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
// clang-format on

#include "storage/tls_context.h"

namespace bs {
namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using clock_type = std::chrono::steady_clock;

constexpr size_t kHeaderBytes = 4;

std::array<uint8_t, kHeaderBytes> encode_length(size_t n) {
  const auto v = static_cast<uint32_t>(n);
  return {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
          static_cast<uint8_t>(v >> 24)};
}
uint32_t decode_length(const std::array<uint8_t, kHeaderBytes>& h) {
  return uint32_t{h[0]} | uint32_t{h[1]} << 8 | uint32_t{h[2]} << 16 | uint32_t{h[3]} << 24;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

clock_type::duration span(double s) { return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s)); }

// Reads or writes exactly `buffers` on `stream`, through TLS when `tls`.
template <class Stream, class Buffers, class Handler>
void read_exactly(Stream& stream, bool tls, const Buffers& b, Handler&& h) {
  if (tls) asio::async_read(stream, b, std::forward<Handler>(h));
  else asio::async_read(stream.next_layer(), b, std::forward<Handler>(h));
}
template <class Stream, class Buffers, class Handler>
void write_all(Stream& stream, bool tls, const Buffers& b, Handler&& h) {
  if (tls) asio::async_write(stream, b, std::forward<Handler>(h));
  else asio::async_write(stream.next_layer(), b, std::forward<Handler>(h));
}

}  // namespace

// ---- server ----

struct FramedSession;

struct FramedServer::Impl {
  // Declared before the io_context: a session that io's destructor would drop
  // still finds them (none should be left: the thread runs io until it is empty).
  FramedServerOptions opt;
  Handler handler;
  std::shared_ptr<ssl::context> ctx;  // plaintext: an unused one (a stream needs one)
  bool tls = false;
  int port = 0;
  int live = 0;  // sessions open (the io thread's only)
  std::atomic<int64_t> connections{0}, refused{0}, tls_failures{0}, closed_before_handshake{0}, bad_frames{0},
      requests{0};
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::thread thread;
  std::vector<std::weak_ptr<FramedSession>> sessions;  // for stop (the io thread's only)

  void accept();
};

struct FramedSession : std::enable_shared_from_this<FramedSession> {
  FramedSession(FramedServer::Impl& s, tcp::socket sock)
      : srv(s), stream(std::move(sock), *s.ctx), timer(s.io) {}
  ~FramedSession() { --srv.live; }

  FramedServer::Impl& srv;
  ssl::stream<tcp::socket> stream;
  asio::steady_timer timer;
  std::string peer;
  std::array<uint8_t, kHeaderBytes> hdr{};
  std::string in, out;
  bool closed = false;

  void deadline(double s) {
    timer.expires_after(span(s));
    timer.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec) self->close();
    });
  }
  void close() {
    if (closed) return;
    closed = true;
    error_code ec;
    stream.next_layer().shutdown(tcp::socket::shutdown_both, ec);
    stream.next_layer().close(ec);
    timer.cancel();
  }

  void start() {
    error_code ec;
    const auto ep = stream.next_layer().remote_endpoint(ec);
    peer = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    stream.next_layer().set_option(tcp::no_delay(true), ec);
    deadline(srv.opt.io_timeout_s);
    if (!srv.tls) return read_next();
    // A peer that connects and closes at once without sending a byte (a readiness
    // probe, a port scan) is no TLS failure: wait for the first bytes before the
    // handshake. One that held the connection silent and then closed is.
    const auto accepted = clock_type::now();
    stream.next_layer().async_wait(tcp::socket::wait_read, [self = shared_from_this(), accepted](const error_code& e) {
      if (e) return self->close();
      error_code ae;
      if (self->stream.next_layer().available(ae) == 0 || ae) {
        const double held = std::chrono::duration<double>(clock_type::now() - accepted).count();
        if (held < 0.5) {
          ++self->srv.closed_before_handshake;
        } else if (const int64_t n = ++self->srv.tls_failures; n <= 10 || n % 100 == 0) {
          std::fprintf(stderr, "blendserve %s: refused %s: closed without a TLS handshake after %s (%lld refused so far)\n",
                       self->srv.opt.name.c_str(), self->peer.c_str(), seconds_text(held).c_str(),
                       static_cast<long long>(n));
        }
        return self->close();
      }
      self->stream.async_handshake(ssl::stream_base::server, [self](const error_code& he) {
        if (he) {
          // The first 10, then every 100th: a peer retrying every heartbeat must not
          // flood the log.
          const int64_t n = ++self->srv.tls_failures;
          if (!self->closed && (n <= 10 || n % 100 == 0))
            std::fprintf(stderr, "blendserve %s: refused %s: TLS: %s (%lld refused so far)\n",
                         self->srv.opt.name.c_str(), self->peer.c_str(), he.message().c_str(),
                         static_cast<long long>(n));
          return self->close();
        }
        self->read_next();
      });
    });
  }

  void read_next() {
    if (closed) return;
    deadline(srv.opt.idle_timeout_s);
    read_exactly(stream, srv.tls, asio::buffer(hdr), [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      const uint32_t n = decode_length(self->hdr);
      if (n > self->srv.opt.max_request_bytes) {
        ++self->srv.bad_frames;
        std::fprintf(stderr, "blendserve %s: %s: request of %u bytes over the limit: closed\n",
                     self->srv.opt.name.c_str(), self->peer.c_str(), n);
        return self->close();
      }
      self->deadline(self->srv.opt.io_timeout_s);
      self->in.resize(n);
      read_exactly(self->stream, self->srv.tls, asio::buffer(self->in), [self](const error_code& e2, size_t) {
        if (e2) return self->close();
        self->answer();
      });
    });
  }

  void answer() {
    std::string reply;
    try {
      reply = srv.handler(in);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "blendserve %s: %s: %s\n", srv.opt.name.c_str(), peer.c_str(), e.what());
      return close();
    }
    ++srv.requests;
    const auto h = encode_length(reply.size());
    out.assign(reinterpret_cast<const char*>(h.data()), h.size());
    out += reply;
    deadline(srv.opt.io_timeout_s);
    write_all(stream, srv.tls, asio::buffer(out), [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      self->read_next();
    });
  }
};

void FramedServer::Impl::accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {  // e.g. out of file descriptors: try again shortly instead of spinning
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](const error_code& e) {
        if (!e) accept();
      });
      return;
    }
    if (live >= opt.max_connections) {
      ++refused;
      error_code ignore;
      sock.close(ignore);
    } else {
      ++live;
      ++connections;
      auto s = std::make_shared<FramedSession>(*this, std::move(sock));
      std::erase_if(sessions, [](const std::weak_ptr<FramedSession>& w) { return w.expired(); });
      sessions.push_back(s);
      s->start();
    }
    accept();
  });
}

FramedServer::FramedServer(FramedServerOptions opt, Handler handler) : impl_(std::make_unique<Impl>()) {
  if (opt.port < 0 || opt.port > 65535 || opt.max_connections < 1 || opt.max_request_bytes < 1 ||
      opt.max_request_bytes > UINT32_MAX || !(opt.io_timeout_s > 0) || !(opt.idle_timeout_s > 0))
    throw std::invalid_argument("framed server: options out of range");
  Impl& s = *impl_;
  s.opt = std::move(opt);
  s.handler = std::move(handler);
  s.tls = s.opt.tls.enabled();
  s.ctx = s.tls ? tls::server_context(s.opt.tls, s.opt.tls_peers) : std::make_shared<ssl::context>(ssl::context::tls_server);
  error_code ec;
  tcp::resolver resolver(s.io);
  const auto eps = resolver.resolve(s.opt.host, std::to_string(s.opt.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  const std::string where = s.opt.host + ":" + std::to_string(s.opt.port);
  if (ec || eps.empty()) throw std::runtime_error(s.opt.name + ": cannot resolve " + where);
  const tcp::endpoint ep = *eps.begin();
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error(s.opt.name + ": cannot listen on " + where + ": " + ec.message());
  s.port = s.acceptor.local_endpoint(ec).port();
  s.accept();
  s.thread = std::thread([&s] {
    for (;;) {
      try {
        s.io.run();
        return;
      } catch (const std::exception& e) {  // a handler threw: its connection is gone, serving goes on
        std::fprintf(stderr, "blendserve %s: %s\n", s.opt.name.c_str(), e.what());
      }
    }
  });
}

FramedServer::~FramedServer() {
  Impl& s = *impl_;
  // On the io thread: close the acceptor and every session, then let the aborted
  // handlers run out (io.run returns when nothing is left).
  asio::post(s.io, [&s] {
    error_code ec;
    s.acceptor.close(ec);
    s.accept_retry.cancel();
    for (auto& w : s.sessions)
      if (auto p = w.lock()) p->close();
    s.sessions.clear();
  });
  s.thread.join();
}

int FramedServer::port() const { return impl_->port; }

FramedServer::Stats FramedServer::stats() const {
  const Impl& s = *impl_;
  return {s.connections.load(), s.refused.load(), s.tls_failures.load(), s.closed_before_handshake.load(),
          s.bad_frames.load(), s.requests.load()};
}

// ---- client ----

struct FramedClient::Impl {
  FramedClientOptions opt;
  std::shared_ptr<ssl::context> ctx;
  bool tls = false;
  asio::io_context io;
  std::unique_ptr<ssl::stream<tcp::socket>> stream;  // null: not connected
  std::array<uint8_t, kHeaderBytes> hdr{};
  std::string out, in;

  void drop() {
    if (!stream) return;
    error_code ec;
    stream->next_layer().shutdown(tcp::socket::shutdown_both, ec);
    stream->next_layer().close(ec);
  }
};

FramedClient::FramedClient(FramedClientOptions opt) : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  c.opt = std::move(opt);
  c.tls = c.opt.tls.enabled();
  c.ctx = c.tls ? tls::client_context(c.opt.tls) : std::make_shared<ssl::context>(ssl::context::tls_client);
}

FramedClient::~FramedClient() { impl_->drop(); }

bool FramedClient::connected() const { return impl_->stream != nullptr; }

std::optional<std::string> FramedClient::call(std::string_view request, double connect_timeout_s,
                                              double reply_timeout_s, std::string* error,
                                              const std::atomic<bool>* stop) {
  Impl& c = *impl_;
  c.io.restart();
  bool done = false;
  std::string why;  // set with done on failure
  auto deadline = clock_type::now() + span(connect_timeout_s);
  const char* stage = "connect";
  auto fail = [&](const std::string& w) {
    if (done) return;
    done = true;
    why = w;
  };
  const auto h = encode_length(request.size());
  c.out.assign(reinterpret_cast<const char*>(h.data()), h.size());
  c.out.append(request);
  auto exchange = [&] {
    stage = "reply";
    deadline = clock_type::now() + span(reply_timeout_s);
    write_all(*c.stream, c.tls, asio::buffer(c.out), [&](const error_code& ec, size_t) {
      if (ec) return fail("send: " + ec.message());
      read_exactly(*c.stream, c.tls, asio::buffer(c.hdr), [&](const error_code& e2, size_t) {
        if (e2) return fail(e2 == asio::error::eof ? std::string("closed by the peer") : "reply: " + e2.message());
        const uint32_t n = decode_length(c.hdr);
        if (n > c.opt.max_reply_bytes) return fail("reply of " + std::to_string(n) + " bytes over the limit");
        c.in.resize(n);
        read_exactly(*c.stream, c.tls, asio::buffer(c.in), [&](const error_code& e3, size_t) {
          if (e3) return fail("reply: " + e3.message());
          done = true;
        });
      });
    });
  };
  if (c.stream) {
    exchange();
  } else {
    c.stream = std::make_unique<ssl::stream<tcp::socket>>(c.io, *c.ctx);
    if (c.tls) tls::set_peer_name(*c.stream, c.opt.peer_name.empty() ? c.opt.host : c.opt.peer_name);
    error_code ec;
    tcp::resolver resolver(c.io);
    const auto eps = resolver.resolve(c.opt.host, std::to_string(c.opt.port), tcp::resolver::numeric_service, ec);
    if (ec || eps.empty()) {
      fail("cannot resolve " + c.opt.host);
    } else {
      asio::async_connect(c.stream->next_layer(), eps, [&](const error_code& e, const tcp::endpoint&) {
        if (e) return fail("cannot connect: " + e.message());
        error_code ignore;
        c.stream->next_layer().set_option(tcp::no_delay(true), ignore);
        if (!c.tls) return exchange();
        stage = "TLS handshake";
        c.stream->async_handshake(ssl::stream_base::client, [&](const error_code& he) {
          if (he) return fail("TLS: " + he.message());
          exchange();
        });
      });
    }
  }
  // Run until done, the deadline or a stop; a timed-out or stopped exchange closes
  // the socket, which ends its pending operations with an error.
  while (!done) {
    if (stop && stop->load()) {
      fail("stopped");
    } else if (clock_type::now() >= deadline) {
      fail(std::string("no ") + stage + " within " +
           seconds_text(stage == std::string("reply") ? reply_timeout_s : connect_timeout_s));
    } else {
      c.io.run_for(std::chrono::milliseconds(50));
      continue;
    }
    c.drop();
    c.io.run();  // the aborted handlers: they see `done` and leave the strings alone
  }
  if (!why.empty()) {
    c.drop();
    c.io.restart();
    c.io.poll();
    c.stream.reset();
    if (error) *error = why;
    return std::nullopt;
  }
  return std::move(c.in);
}

}  // namespace bs
