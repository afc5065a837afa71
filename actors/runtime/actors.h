// The actor behaviours, one per file (intake.cpp, controller.cpp, ...). Runtime
// spawns them; tests spawn them alone under CAF's test coordinator. Each is given
// the parts of the runtime it uses (actor_env.h), its peers' handles and its counters.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <exception>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/scheduled_actor.hpp>

#include "actors/runtime/interfaces.h"
#include "actors/runtime/restart_intensity.h"
#include "actors/runtime/actor_env.h"

namespace bs {

using HandlesRef = std::shared_ptr<Handles>;  // filled after spawning; the supervisor replaces an actor that died

struct IntakeState {
  // The slots and pages (the ledger): each admitted request's KV pages, by id, until
  // its release. Its size is in_flight; the sum is what the pool has reserved.
  std::unordered_map<uint64_t, int64_t> admitted;
  std::deque<RequestPlan> queue;  // prepared, waiting for a slot, in arrival order
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> queued_at;  // by id (trace)
  // A resume message is on its way (admission paused after a restart), due then.
  std::optional<std::chrono::steady_clock::time_point> resume_due;
  static constexpr const char* name = "intake";
};
// Validates, tokenizes and keys a request (its record is in the RequestBook) into
// a RequestPlan; answers its id or a runtime error. Starts it (the plan to the
// controller), queues it (limits.max_queue) or refuses it as overloaded. Owns the
// slots and KV page reservations: only it takes them and gives them back (release,
// sent by whoever ends a request). Spawned detached: tokenizing a long prompt takes
// milliseconds, and its thread is the pool ledger's one writer.
intake_actor::behavior_type intake(intake_actor::stateful_pointer<IntakeState> self, IntakeEnv env, HandlesRef h,
                                   CountersPtr c);
// One measured cost: the decayed sums of its samples' units (bytes, row-layers, prompt
// tokens) and seconds, the history weighted 0.7 at each new sample. The estimate is
// their ratio, so a sample counts by its size. A small load's time is mostly fixed
// per-layer costs (a copy's setup, a remote round trip): averaged per sample, as the
// controller once did, its low bytes/s kept 70% of its weight after a large load.
// tools/cluster/controller_profiles.py (two CPU workers, loopback TLS, 3 runs): ~1 MB remote
// loads measure 69-125 MB/s, ~52 MB ones 163-215; after one of each the profile reads
// 161-212 MB/s, where the per-sample average read 107-148.
struct MeasuredCost {
  double units = 0, seconds = 0;
  int samples = 0;
  void add(double u, double s) {
    units = 0.7 * units + u;
    seconds = 0.7 * seconds + s;
    ++samples;
  }
};
// The loading controller's measured profiles: each value is its start value until
// measured, then its MeasuredCost's ratio.
struct ControllerState {
  // Per stored tier (TierId order): bytes/s, from the tier's start value until measured.
  std::vector<double> tier_bytes_per_s;
  std::vector<MeasuredCost> tier_measured;
  // Start values until measured (a 2-core AVX2 prefill).
  double compute_s_per_token_layer = 6e-5;
  // Prefill time outside the final pass (selection, embedding, logits), per prompt token.
  double overhead_s_per_prompt_token = 5e-5;
  MeasuredCost compute_measured, overhead_measured;
  // Recompute is planned to end this much before the loads: running past them
  // delays the first token one for one, ending early only costs a little quality.
  static constexpr double load_margin = 0.85;
  static constexpr const char* name = "controller";
};

// Looks each part up in the tiers, picks the ratio from measured profiles and
// hands the plan to the worker. Spawned detached: an SSD lookup opens and reads a file.
controller_actor::behavior_type controller(controller_actor::stateful_pointer<ControllerState> self,
                                           ControllerEnv env, HandlesRef h, CountersPtr c);
// One of tier `tier`'s loaders: streams the tier's parts of a plan into the
// request's load target layer by layer; stops at a failed gate (a cancel, another
// loader's failure, a timeout). Spawn detached: its reads block.
loader_actor::behavior_type loader(loader_actor::pointer self, LoaderEnv env, HandlesRef h, TierId tier,
                                   CountersPtr c);
// Writes entries to its tier (the SSD's, or the storage node's: env says which), in
// order. Spawn detached: its writes block.
writer_actor::behavior_type writer(writer_actor::pointer self, WriterEnv env, CountersPtr c);
// Hands `kk` to the writer unless its queue (env.queue_limit bytes) is full: then it
// is dropped and counted. True when queued.
bool enqueue_write(const WriterEnv& env, const writer_actor& writer, KeyedKv kk);
// Owns the execution state of the requests it runs (load targets, prefill runs,
// decode caches, by request id) and decides each step of the compute thread:
// prefill layers, decode steps, write-back and document computes.
worker_actor::behavior_type layer_worker(worker_actor::pointer self, WorkerEnv env, HandlesRef h, CountersPtr c);
// A tensor-parallel follower rank's load targets and the door to its compute thread.
rank_worker_actor::behavior_type rank_worker(rank_worker_actor::pointer self, TpRanks* tp, HandlesRef h,
                                             int rank, CountersPtr c);
// Stores what the worker sends for write-back (chunks, learnt passages, prefix
// blocks): RAM, the SSD writer, and the remote writer where tiers.remote.write_back says so.
write_back_actor::behavior_type write_back(write_back_actor::pointer self, WriteBackEnv env, HandlesRef h,
                                           CountersPtr c);
// The decoder's per-request state, by id: sampling, text, stop conditions, and
// what the result and trace report.
struct Decoding {
  PrefillOutcome prefill;  // the plan, and what the prefill did (its logits are consumed)
  std::unique_ptr<DecodeSession> session;
  kernels::SampleRow next;  // the draw sent with the step in flight (picks its token here or on the backend)
  bool has_first_token = false;
  std::chrono::steady_clock::time_point first_token;
  int64_t steps = 0, batch_sum = 0, interleaved = 0;  // decode batching (trace)
};
struct DecoderState {
  std::unordered_map<uint64_t, Decoding> requests;
  static constexpr const char* name = "decoder";
};
// Sampling, stop conditions, streaming text out (to the caller's callbacks through
// the runtime's per-stream delivery, which only queues: the caller's own code never
// runs here), one step per message; the result and the trace at the end. Spawned
// detached: sampling sorts the vocabulary.
decoder_actor::behavior_type decoder(decoder_actor::stateful_pointer<DecoderState> self, DecoderEnv env,
                                     HandlesRef h, CountersPtr c);
struct InspectorState {
  std::vector<CountersPtr> actors;
  // Busy-time samples per actor (steady ns, busy ns), taken when the table is asked
  // for (and at registration): a share needs an earlier sample, and nothing is
  // sampled while nobody asks.
  std::unordered_map<std::string, std::deque<std::pair<int64_t, int64_t>>> busy_samples;
  std::deque<std::string> traces;
  int64_t traces_dropped = 0;  // finished traces pushed out of the history
  std::deque<uint64_t> trace_files;  // ids of the <id>.json files written, oldest first
  static constexpr const char* name = "inspector";
};
// What the runtime does when a supervised actor died. `restart` gets its name, its
// id, why it died and the backoff its restart intensity asks for (seconds admission
// pauses; 0: none), fails what it held, and returns its successor (already in the
// Handles), or an invalid handle when it is not to be restarted (the runtime is
// shutting down). `give_up`: the role died more often than `limits` allow; it fails
// what it held and every request, and marks the runtime failed (no successor).
struct SupervisorHooks {
  std::function<caf::actor(const std::string& name, uint64_t id, const caf::error& reason, double backoff_s)> restart;
  std::function<void(const std::string& name, uint64_t id, const caf::error& reason, int deaths)> give_up;
  // fail_atom: request `id` (if it is still known) ends with the error `why` now.
  std::function<void(uint64_t id, const std::string& why)> fail;
  RestartLimits limits;
};
struct SupervisorState {
  std::unordered_map<caf::actor_addr, std::string> children;  // monitored: name
  std::unordered_map<std::string, RestartIntensity> intensity;  // by role name: its recent deaths
  static constexpr const char* name = "supervisor";
};
supervisor_actor::behavior_type supervisor(supervisor_actor::stateful_pointer<SupervisorState> self,
                                           SupervisorHooks hooks, CountersPtr c);
// An actor's exception handler: the actor exits with an internal runtime error
// that names it and says what was thrown (the supervisor logs and reports it).
std::function<caf::error(caf::scheduled_actor*, std::exception_ptr&)> exit_on_exception(std::string actor);

// Registered actors' counters and the last requests' traces. Spawned detached: it
// writes the last trace to a file. `node`: the name its actor table reports.
inspector_actor::behavior_type inspector(inspector_actor::stateful_pointer<InspectorState> self, int history,
                                         std::string trace_dir, std::string node, CountersPtr c);

}  // namespace bs
