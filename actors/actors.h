// The actor behaviours, one per file (intake.cpp, controller.cpp, ...). Runtime
// spawns them; tests spawn them alone under CAF's test coordinator.
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/scheduled_actor.hpp>

#include "actors/interfaces.h"
#include "actors/runtime_context.h"

namespace bs {

using HandlesRef = std::shared_ptr<Handles>;  // filled after spawning; the supervisor replaces an actor that died

struct IntakeState {
  std::deque<RequestPtr> queue;  // prepared, waiting for a slot, in arrival order
  static constexpr const char* name = "intake";
};
// Validates, tokenizes and keys a request; answers its id or a runtime error.
// Starts it, queues it (limits.max_queue) or refuses it as overloaded. Spawned
// detached: tokenizing a long prompt takes milliseconds.
intake_actor::behavior_type intake(intake_actor::stateful_pointer<IntakeState> self, RuntimeContext* ctx,
                                   HandlesRef h, CountersPtr c);
// The loading controller's measured profiles.
struct ControllerState {
  // Start values until measured (a laptop SSD, RAM copies, a 2-core AVX2 prefill).
  double ram_bytes_per_s = 8e9;
  double ssd_bytes_per_s = 1.5e9;
  double compute_s_per_token_layer = 6e-5;
  // Prefill time outside the final pass (selection, embedding, logits), per prompt token.
  double overhead_s_per_prompt_token = 5e-5;
  int ram_samples = 0, ssd_samples = 0, compute_samples = 0, overhead_samples = 0;
  // Recompute is planned to end this much before the loads: running past them
  // delays the first token one for one, ending early only costs a little quality.
  static constexpr double load_margin = 0.85;
  static constexpr const char* name = "controller";
};

// Looks chunks up in the tiers, picks the ratio from measured profiles, starts
// the loaders and the worker. Spawned detached: an SSD lookup opens and reads a file.
controller_actor::behavior_type controller(controller_actor::stateful_pointer<ControllerState> self,
                                           RuntimeContext* ctx, HandlesRef h, CountersPtr c);
// Streams one tier's KV into requests' caches layer by layer; stops at a cancel or a
// failed gate. Spawn detached: its reads block.
loader_actor::behavior_type loader(loader_actor::pointer self, RuntimeContext* ctx, HandlesRef h, Tier tier,
                                   CountersPtr c);
// Writes entries to the SSD tier, in order. Spawn detached: its writes block.
writer_actor::behavior_type writer(writer_actor::pointer self, RuntimeContext* ctx, CountersPtr c);
// Hands `kk` to the SSD writer unless its queue (tiers.ssd.write_queue bytes) is
// full: then it is dropped and counted. True when queued.
bool enqueue_write(RuntimeContext& ctx, const writer_actor& writer, KeyedKv kk);
// Owns the prefills it runs and decides each step of the compute thread: prefill
// layers, decode steps, write-back and document computes.
worker_actor::behavior_type layer_worker(worker_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c);
// Hands the fused cache to decode; stores computed chunks back to the tiers.
fusor_actor::behavior_type fusor(fusor_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c);
// Sampling, stop conditions, streaming text out, one step per message. Spawned
// detached: sampling sorts the vocabulary and the caller's callbacks may block.
decoder_actor::behavior_type decoder(decoder_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c);
struct InspectorState {
  std::vector<CountersPtr> actors;
  std::deque<std::string> traces;
  static constexpr const char* name = "inspector";
};
// What the runtime does when a supervised actor died: `restart` gets its name,
// its id and why it died, fails what it held, and returns its successor
// (already in the Handles), or an invalid handle when it is not to be restarted
// (the runtime is shutting down).
struct SupervisorHooks {
  std::function<caf::actor(const std::string& name, uint64_t id, const caf::error& reason)> restart;
};
struct SupervisorState {
  std::unordered_map<caf::actor_addr, std::string> children;  // monitored: name
  static constexpr const char* name = "supervisor";
};
supervisor_actor::behavior_type supervisor(supervisor_actor::stateful_pointer<SupervisorState> self,
                                           SupervisorHooks hooks, CountersPtr c);
// An actor's exception handler: the actor exits with an internal runtime error
// that names it and says what was thrown (the supervisor logs and reports it).
std::function<caf::error(caf::scheduled_actor*, std::exception_ptr&)> exit_on_exception(std::string actor);

// Registered actors' counters and the last requests' traces. Spawned detached: it
// writes the last trace to a file.
inspector_actor::behavior_type inspector(inspector_actor::stateful_pointer<InspectorState> self, int history,
                                         std::string trace_dir, CountersPtr c);

}  // namespace bs
