// A small request/reply link between cluster members: TCP, TLS 1.3 with mutual
// authentication under the cluster CA (storage/tls.h) unless the config asks for
// plaintext by name, and messages framed as a 4-byte little-endian length followed
// by that many bytes. The cluster's control plane runs on it (actors/cluster/control_endpoint.h,
// actors/cluster/cluster_monitor.h): CAF 0.17's own network layer (BASP) is neither encrypted
// nor authenticated, and its OpenSSL module speaks only TLS 1.2 (SSL_CTX_new with
// TLSv1_2_method in libcaf_openssl 0.17.6), so the control messages travel here, and
// CAF's middleman is not used.
//
// Why one request at a time per connection, a reply per request: the control plane
// asks each member once per heartbeat, so there is nothing to pipeline; the frame
// length is bounded before anything is allocated; every wait (handshake, a request's
// bytes, an idle connection, a reply) has a deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/tls.h"

namespace bs {

struct FramedServerOptions {
  std::string name = "link";  // for log lines: "blendserve <name>: ..."
  std::string host;           // address to bind to
  int port = 0;               // 0: any free one (FramedServer::port says which)
  tls::Files tls;             // all empty: plaintext
  std::vector<std::string> tls_peers;  // with TLS: the names a client's certificate must carry (empty: any the CA signed)
  int max_connections = 16;   // more are closed at once (and counted refused)
  int64_t max_request_bytes = int64_t{1} << 20;
  double io_timeout_s = 5;    // the TLS handshake, and the rest of a request once its first bytes came
  double idle_timeout_s = 30; // a connection with no request this long is closed
};

// Serves on one thread of its own. `handler` runs on that thread, once per request,
// and returns the reply; if it throws, the connection is closed (the client sees an
// error, never a partial reply). Throws std::runtime_error when the port cannot be
// bound or the TLS files cannot be loaded.
class FramedServer {
 public:
  using Handler = std::function<std::string(std::string_view request)>;
  FramedServer(FramedServerOptions opt, Handler handler);
  ~FramedServer();  // stops: closes every connection, joins the thread
  FramedServer(const FramedServer&) = delete;
  FramedServer& operator=(const FramedServer&) = delete;

  int port() const;

  struct Stats {
    int64_t connections = 0;  // accepted
    int64_t refused = 0;      // over max_connections
    int64_t tls_failures = 0; // handshakes that failed (wrong CA, wrong name, not TLS at all)
    int64_t closed_before_handshake = 0;  // closed without a byte within 0.5 s (a port probe): not logged
    int64_t bad_frames = 0;   // over max_request_bytes
    int64_t requests = 0;     // answered
  };
  Stats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct FramedClientOptions {
  std::string host;
  int port = 0;
  tls::Files tls;          // all empty: plaintext
  std::string peer_name;   // with TLS: the name the server's certificate must carry (default: host)
  int64_t max_reply_bytes = int64_t{64} << 20;
};

// One connection to a FramedServer, opened on first use and again after any error.
// Not thread-safe: one caller at a time (an actor that owns it).
class FramedClient {
 public:
  // Throws std::runtime_error when the TLS files cannot be loaded.
  explicit FramedClient(FramedClientOptions opt);
  ~FramedClient();
  FramedClient(const FramedClient&) = delete;
  FramedClient& operator=(const FramedClient&) = delete;

  // Sends `request` and returns the reply. Connecting (and the TLS handshake) may
  // take connect_timeout_s, the reply reply_timeout_s after the request is sent.
  // nullopt with *error set on any failure (refused, timed out, handshake failed,
  // closed, oversized reply); the connection is dropped then. Returns early, with
  // "stopped", once `stop` (if given) becomes true: checked every 50 ms.
  std::optional<std::string> call(std::string_view request, double connect_timeout_s, double reply_timeout_s,
                                  std::string* error, const std::atomic<bool>* stop = nullptr);
  bool connected() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
