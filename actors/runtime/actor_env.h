// What each actor is given: the parts of the runtime it uses and nothing else, so an
// actor's signature says what it reads and what it writes. The runtime owns every
// part (RuntimeContext, runtime_context.h, which no actor includes); Runtime builds an
// actor's environment from it when it spawns or restarts the actor (actor_env.cpp),
// and the protocol tests build them from a context of their own. The parts outlive
// the actors: the actor system is shut down before the context dies.
//
// Who writes what: a `const` part is read only; a part given by non-const reference
// or pointer is written by that actor alone, or is a thread-safe part (a locked
// store or index, a book, an atomic gauge) that says so where it is declared.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/config/runtime_config.h"
#include "actors/runtime/chunk_flights.h"
#include "actors/runtime/compute_thread.h"
#include "actors/runtime/request_record.h"
#include "actors/runtime/stored_tier.h"
#include "actors/runtime/tp_ranks.h"
#include "actors/runtime/trace.h"
#include "blend/blend_engine.h"
#include "blend/pasted_chunks.h"
#include "storage/disk_store.h"
#include "storage/memory_store.h"
#include "storage/replicated_store.h"
#include "storage/tiered_store.h"

namespace bs {

struct RuntimeContext;

// The intake: validates and plans requests; the KV page pool's reservations and the
// in_flight / queued gauges have it as their one writer.
struct IntakeEnv {
  const RuntimeConfig& config;
  const LlamaModel* model;
  const BlendEngine* engine;       // validation, chunk and prefix-block keys
  KvPagePool* kv_pool;             // reservations (this actor's alone)
  const TieredKvStore* tiered;     // how many prefix blocks are stored (never the remote tier)
  const PastedChunkIndex* pasted;  // where pasted passages are looked up; null when off
  RequestBook& requests;           // the front end's records (the intake marks a cancel)
  TraceBook& traces;
  std::atomic<int>& in_flight;     // published here
  std::atomic<int>& queued;        // published here
  const std::atomic<int64_t>& admit_after_ns;  // the supervisor's admission pause
  const std::atomic<bool>& shutting_down;
};

// The loading controller: looks parts up and plans the ratio.
struct ControllerEnv {
  const RuntimeConfig& config;
  const LlamaModel* model;
  const std::vector<StoredTier>& tiers;  // lookup order; a TierId indexes it
  TraceBook& traces;
};

// A tier's loader: reads stored KV into requests' caches.
struct LoaderEnv {
  kernels::Backend* backend;             // the copy stream and its events
  const LlamaModel* model;
  const std::vector<StoredTier>& tiers;
  MemoryKvStore* ram;                    // where an SSD or remote hit is promoted; null when off
  TraceBook& traces;
  // Test hook (RuntimeContext::loader_fault), read before each layer.
  const std::function<void(const std::string& tier, int layer)>* fault;
};

// A tier's writer (the SSD's, the storage node's) and the bounded queue in front of it.
struct WriterEnv {
  KvStore* store = nullptr;   // null: the tier is off (entries are dropped)
  WriteQueue* queue = nullptr;
  int64_t queue_limit = 0;    // bytes (tiers.ssd.write_queue)
  const std::function<void()>* fault = nullptr;  // test hook (RuntimeContext::writer_fault), before each write
};

// The layer worker and its compute jobs (prefill_step.h, decode_steps.h,
// prefill_write_back.h): the model's compute and what a prefill leaves behind.
struct WorkerEnv {
  const RuntimeConfig& config;
  kernels::Backend* backend;
  const LlamaModel* model;
  Transformer* tf;
  BlendEngine* engine;
  KvPagePool* kv_pool;                   // the worker allocates its caches from the intake's reservations
  ComputeThread* compute;
  TpRanks* tp;                           // the follower ranks; null at tp 1
  const std::vector<StoredTier>& tiers;
  MemoryKvStore* ram;                    // provisional entries; null when off
  const TieredKvStore* tiered;           // "stored already?" before a write-back compute
  PastedChunkIndex* pasted;              // learnt passages are indexed at once; null when off
  ChunkFlights& flights;                 // single flight of the write-back's chunk computes
  TraceBook& traces;
  // Statistics this actor's jobs add to (Runtime::decode_stats, /metrics).
  std::atomic<int64_t>& decode_steps;
  std::atomic<int64_t>& decode_tokens;
  std::atomic<int64_t>& interleaved_steps;
  std::atomic<int64_t>& write_backs_refused;
};

// The write-back actor: owns the writes to this node's tiers (and, with
// tiers.remote.write_back, the storage node's) and the pasted-passage index's.
struct WriteBackEnv {
  const RuntimeConfig& config;
  const std::vector<StoredTier>& tiers;
  MemoryKvStore* ram;           // null when off
  DiskKvStore* ssd;             // null when off
  ReplicatedKvStore* remote;    // null when off
  TieredKvStore* tiered;
  PastedChunkIndex* pasted;     // null when off
  WriterEnv ssd_writes;         // the SSD writer's queue
  WriterEnv remote_writes;      // the remote writer's queue
};

// The decoder: samples, streams, ends requests.
struct DecoderEnv {
  const LlamaModel* model;
  const std::vector<StoredTier>& tiers;  // the result's chunks by tier name
  RequestBook& requests;                  // the decoder removes a finished request's record
  TraceBook& traces;                      // and closes its trace
};

IntakeEnv intake_env(RuntimeContext& ctx);
ControllerEnv controller_env(RuntimeContext& ctx);
LoaderEnv loader_env(RuntimeContext& ctx);
WriterEnv ssd_writer_env(RuntimeContext& ctx);
WriterEnv remote_writer_env(RuntimeContext& ctx);
WorkerEnv worker_env(RuntimeContext& ctx);
WriteBackEnv write_back_env(RuntimeContext& ctx);
DecoderEnv decoder_env(RuntimeContext& ctx);

}  // namespace bs
