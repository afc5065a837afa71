// What the runtime does when one of its actors dies (the supervisor's hooks,
// actors/runtime/supervisor.cpp): fail what the dead actor held, start its successor with
// admission paused for the backoff, or give up and fail the runtime for good; and
// ending one request with an error wherever it stands.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime/runtime_actors.h"

namespace bs {
using namespace runtime_detail;

void Runtime::Actors::fail_request(RuntimeContext* ctx, const RecordPtr& r, const std::string& why) {
  // Finished here: the decoder drops it at its next message, and the worker, told to
  // end it below, stops what still runs for it at its next step.
  if (r->finished.exchange(true)) return;
  RequestResult res;
  res.id = r->id;
  res.finish_reason = "error";
  res.error = why;
  res.deadline_exceeded = r->expired.load();
  res.total_seconds = r->trace->now_s();
  r->trace->set("finish_reason", res.finish_reason);
  r->trace->set("error", why);
  ctx->traces.close(r->id);
  caf::anon_send(h->inspector(), trace_atom::value, r->trace->json());
  if (r->admitted.exchange(false)) {
    // The worker drops its load target and cache (a prefill stops at its next layer);
    // the intake gives back its slot and pages.
    caf::anon_send(h->worker(), end_atom::value, r->id);
    caf::anon_send(h->intake(), release_atom::value, r->id);
  }
  ctx->requests.erase(r->id);
  if (r->callbacks.on_done) r->callbacks.on_done(res);
}

caf::actor Runtime::Actors::restart(RuntimeContext* ctx, const std::string& name, uint64_t id,
                                    const caf::error& reason, double backoff_s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return {};
  }
  const std::string why = describe_exit(*system, reason);
  if (backoff_s > 0) {
    // Before the successor exists: a new intake reads the pause when it starts.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(backoff_s);
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
    int64_t prev = ctx->admit_after_ns.load();
    while (prev < ns && !ctx->admit_after_ns.compare_exchange_weak(prev, ns)) {
    }
    std::fprintf(stderr, "blendserve: %s; starting a new %s actor (died again within %g s: admission paused %g s)\n",
                 why.c_str(), name.c_str(), ctx->config.restart_window, backoff_s);
  } else {
    std::fprintf(stderr, "blendserve: %s; starting a new %s actor\n", why.c_str(), name.c_str());
  }
  ctx->restarts.fetch_add(1);
  counters[name]->restarts.fetch_add(1);
  counters[name]->set_error(why);
  const caf::actor next = spawn(ctx, name);
  fail_held(ctx, name, id, name + " stopped (" + why + ")");
  if (name == "intake") caf::anon_send(h->intake(), reconcile_atom::value);
  return next;
}

void Runtime::Actors::give_up(RuntimeContext* ctx, const std::string& name, uint64_t id, const caf::error& reason,
                              int deaths) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return;
  }
  const std::string why = describe_exit(*system, reason);
  const std::string failure = "the " + name + " actor died " + std::to_string(deaths) + " times within " +
                              fmt_seconds(ctx->config.restart_window) + " (limits.max_restarts " +
                              std::to_string(ctx->config.max_restarts) + "); the last time: " + why +
                              ". This server no longer serves requests; restart it";
  std::fprintf(stderr, "blendserve: %s\n", failure.c_str());
  // First the failure (submit refuses from now on), then what is in flight.
  ctx->failure.set(failure);
  counters[name]->set_error(why);
  fail_held(ctx, name, id, failure);
  // Queued and running requests of every kind end now: no successor will take them.
  for (const auto& r : ctx->requests.all()) fail_request(ctx, r, failure);
  if (name == "intake") {
    // Its gauges have no writer any more: nothing runs or waits.
    ctx->in_flight.store(0);
    ctx->queued.store(0);
  }
}

void Runtime::Actors::fail_held(RuntimeContext* ctx, const std::string& name, uint64_t id,
                                const std::string& failure) {
  if (name.rfind("loader-", 0) == 0) {
    // Its requests' layers will not come: the worker, which owns their load targets,
    // fails them (and counts the loader done with them).
    caf::anon_send(h->worker(), loader_down_atom::value, id, failure);
  } else if (name == "ssd-writer") {
    // The writes queued in its mailbox died with it (a cache: recomputed on a miss).
    ctx->ssd_write_queue.bytes.store(0);
  } else if (name == "remote-writer") {
    ctx->remote_write_queue.bytes.store(0);
  } else if (name == "write-back") {
    // Stores in its mailbox died with it (a cache: recomputed on a miss); no request waits for them.
  } else if (name == "intake") {
    // Its queue and its ledger of slots and pages died with it: every request it held,
    // queued or running, fails; then a new intake rebuilds the ledger from the records
    // still admitted (by it, meanwhile; restart sends it reconcile), now that the
    // releases it may have missed (sent to the dead one) can no longer matter.
    for (const auto& r : ctx->requests.all()) fail_request(ctx, r, failure);
  } else if (name != "inspector") {
    // Running requests pass through the controller, worker and decoder by message:
    // any of them may have been in the dead actor's mailbox.
    if (name.rfind("rank-worker-", 0) == 0) {
      // Jobs in its mailbox died with it: rank 0's job waiting on that rank stops now,
      // and the group is rebuilt before the next job. Its requests' caches are its
      // compute thread's, not the actor's: they live on and go at their End.
      const int rank = std::stoi(name.substr(std::string("rank-worker-").size()));
      ctx->tp->forget_jobs(rank);
      ctx->tp->comm(rank).abort(failure);
      // Its load targets died with it: the worker fails the prefills loading there.
      caf::anon_send(h->worker(), rank_down_atom::value, static_cast<int32_t>(rank), failure);
    }
    // A layer worker that died failed its own prefills' gates as it went (the loaders
    // stop at their next layer); its caches and decode batcher went with it.
    for (const auto& r : ctx->requests.all())
      if (r->admitted.load()) fail_request(ctx, r, failure);
  }
}

}  // namespace bs
