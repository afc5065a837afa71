// The remote tier over several storage nodes: each chunk lives on `replication` of
// them, so one node's loss costs no recompute. Each node is a RemoteKvStore
// (remote_store.h: its own pool, deadlines, TLS and "down" state).
//
// Why this shape:
// - Rendezvous (highest-random-weight) hashing picks a chunk's nodes: each node
//   scores XXH3(key, node name) and the `replication` highest hold it. Every worker
//   computes the same nodes without asking anyone, and a node that joins or leaves
//   moves only the chunks whose top nodes change.
// - Reads go to the first of the chunk's nodes that is not down and has it; a node
//   that is down is skipped at once (its RemoteKvStore says so for retry_after_s).
// - Writes go to every one of the chunk's nodes, in turn. A write is acknowledged
//   (put returns true) once at least one of them stored it — not only when all did:
//   with a node down the write-back and POST /v1/documents still succeed, the
//   chunk is readable, and the missing copy is counted (`under_replicated`) and
//   made later by read-through.
// - Repair by read-through: after a read served by one of a chunk's nodes, one
//   background thread makes sure its other nodes that are up hold it too (CONTAINS,
//   then a copy from the node that served it where one lacks it: restarted empty,
//   or down when the chunk was written). A chunk found whole on all its nodes is
//   not checked again (a bounded set of verified keys, forgotten whenever a node is
//   seen down, and every minute: a node that restarted unseen is caught then). The queue is bounded (256 waiting; beyond, dropped and counted; the
//   next read queues it again). So a node that comes back is filled with what is
//   read, in the order it is read, off the read path.
// Thread-safe, as RemoteKvStore.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "storage/kv_store.h"
#include "storage/remote_store.h"

namespace bs {

struct ReplicaNode {
  std::string name;            // the node's name (its hash input, and for messages)
  RemoteStoreOptions options;  // how to reach it
};

class ReplicatedKvStore final : public KvStore {
 public:
  // std::invalid_argument: no nodes, two with one name, replication outside
  // 1..nodes, or a node's options out of range (RemoteKvStore's checks);
  // std::runtime_error for TLS files that do not load.
  ReplicatedKvStore(std::vector<ReplicaNode> nodes, int replication);
  ~ReplicatedKvStore() override;  // stops the repair thread (a copy in progress finishes)

  std::unique_ptr<LayerReader> open_layers(const ChunkKey& key) override;
  std::shared_ptr<const ChunkKv> get(const ChunkKey& key) override;
  bool contains(const ChunkKey& key) const override;
  bool put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) override;
  bool erase(const ChunkKey& key) override;
  // hits, misses, puts: this store's; bytes, entries, evictions, corrupt: the nodes'
  // summed (a chunk counts once per copy).
  StoreStats stats() const override;
  // What the nodes can hold, divided by the replication (each chunk takes that many copies).
  int64_t budget() const override;
  std::string_view name() const override { return "remote"; }

  // Indexes into nodes() of `key`'s nodes, best first (`replication` of them).
  std::vector<size_t> replicas(const ChunkKey& key) const;
  size_t size() const { return nodes_.size(); }
  int replication() const { return replication_; }
  RemoteKvStore& node(size_t i) const { return *nodes_[i].store; }
  const std::string& node_name(size_t i) const { return nodes_[i].name; }
  // Any node answers a PING.
  bool reachable();
  // The newest failure of any node, "node: why" ("" if none).
  std::string last_error() const;

  struct ReplicationStats {
    int64_t under_replicated = 0;  // puts acknowledged with fewer copies than `replication`
    int64_t repairs = 0;           // copies made by read-through
    int64_t repairs_failed = 0;    // copies that could not be read or written
    int64_t repairs_dropped = 0;   // not queued: the queue was full
  };
  ReplicationStats replication_stats() const;
  // Waits (at most timeout_s) until no repair is queued or running; false on timeout.
  bool wait_repairs_idle(double timeout_s) const;

 private:
  struct Node {
    std::string name;
    std::unique_ptr<RemoteKvStore> store;
  };
  struct Repair {
    ChunkKey key;
    size_t from;             // the node that served it
    std::vector<size_t> to;  // its other nodes (up when the read ran): copied to where they lack it
  };
  // After a read of `key` served by node `from`: queues the check of its other nodes
  // (unless verified already). A node of it seen down forgets every verification.
  void after_read(const ChunkKey& key, size_t from);
  void repair_loop();

  std::vector<Node> nodes_;
  int replication_;
  mutable std::atomic<int64_t> hits_{0}, misses_{0}, puts_{0};
  std::atomic<int64_t> under_replicated_{0}, repairs_{0}, repairs_failed_{0}, repairs_dropped_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Repair> queue_;
  std::unordered_set<ChunkKey, ChunkKeyHash> verified_;  // on all their nodes when last checked
  std::chrono::steady_clock::time_point verified_since_ = std::chrono::steady_clock::now();  // forgotten each minute
  bool repairing_ = false;
  bool stop_ = false;
  std::thread repairer_;
};

}  // namespace bs
