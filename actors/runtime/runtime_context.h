// The parts of one runtime: the config, the model and its compute,
// the store tiers, the compute thread, the tensor-parallel ranks, two append-only
// books found by request id (traces, the front end's records), and the locked index
// of stored chunks that plain requests' pasted passages are looked up in.
// Per-request execution state is not here: a prefill's load target and compute state
// are the layer worker's (a follower rank's, its rank worker's), slots and page
// reservations the intake's (in_flight / queued are its published gauges). What else
// is mutable here is statistics and the writers' queue gauges (atomics that actors
// add to), the supervisor's admission pause and failure, and the test hooks (set
// before the first request).
// Owned by Runtime, which alone sees it whole: each actor is given only the parts it
// uses (actor_env.h), references and pointers into this that outlive the actors (the
// actor system is shut down before the context dies).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "actors/runtime/chunk_flights.h"
#include "actors/runtime/compute_thread.h"
#include "actors/runtime/load_target.h"
#include "actors/runtime/plan.h"
#include "actors/runtime/request_record.h"
#include "actors/runtime/stored_tier.h"
#include "actors/runtime/trace.h"
#include "actors/config/runtime_config.h"
#include "actors/runtime/tp_ranks.h"
#include "blend/blend_engine.h"
#include "blend/pasted_chunks.h"
#include "storage/disk_store.h"
#include "storage/memory_store.h"
#include "storage/remote_store.h"
#include "storage/replicated_store.h"
#include "storage/tiered_store.h"

namespace bs {

// Why the runtime no longer serves (a role failed for good); set once, never cleared.
class RuntimeFailure {
 public:
  void set(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (why_.empty()) why_ = why;
    failed_ = true;
  }
  bool failed() const { return failed_.load(); }
  std::string why() const {  // empty while the runtime serves
    std::lock_guard<std::mutex> lock(mu_);
    return why_;
  }

 private:
  mutable std::mutex mu_;
  std::string why_;
  std::atomic<bool> failed_{false};
};

struct RuntimeContext {
  RuntimeConfig config;
  // Shared ownership: the weights are read-only once loaded, so several runtimes in
  // one process may use one copy (the protocol tests load the model once per binary).
  std::shared_ptr<kernels::Backend> backend;
  kernels::Precision precision = kernels::Precision::F32;
  std::shared_ptr<const LlamaModel> model;  // built on `backend`, which outlives it here
  // device.communicator: nccl at tp 1: the group of one the model's all-reduces go
  // through (declared before `tf`, which uses it); null otherwise.
  std::unique_ptr<kernels::Communicator> solo_comm;
  std::unique_ptr<Transformer> tf;
  // The paged KV cache of the running requests: the intake reserves a request's pages
  // when it admits it and gives them back on the release sent where the request
  // ends (the pool's reservations have that one writer); the layer worker allocates
  // its cache from them.
  std::shared_ptr<KvPagePool> kv_pool;
  std::unique_ptr<MemoryKvStore> ram;  // null when the tier is off
  std::unique_ptr<DiskKvStore> ssd;    // null when the tier is off
  // A storage node's SSD over the network (tiers.remote); null when the tier is off.
  // Not in `tiered`: its synchronous whole-entry users (write-back's "stored
  // already?", the intake's prefix-block count, a document's local check and put)
  // never wait on the network; a document's store and erase ask the node themselves
  // (store_document its reads, the write-back actor its writes).
  std::unique_ptr<ReplicatedKvStore> remote;
  std::vector<StoredTier> tiers;        // lookup order
  std::unique_ptr<TieredKvStore> tiered;
  std::unique_ptr<BlendEngine> engine;
  // The token sequences of chunks stored by this runtime (write-back, documents),
  // where plain requests look for pasted passages (blend.find_pasted); null when off.
  // A locked index, as the stores are: written by the write-back actor (documents
  // included), read by the intake.
  std::unique_ptr<PastedChunkIndex> pasted;
  std::unique_ptr<ComputeThread> compute;
  TraceBook traces;              // requests' timelines, closed by whoever finishes the request
  RequestBook requests;          // the front end's records of the requests not finished
  std::atomic<uint64_t> next_id{1};
  // Published by the intake, which owns the slots, the queue and the pool's page
  // reservations (its ledger); everyone else only reads these.
  std::atomic<int> in_flight{0};  // admitted: prefilling or decoding (<= max_requests)
  std::atomic<int> queued{0};     // prepared, waiting in the intake for a slot (<= max_queue)
  std::atomic<bool> shutting_down{false};
  // Decode batching (Runtime::decode_stats): steps run, tokens they produced, and
  // the steps run inside a prefill (between its layers) or a write-back compute.
  std::atomic<int64_t> decode_steps{0}, decode_tokens{0}, interleaved_steps{0};
  // Write-back computes not queued because the compute thread's background queue was
  // full (ComputeThread::kDefaultMaxBackground); those chunks are computed again at their next miss.
  std::atomic<int64_t> write_backs_refused{0};
  // The write-back's chunk computes in flight (one per chunk: single flight) and the
  // provisional entries that serve a chunk until it is computed alone (chunk_flights.h).
  ChunkFlights flights;
  WriteQueue ssd_write_queue;
  WriteQueue remote_write_queue;  // pushes to the storage node (tiers.remote.write_back)
  // Actors the supervisor started again after they died, since start.
  std::atomic<int64_t> restarts{0};
  // Supervision (actors/runtime/restart_intensity.h): after a role's second death within
  // limits.restart_window, requests are not admitted before this time (steady clock,
  // ns since its epoch); written by the supervisor's restart hook, read by the intake.
  std::atomic<int64_t> admit_after_ns{0};
  // A role the supervisor gave up on: every request is refused with this, /health answers 503.
  RuntimeFailure failure;
  // Test hooks (set before the first request, never while one runs): called by a
  // loader before it reads each layer, and by the SSD writer before each write; a
  // hook may throw (an actor that dies) or sleep (a slow device).
  std::function<void(const std::string& tier, int layer)> loader_fault;
  std::function<void()> writer_fault;
  // Tensor parallel (device.tp > 1): the other ranks and the communicators (rank 0 is
  // backend .. compute above, its Transformer joined to the group); null at tp 1.
  // Declared last, so destroyed first: the followers' compute threads stop before
  // the tables their jobs read (traces) go.
  std::unique_ptr<TpRanks> tp;
};

}  // namespace bs
