// The runtime's C++ entry point: a request in (messages, documents, sampling),
// text streamed out, a result with per-request stats at the end. Behind it, the
// actors of actors/runtime/interfaces.h on CAF; this header keeps CAF out of its users
// (`blendserve generate`, the HTTP server, benchmarks, tests).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/request.h"
#include "actors/config/runtime_config.h"

namespace bs {

struct RuntimeContext;
class LlamaModel;
namespace kernels {
class Backend;
enum class Precision;
}  // namespace kernels

// The model file a runtime of `config` loads: model.path, else $BLENDSERVE_MODEL,
// else the embedded default.
std::string resolve_model_path(const RuntimeConfig& config);

class Runtime {
 public:
  // Loads the model, opens the tiers (the SSD index is rebuilt from its files),
  // starts the compute thread and spawns the actors. Throws on a bad model path,
  // an unusable SSD directory or an unsupported precision.
  explicit Runtime(const RuntimeConfig& config);
  ~Runtime();  // shutdown()
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Queues a request; returns its id. Callbacks run on the runtime's delivery
  // threads (actors/runtime/stream_delivery.h), one stream at a time per thread, in order,
  // on_done exactly once and last: a slow or stuck callback holds only its own
  // stream (and is left behind by shutdown after 10 s). Up to limits.max_requests run at once; up to
  // limits.max_queue more wait (in arrival order) for a slot. Throws RequestError
  // (invalid, too_long, overloaded: running and queue full, shutting_down,
  // unavailable: failure() says why) when refused; then no callback runs. A request
  // still running limits.max_request_seconds after submit ends with an error
  // (RequestResult::deadline_exceeded).
  uint64_t submit(RuntimeRequest request, RequestCallbacks callbacks);
  // submit() and wait for the result.
  RequestResult run(RuntimeRequest request, std::function<bool(std::string_view)> on_text = {});
  // Cancels a request in flight (its KV is freed at its next step) or waiting in
  // the queue (it ends as soon as the intake reads the cancel); it finishes
  // "cancelled". False if unknown.
  bool cancel(uint64_t id);
  // Empty while the runtime serves; else why it no longer does: a role of its actors
  // died more often than limits.max_restarts allows within limits.restart_window.
  // Every request is then refused (RequestErrc::unavailable) with this sentence.
  std::string failure() const;
  int in_flight() const;  // running (prefilling or decoding)
  int64_t actor_restarts() const;  // actors the supervisor started again after they died
  int queued() const;     // waiting for a slot

  // What the runtime serves, read-only (actors/runtime/runtime_view.cpp): for the HTTP layer
  // and tools, which see the runtime through these and not through its context.
  const LlamaModel& model() const;            // its tokenizer, chat template, configuration
  const kernels::Backend& backend() const;    // the backend its compute runs on (name, kernel id, device)
  kernels::Precision precision() const;       // of its GEMMs
  // The model's name as users see it: model.name, else model_display_name(path)
  // (a checkpoint's directory, a GGUF file's name without its quantization suffix).
  std::string model_id() const;
  std::vector<std::string> tier_names() const;  // the KV tiers in lookup order ("ram", "ssd", "remote")
  bool has_storage_node() const;                // tiers.remote is on
  // The storage node's last error when it cannot be reached now; nullopt when it can
  // or there is none.
  std::optional<std::string> storage_node_unreachable() const;

  // Continuous batching so far: decode steps run, tokens they produced (tokens /
  // steps = the mean batch), and the steps run between the layers of a long
  // prefill or write-back compute.
  struct DecodeStats {
    int64_t steps = 0, tokens = 0, interleaved_steps = 0;
  };
  DecodeStats decode_stats() const;

  // Tensor parallelism (device.tp): the ranks, the jobs that failed on a rank (each
  // failed its requests), and the times the communicators were rebuilt after one.
  struct TensorParallelStats {
    int ranks = 1;
    int64_t failures = 0, rebuilds = 0;
  };
  TensorParallelStats tensor_parallel_stats() const;

