// The remote-disk tier on a worker: a KvStore whose entries live on a storage node
// (storage_server.h), read per layer over TCP (remote_protocol.h), so the loaders'
// open_layers() / read_layer() loop works across the network unchanged.
//
// Why this shape:
// - Never a wrong answer, never a hang, never a throw for network trouble: every
//   wait has a deadline (client I/O is Asio async operations on a per-connection
//   io_context driven with run_until; Asio's blocking calls have none). A connect
//   failure, timeout, refused authentication, malformed/oversized/truncated frame or
//   checksum mismatch makes that call a miss (open_layers/get: nullptr, read_layer:
//   false, contains/put/erase: false), discards the connection, is counted (misses;
//   `corrupt` for data that failed its checksum) and kept in last_error().
// - "Down" after a transport failure: for retry_after_s every call misses at once,
//   so a dead node costs one timeout, not one per request; then the next call tries
//   again by itself. Answers from a live node (NOT_FOUND, an ERROR reply, a bad
//   checksum) do not mark it down.
// - Pipelined layers: a reader sends READ for layers_in_flight layers at its first
//   read_layer and one more after each slice it receives, so the node and the
//   network keep working while the caller computes; slices go straight into the
//   caller's k and v buffers. Layers read in order (the loaders' pattern) are
//   pipelined; out-of-order reads are correct, slower (what was in flight is read
//   and dropped, then the pipeline restarts at the layer asked for).
// - Pooled connections: a reader holds one connection while it lives (its entry
//   handle lives on it); at most max_connections exist at once, and a call that
//   finds all busy waits up to connect_timeout_s for one, then misses. A reader
//   destroyed with reads in flight (the caller stopped early) discards its
//   connection instead of draining it. The store must outlive its readers.
// - Each slice's XXH3-64 is checked against the layer sum the ENTRY reply carried
//   (the one in the node's file), so bytes are verified end to end from disk.
// - TLS 1.3 with mutual authentication when `tls` is set (storage/tls.h): the node
//   must present a certificate of the cluster's CA naming `tls_peer_name`, and this
//   worker presents its own; the cluster secret's handshake then runs inside. A
//   byte changed on the wire fails the record's MAC: a transport failure, a miss.
//   Plaintext only when `tls` is empty (the config must say so).
// - A pooled connection idle longer than idle_timeout_s is closed rather than
//   reused (the node closes idle connections after its own, longer, timeout).
// Thread-safe: any number of threads may call it; each reader is for one thread at
// a time, as LayerReader is.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "storage/kv_store.h"
#include "storage/tls.h"

namespace boost::asio::ssl {
class context;
}  // namespace boost::asio::ssl

namespace bs {

struct RemoteStoreOptions {
  std::string host = "127.0.0.1";  // the storage node: an address or a host name
  int port = 0;
  std::string secret;               // the cluster secret (the node's)
  double connect_timeout_s = 2;     // connecting + authenticating
  double io_timeout_s = 5;          // any one reply (or sending one request)
  double retry_after_s = 1;         // after a connection failure the node counts as down for this long
  int layers_in_flight = 4;         // a reader's pipelined layer requests (>= 1)
  int max_connections = 16;         // pooled; a reader holds one while it lives
  int64_t max_frame_bytes = int64_t{256} << 20;  // the longest reply payload accepted
  double idle_timeout_s = 30;       // a pooled connection idle longer is closed, not reused
  tls::Files tls{};                 // this worker's TLS files; all empty: plaintext
  std::string tls_peer_name{};      // the name the node's certificate must carry; empty: `host`
};

namespace remote {
class Connection;         // remote_store.cpp
class RemoteLayerReader;  // remote_store.cpp
}  // namespace remote

class RemoteKvStore final : public KvStore {
 public:
  // Does not connect yet; loads the TLS files (std::runtime_error naming the file
  // and the cause). Throws std::invalid_argument for options out of range (an empty
  // secret, port outside 1..65535, non-positive timeouts or counts).
  explicit RemoteKvStore(RemoteStoreOptions opt);
  ~RemoteKvStore() override;

  // OPEN: the entry's shape and checksums now, its layers on demand (pipelined).
  std::unique_ptr<LayerReader> open_layers(const ChunkKey& key) override;
  // The whole entry, every layer verified; nullptr on a miss or any failure.
  std::shared_ptr<const ChunkKv> get(const ChunkKey& key) override;
  bool contains(const ChunkKey& key) const override;
  // Pushes the entry to the node (write-back); true once the node stored it.
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) override;
  bool erase(const ChunkKey& key) override;
  // This worker's hits, misses, puts, corrupt; bytes and entries are the node's
  // (one round trip; kept from the last answer while the node is unreachable).
  StoreStats stats() const override;
  // The node's byte budget, as its AUTH_OK said (connects once if it never has);
  // 0 while the node was never reached.
  int64_t budget() const override;
  std::string_view name() const override { return "remote"; }

  // One round trip (PING), or false at once while the node counts as down.
  bool reachable();
  // Whether the node counts as down now (a transport failure within retry_after_s):
  // every call misses at once.
  bool is_down() const { return down(); }
  std::string last_error() const;  // the newest failure, for logs and inspection ("" if none)
  const RemoteStoreOptions& options() const { return opt_; }

 private:
  friend class remote::RemoteLayerReader;
  using clock = std::chrono::steady_clock;
  // Failures: `transport` (connecting, authenticating, a timeout, a broken or
  // malformed stream) marks the node down; `reply` (an ERROR answer, the pool busy)
  // and `corrupt` (a slice that failed its checksum, counted) do not.
  enum class Failure { transport, reply, corrupt };
  void fail(Failure kind, const std::string& what) const;
  void count_hit() const { hits_.fetch_add(1, std::memory_order_relaxed); }
  void count_miss() const { misses_.fetch_add(1, std::memory_order_relaxed); }
  bool down() const;
  // A connection to the node (an idle pooled one if there is one), or nullptr (down,
  // the pool exhausted past connect_timeout_s, or connecting failed: recorded).
  std::unique_ptr<remote::Connection> acquire() const;
  // Back to the pool if still in step with the node, else closed.
  void release(std::unique_ptr<remote::Connection> c) const;
  // One request and its reply frame (type, payload) on a pooled connection;
  // nullopt after a failure (recorded). An ERROR reply comes back as such.
  struct Reply {
    uint8_t type = 0;  // remote::MsgType
    std::vector<uint8_t> payload;
  };
  std::optional<Reply> call(const std::vector<uint8_t>& request) const;

  RemoteStoreOptions opt_;
  std::shared_ptr<boost::asio::ssl::context> tls_;  // null: plaintext
  mutable std::mutex pool_mu_;
  mutable std::condition_variable pool_cv_;
  mutable std::vector<std::unique_ptr<remote::Connection>> idle_;
  mutable int open_ = 0;  // connections in existence (idle + held + being opened)
  mutable std::atomic<int64_t> down_until_ns_{0};  // steady clock; 0: up
  mutable std::atomic<int64_t> hits_{0}, misses_{0}, puts_{0}, corrupt_{0};
  mutable std::atomic<int64_t> budget_{-1};  // -1: never heard
  mutable std::atomic<int64_t> node_bytes_{0}, node_entries_{0};
  mutable std::mutex err_mu_;
  mutable std::string last_error_;
};

}  // namespace bs
