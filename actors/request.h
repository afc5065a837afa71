// One request's life in the runtime, shared by the actors that work on it: what
// the caller asked, the assembled prompt, the controller's plan, the cache the
// loaders fill and the worker computes over, the decoding state and the trace.
// Plain C++ (no CAF): the compute thread and the loaders touch it directly; the
// actors pass it around by shared pointer. Who writes what, and when, is stated
// per field — the message order makes those writes happen-before the reads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blend/blend_engine.h"
#include "model/generate.h"
#include "storage/disk_store.h"

namespace bs {

// What a caller submits.
struct RuntimeRequest {
  std::vector<ChatMessage> messages;   // the conversation; the last message is the user's question
  std::vector<std::string> documents;  // retrieved documents, one cached chunk each
  SamplingParams sampling;             // max_tokens, temperature, top_p, top_k, seed, stop
  std::optional<BlendMode> mode;       // default: the config's
  std::optional<float> ratio;          // default: the controller's choice (>= the config's floor)
  // Completion without the chat template: `raw_prompt` is tokenized as is and
  // `messages`/`documents` must be empty.
  bool raw = false;
  std::string raw_prompt;
  // Pre-tokenized prompt (tools and benchmarks that need exact chunk sizes):
  // used as is; `messages`/`documents` must be empty. Template stop strings apply.
  std::optional<RagPrompt> prompt;
};

// What a caller gets back at the end.
struct RequestResult {
  uint64_t id = 0;
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish_reason;           // stop | length | cancelled | error
  std::string error;                   // set when finish_reason == "error"
  int64_t prompt_tokens = 0, cached_tokens = 0, recomputed_tokens = 0;
  int chunks = 0, chunks_ram = 0, chunks_ssd = 0, chunks_missed = 0;
  float ratio = 0;                     // the ratio the prefill ran at
  double ttft_seconds = 0;             // submit -> first token sampled
  double total_seconds = 0;
  double decode_seconds = 0;
};

// Errors a request can fail with before it runs (intake), with the HTTP-ish class.
enum class RequestErrc : uint8_t { invalid = 1, too_long = 2, overloaded = 3, shutting_down = 4, internal = 5 };
struct RequestError : std::runtime_error {
  RequestError(RequestErrc c, const std::string& m) : std::runtime_error(m), code(c) {}
  RequestErrc code;
};
const char* errc_name(RequestErrc c);

struct RequestCallbacks {
  std::function<bool(std::string_view)> on_text;     // newly final text; false cancels
  std::function<void(const RequestResult&)> on_done; // exactly once, at the end
};

// The loaders -> worker handshake for one request: layer l may be computed once
// every loader the request was sent to delivered it. A failure (a stored entry that
// failed its read, a loader that died, a cancel, a timeout) fails the gate, and the
// loaders stop at their next layer. The layer worker looks without waiting
// (delivered, failure, loaders_done) and parks a prefill whose layer is not there;
// the waits, each bounded, are for a caller that owns its thread.
class LayerGate {
 public:
  struct LoadFailed : std::runtime_error {
    LoadFailed(const std::string& why, bool recoverable) : std::runtime_error(why), recoverable(recoverable) {}
    // True when only a stored entry failed (its tier dropped it): a prefill from the
    // whole entries still answers correctly, with that chunk as a miss. False when
    // the load itself broke (a loader died, a timeout): the request fails.
    bool recoverable;
  };
  // n_layers to deliver, by each of `loaders` (their actor ids).
  void reset(int n_layers, std::vector<uint64_t> loaders);
  void arrive(int layer);              // one loader delivered `layer`
  void loader_done(uint64_t loader);   // that loader ended its work on this request (idempotent)
  void fail(const std::string& why, bool recoverable = false);  // the first failure wins
  bool failed() const;                 // loaders look before each layer and stop
  // Without waiting: the failure (why, and whether it is recoverable), if any.
  bool failure(std::string& why, bool& recoverable) const;
  // Without waiting: every loader delivered `layer`.
  bool delivered(int layer) const;
  // Without waiting: no loader writes the cache any more.
  bool loaders_done() const;
  // Waits at most `timeout` for `layer`: true when it is there; throws LoadFailed.
  bool wait_for(int layer, std::chrono::steady_clock::duration timeout);
  // Waits at most `timeout` until every loader is done (no loader writes the cache
  // any more): true when they are.
  bool wait_loaders_done_for(std::chrono::steady_clock::duration timeout);
  // The loader was sent this request and has not ended its work on it.
  bool holds(uint64_t loader) const;
  int loaders() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> arrived_;
  std::vector<uint64_t> loaders_;  // not done yet
  int expected_ = 0;
  std::string failure_;
  bool recoverable_ = false;
};

// Where a chunk's KV comes from, decided by the controller. The stored tiers come
// first, in lookup order; they index the runtime's loaders.
enum class Tier : uint8_t { Ram = 0, Ssd = 1, Miss = 2 };
constexpr size_t kStoredTiers = 2;
const char* tier_name(Tier t);

// A request's timeline: every actor appends events; seconds since submit.
struct TraceEvent {
  std::string actor, what;
  int layer = -1;
  double begin = 0, end = 0;
  int64_t bytes = 0;
};

struct RequestState {
  using clock = std::chrono::steady_clock;
  // intake
  uint64_t id = 0;
  clock::time_point submitted;
  RuntimeRequest request;
  RequestCallbacks callbacks;
  RagPrompt prompt;
  ChunkKey prefix_key;
  std::vector<ChunkKey> chunk_keys;
  bool admitted = false;  // holds one of the max_requests slots (in_flight); false while queued
  clock::time_point queued_at;
  // controller: the plan; cache allocated here, filled by loaders + worker
  BlendOptions options;
  PrefillPlan plan;
  std::vector<Tier> chunk_tier;
  Tier prefix_tier = Tier::Miss;
  // Per part (chunks, then the prefix at index chunks.size()): the entry opened in
  // its tier (pinned RAM entry, open SSD file), nullptr for a miss. The loader of
  // that tier reads it layer by layer and then releases it.
  std::vector<std::unique_ptr<LayerReader>> readers;
  KvCache cache;
  LayerGate gate;
  std::string controller_json;  // the decision and its inputs (trace)
  // worker
  BlendPrefill prefill;   // cache moved in here by the worker
  std::string prefill_error;
  bool fallback = false;  // a loader failed: the prefill was redone from whole entries
  // Decode steps of other requests run between this prefill's layers, and their time.
  int64_t prefill_pauses = 0;
  double prefill_pause_seconds = 0;
  // Decode batching, per step this request took part in: steps, the sum of their
  // batch sizes, and how many ran inside another request's prefill (trace).
  int64_t decode_steps = 0, decode_batch_sum = 0, decode_interleaved = 0;
  // decoder
  std::unique_ptr<DecodeSession> decode;
  clock::time_point first_token;
  bool has_first_token = false;
  RequestResult result;
  // any thread
  std::atomic<bool> cancelled{false};
  // Set by whoever finishes the request (the decoder, or the supervisor when an
  // actor that held it died): on_done runs exactly once.
  std::atomic<bool> finished{false};

  double seconds_since_submit(clock::time_point t) const {
    return std::chrono::duration<double>(t - submitted).count();
  }
  double now_s() const { return seconds_since_submit(clock::now()); }
  void add_event(TraceEvent e);
  std::vector<TraceEvent> events() const;
  // The timeline as JSON, with the fraction of load time hidden behind compute.
  std::string trace_json() const;

 private:
  mutable std::mutex trace_mu_;
  std::vector<TraceEvent> events_;
};
using RequestPtr = std::shared_ptr<RequestState>;

}  // namespace bs