  // KV reuse beyond what a request loads (actors/runtime/chunk_flights.h): chunks computed alone
  // in the background, computes a request joined instead of queueing its own (single
  // flight), provisional entries stored from a request's cache, computes now claimed,
  // and computes the full background queue refused.
  struct ReuseStats {
    int64_t chunks_computed = 0, computes_joined = 0, provisional_entries = 0, computes_in_flight = 0,
            write_backs_refused = 0;
  };
  ReuseStats reuse_stats() const;

  // The paged KV cache (device.kv_cache_bytes): pages in all, in use by caches,
  // promised to admitted requests (admission counts these), and their size.
  struct KvPages {
    int64_t total = 0, used = 0, reserved = 0, page_positions = 0, page_bytes = 0;
  };
  KvPages kv_pages() const;

  // Stores the KV of a document (as a chunk, as it would appear in a RAG request)
  // in this node's tiers unless they hold it: loaded whole from the storage node
  // when the remote tier has it (a cluster's other workers warm up without
  // computing), else computed by the layer worker on the compute thread (decoding
  // streams step between its layers, as during a prefill). With a remote tier that
  // writes back, the document is also pushed to the storage node, synchronously,
  // unless it is there: a document the user stores is meant for every worker of the
  // cluster, and the answer says whether the node has it. Throws
  // RequestError: invalid (empty), too_long, shutting_down, internal (also when no
  // tier of this node could store it: every put refused, e.g. a full disk with RAM off).
  struct StoredDocument {
    std::string id;               // the chunk key (hex): DELETE /v1/documents/{id}
    int64_t tokens = 0;
    bool already_stored = false;  // this node's RAM/SSD held it before the call
    std::string source;           // "local" (already_stored), "remote" (loaded from the node), "computed"
    bool on_storage_node = false; // the storage node holds it after the call (false: no remote tier,
                                  // no write-back, or the node refused or was unreachable: it stays here)
    // This node's tiers that hold it after the call, in lookup order ("ram", "ssd"):
    // "ssd" means it is on the disk, fsynced, and survives a crash of the process.
    std::vector<std::string> tiers;
  };
  StoredDocument store_document(const std::string& text);
  // Removes a stored document from every tier, the storage node's included; false
  // when the id is malformed or no tier held it.
  bool erase_document(const std::string& key_hex);

  // Inspection, as JSON: the last n requests' traces, the actor table (every actor
  // and compute thread: kind, node, rank, state, counters, busy share of the last
  // interval, last error), the controller's profiles, the tiers' counters (with
  // what their loaders moved).
  std::string traces_json(int n = 1);
  std::string actors_json();
  std::string profile_json();
  std::string stores_json() const;
  // The requests submitted and not finished: id, phase (queued, planning,
  // prefill, decode, cancelling), age, tiers of their chunks, ratio and why, TTFT,
  // the prefill's layer, tokens so far.
  std::string requests_json() const;
  // One request's trace: live (its events so far) while in flight, else from the
  // inspector's history; empty when neither knows it.
  std::string request_trace_json(uint64_t id);
  // What a console shows, in one answer: {"time_s", "nodes": [this node: its
  // actors, requests in flight, the last finished ones, tiers, queue, KV pages,
  // decode counters]}. A list of nodes so a cluster's frontend can merge its
  // members' snapshots into one.
  std::string snapshot_json();
  // An extra actor in this runtime's actor system that reports to the inspector as
  // the runtime's own do (a known load for tests of the inspection views and for
  // tools): each call of the returned function queues one message, which runs
  // `work` on the actor's own thread (an exception it throws becomes the actor's
  // last error; the actor goes on). It stops at shutdown. Throws on a name in use.
  std::function<void()> spawn_reporting_actor(const std::string& name, std::function<void()> work);

  // Refuses new requests, cancels those in flight and queued and waits for them
  // (each gets on_done, "cancelled" unless it finished first), lets queued SSD
  // writes finish, stops the actors and the compute thread. Idempotent.
  // finish_write_back: first compute and store the chunks queued for write-back
  // (a one-shot command's next run then hits); otherwise they are dropped (they
  // are a cache) — what is being written finishes either way.
  void shutdown(bool finish_write_back = false);

  const RuntimeContext& context() const { return *ctx_; }
  RuntimeContext& context() { return *ctx_; }

 private:
  struct Actors;
  std::unique_ptr<RuntimeContext> ctx_;
  std::unique_ptr<Actors> actors_;
};

}  // namespace bs
