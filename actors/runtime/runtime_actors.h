// The Runtime's private half, shared by the files that implement it (actors/runtime/runtime.cpp:
// construction, the blocking API and shutdown; runtime_supervision.cpp: what happens
// when an actor dies; runtime_documents.cpp; runtime_inspection.cpp):
// Runtime::Actors (the actor system, the handles, the supervisor) and the helpers
// those files call. Included by them only: it brings CAF, which actors/runtime/runtime.h
// keeps out of the runtime's users.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"
#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "actors/runtime/stream_delivery.h"

namespace bs {
namespace runtime_detail {

// A scoped actor for a caller's thread (Runtime's blocking calls). CAF 0.17 pins
// the actor system's logger in a thread-local of every thread that makes a scoped
// actor, and ~actor_system waits until the logger is gone: a caller's threads that
// outlive the runtime (an HTTP server's pool) would hang its shutdown forever. The
// pin is dropped when the call is done.
class CallerActor {
 public:
  explicit CallerActor(caf::actor_system& sys) : self_(sys) {}
  caf::blocking_actor* operator->() const { return self_.operator->(); }

 private:
  struct Unpin {
    ~Unpin() { caf::logger::set_current_actor_system(nullptr); }
  } unpin_;  // destroyed after self_
  caf::scoped_actor self_;
};

// CAF's scheduler threads only pass messages: few of them, sleeping soon when
// idle, so they never compete with the compute thread for the cores. Every actor
// whose handlers may block runs detached, on a thread of its own: the intake
// (tokenizing), the controller (SSD lookups: open, header read), the loaders, the
// SSD writer and the remote writer (I/O), the decoder (sampling, the caller's
// callbacks), the inspector (the trace file), write-back (its RAM put page-locks the
// entry on a device backend: a driver call of milliseconds for a large chunk) and the
// rank workers (a copy to a rank's device may block). The layer worker and the
// supervisor only pass messages, on the scheduler's threads.
struct RuntimeSystemConfig : caf::actor_system_config {
  RuntimeSystemConfig() {
    set("scheduler.max-threads", size_t{2});
    set("work-stealing.aggressive-poll-attempts", size_t{10});
    set("work-stealing.moderate-poll-attempts", size_t{50});
    set("logger.verbosity", caf::atom("quiet"));
    add_runtime_message_types(*this);
    add_error_category(runtime_error_category(), [](uint8_t code, caf::atom_value, const caf::message& ctx) {
      std::string s = errc_name(static_cast<RequestErrc>(code));
      if (ctx.match_elements<std::string>()) s += ": " + ctx.get_as<std::string>(0);
      return s;
    });
  }
};

// A runtime error answered at the actor boundary, as the RequestError it stands for.
inline RequestError request_error_of(caf::actor_system& sys, const caf::error& failure) {
  std::string message = sys.render(failure);
  if (failure.category() == runtime_error_category() && failure.context().match_elements<std::string>())
    message = failure.context().get_as<std::string>(0);
  const auto code = failure.category() == runtime_error_category() ? static_cast<RequestErrc>(failure.code())
                                                                    : RequestErrc::internal;
  return RequestError(code, message);
}

// The name of loader i of tier t's pool.
inline std::string loader_name(const RuntimeContext& ctx, size_t tier, int i) {
  return "loader-" + ctx.tiers[tier].name + "-" + std::to_string(i);
}

// The text of an actor's exit reason: the message of a runtime error, else CAF's rendering.
inline std::string describe_exit(caf::actor_system& sys, const caf::error& reason) {
  if (reason.category() == runtime_error_category() && reason.context().match_elements<std::string>())
    return reason.context().get_as<std::string>(0);
  return sys.render(reason);
}

// Text a caller may fall behind its stream by before the request is cancelled (far
// above any answer: a context of 8k tokens is ~40 KB of text).
inline constexpr size_t kMaxPendingStreamBytes = size_t{4} << 20;
// How long shutdown waits for the callers' callbacks of ended requests to return.
inline constexpr std::chrono::seconds kCallbackDrain{10};

// "60 s", "0.5 s": a config duration in a sentence.
inline std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

}  // namespace runtime_detail

struct Runtime::Actors {
  // The callers' callbacks run here, a stream at a time per thread (stuck or slow ones
  // hold only their own stream); declared first, so it is destroyed last.
  std::unique_ptr<StreamDelivery> delivery;
  runtime_detail::RuntimeSystemConfig cfg;
  std::unique_ptr<caf::actor_system> system;
  std::shared_ptr<Handles> h = std::make_shared<Handles>();
  supervisor_actor supervisor;
  std::unordered_map<std::string, CountersPtr> counters;  // by actor name, kept across restarts
  std::mutex mu;
  int documents = 0;  // store_document and erase_document calls in flight (shutdown waits for them)
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::vector<caf::actor> reporting;  // spawn_reporting_actor's: stopped at shutdown with the others
  bool stopped = false;

  // Spawns the actor called `name` (a fresh one: at start and after it died), puts
  // it in the Handles and returns it.
  caf::actor spawn(RuntimeContext* ctx, const std::string& name);
  // The supervisor's hooks: fail what the dead actor held and start its successor
  // (admission paused for backoff_s), or fail the runtime for good (give_up).
  caf::actor restart(RuntimeContext* ctx, const std::string& name, uint64_t id, const caf::error& reason,
                     double backoff_s);
  void give_up(RuntimeContext* ctx, const std::string& name, uint64_t id, const caf::error& reason, int deaths);
  // What the dead actor `name` held, failed with `failure` (both hooks).
  void fail_held(RuntimeContext* ctx, const std::string& name, uint64_t id, const std::string& failure);
  // Ends a request with an error now (on_done once; its slot back; the worker
  // drops what it holds for it), however far it got.
  void fail_request(RuntimeContext* ctx, const RecordPtr& r, const std::string& why);
};

}  // namespace bs
