// A storage node: serves its SSD tier (a DiskKvStore: the same aligned, checksummed
// files) to workers over TCP, per layer, with Boost.Asio. Workers read it through
// RemoteKvStore (remote_store.h); the wire format is remote_protocol.h.
//
// Per connection: the TLS handshake (when the node has TLS files), HELLO, the
// worker's AUTH (the cluster secret, hmac_auth.h; a wrong proof gets an ERROR, a
// closed connection, one line on stderr and auth_failures counted), AUTH_OK, then
// requests. Why this shape:
// - One request at a time per connection: the node reads the next request frame
//   only after the previous reply is written, so a connection holds at most one
//   reply buffer (one layer slice) however many READs a worker pipelines; the
//   pipeline lives in the socket buffers.
// - The disk on its own threads: every store call that touches a file (OPEN's open
//   and header read, READ's slice and its checksum, PUT's write and fsync, ERASE)
//   runs on `disk_threads` threads and its answer goes back to the connection's
//   strand, so a slow or failing disk never holds the network threads (`threads`),
//   which keep serving handshakes, pings and the other connections.
// - Every frame has a deadline: a frame half-received or half-sent for longer than
//   io_timeout_s closes the connection (a stalled or vanished peer costs nothing
//   after that). An authenticated connection (a worker's pool) may idle between
//   requests for idle_timeout_s, then it is closed; the handshakes (TLS, then the
//   secret's) must finish within io_timeout_s.
// - TLS 1.3 with mutual authentication when `tls` is set (storage/tls.h): a peer
//   without a certificate of the cluster's CA (naming one of `tls_peers`, when
//   given) gets nothing, not even HELLO; refused handshakes are counted in
//   tls_failures. Plaintext only when `tls` is empty.
// - Bounded everywhere: frames (kPreAuthMaxPayload before authentication,
//   max_frame_bytes after), open entries per connection (kMaxHandles), connections
//   (max_connections in all and max_connections_per_peer from one IP address; more
//   are accepted and closed at once, counted), so one host that opens a thousand
//   idle connections holds at most its share and the members elsewhere are served.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "storage/chunk_kv.h"
#include "storage/disk_store.h"
#include "storage/tls.h"

namespace bs {

struct StorageServerOptions {
  std::string bind_host = "127.0.0.1";  // an address or a host name to listen on
  int port = 0;                         // 0: any free port; port() says which
  std::string secret;                   // the cluster secret; required (empty: std::invalid_argument)
  int threads = 2;                      // Asio (network) threads (>= 1)
  int disk_threads = 2;                 // threads for the disk's reads and writes (>= 1)
  int64_t max_frame_bytes = int64_t{256} << 20;  // the longest request or reply payload
  double io_timeout_s = 10;   // a frame half-received/half-sent longer than this: connection closed
  int max_connections = 64;   // beyond: accepted then closed at once
  int max_connections_per_peer = 32;  // from one IP address (two workers' pools of 16 on one host)
  bool accept_puts = true;    // write-back pushes from workers; false: PUT and ERASE get an ERROR
  double idle_timeout_s = 120;  // an authenticated connection silent between requests this long is closed
  tls::Files tls{};             // the node's TLS files; all empty: plaintext
  std::vector<std::string> tls_peers{};  // names a worker's certificate must carry (one of); empty: any the CA signed
};

class StorageServer {
 public:
  static constexpr int kMaxHandles = 64;  // open entries per connection

  // Binds and starts serving `store` (which must outlive the server). Throws
  // std::invalid_argument for bad options, std::runtime_error for TLS files that
  // do not load (naming the file), std::system_error if it cannot bind.
  StorageServer(DiskKvStore& store, StorageServerOptions opt);
  ~StorageServer();  // stop()
  StorageServer(const StorageServer&) = delete;
  StorageServer& operator=(const StorageServer&) = delete;

  int port() const;  // the port it listens on
  // Closes the listener and every connection and joins its threads (waiting for a
  // disk read in progress); idempotent.
  void stop();

  struct Stats {
    int64_t connections = 0;    // accepted (and not refused for max_connections)
    int64_t refused_connections = 0;  // closed at accept: max_connections or max_connections_per_peer
    int64_t auth_failures = 0;  // wrong proof or protocol version
    int64_t tls_failures = 0;   // TLS handshakes refused (no certificate, another CA's, not a member, not TLS)
    int64_t probes = 0;         // TLS connections closed without a byte within 0.5 s (readiness probes): not logged
    int64_t bad_frames = 0;     // malformed, oversized or unexpected frames (connection closed)
    int64_t layers_served = 0, bytes_served = 0;  // SLICE frames sent whole, their K+V bytes
    int64_t puts = 0;           // PUTs stored
  };
  Stats stats() const;

  // Test hooks (fault injection; set before use): called with (key, layer) before a
  // slice is sent. none: send it; corrupt: flip one byte of its K/V data; truncate:
  // send half the frame, then close; close: close without sending; stall: send
  // nothing (the connection is closed after io_timeout_s).
  enum class Fault { none, corrupt, truncate, close, stall };
  void set_fault_hook(std::function<Fault(const ChunkKey&, int layer)> hook);

  struct Impl;  // storage_server.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
