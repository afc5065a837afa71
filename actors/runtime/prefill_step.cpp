#include "actors/runtime/prefill_step.h"

#include <algorithm>
#include <exception>
#include <string>

#include <caf/all.hpp>

namespace bs {
namespace {

// Between two layers of a prefill: a due decode step of the other requests, its
// time counted in the prefill's pauses (and in its wait for the next layer).
void pause_for_decode(const WorkerEnv& env, const HandlesRef& h, PrefillWork& t) {
  const double s = interleave_decode(env, h, *t.batcher);
  if (s > 0) {
    ++t.pauses;
    t.pause_seconds += s;
  }
}

}  // namespace

std::string cancelled_before(const PrefillWork& t) {
  return "cancelled before layer " + std::to_string(t.run.next_layer());
}

void step_prefill(const WorkerEnv& env, const HandlesRef& h, PrefillWorkPtr t) {
  auto& gate = t->target->gate;
  TpRanks* tp = env.tp;
  try {
    if (t->cancelled->load()) {
      // Before any rank is told: a request that ended is never begun again on a follower.
      t->error = cancelled_before(*t);
    } else {
      if (tp) {
        // Every rank runs this job; a follower begins with the plan it is sent.
        RankJob job{RankJob::Prefill, t->id, {}, t->restart, {}, {}, false};
        if (!t->begun || t->restart) job.plan = *t->plan;
        tp->dispatch(job);
        t->restart = false;
      }
      if (!t->begun) {
        t->run = env.engine->begin(t->plan->prompt, t->plan->loaded, t->target->cache, t->plan->options, 1,
                                    t->trace->submitted());
        t->begun = true;
      }
      // Each choice is announced before it is acted on (a no-op at tp 1).
      auto decide = [&](RankDecision::Kind k) {
        if (tp) tp->announce(RankDecision{k, {}, {}});
        return k;
      };
      RankDecision::Kind last = RankDecision::Stop;
      while (true) {
        if (t->run.done()) {
          last = decide(gate.failed() ? RankDecision::Stop : RankDecision::Finish);
          break;
        }
        if (t->cancelled->load()) {
          t->error = cancelled_before(*t);
          last = decide(RankDecision::Stop);
          break;
        }
        if (gate.failed() || (t->run.needs_delivery() && !gate.delivered(t->run.next_layer()))) {
          last = decide(RankDecision::Stop);
          break;
        }
        decide(RankDecision::Step);
        const int layer = t->run.next_layer();
        // The loaders' copies of this layer (each on its copy stream) come before its
        // compute: the device waits, this thread does not.
        for (const auto& copied : t->target->copied.take(layer)) env.backend->wait(*copied);
        const double waited = env.tf->collective_stats().seconds;
        env.engine->step(t->run, t->waiting_since);
        t->trace->set("prefill_layer", layer + 1);  // progress, for the live view of requests in flight
        if (tp) {
          const double wait = env.tf->collective_stats().seconds - waited, end = t->trace->now_s();
          t->collective_seconds += wait;
          t->trace->add_event({"rank-0", "collective wait", layer, end - wait, end, 0});
        }
        // The wait for the next layer starts now; a decode step run here counts in it.
        t->waiting_since = std::chrono::steady_clock::now();
        pause_for_decode(env, h, *t);
      }
      if (last == RankDecision::Finish) {
        t->result = env.engine->finish(std::move(t->run));
        t->finished = true;
        if (tp) t->trace->set("rank-0_collective_s", t->collective_seconds);
      }
    }
  } catch (const std::exception& e) {
    t->error = e.what();
    if (tp) tp->fail(t->error);  // the followers stop at once
  }
  // The loaders stop at their next layer.
  if (!t->error.empty()) gate.fail(t->error);
  const uint64_t id = t->id;
  caf::anon_send(h->worker(), stepped_atom::value, id, std::move(t));  // back to the worker: not touched here after
}

void trace_prefill(const PrefillWork& work, bool fell_back) {
  auto& trace = *work.trace;
  const auto& st = work.result.stats;
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const auto& lt = st.layers[l];
    if (lt.wait_begin >= 0)
      trace.add_event({"worker", "wait+repair", static_cast<int>(l), lt.wait_begin, lt.ready, 0});
    if (lt.compute_begin >= 0)
      trace.add_event({"worker", "compute", static_cast<int>(l), lt.compute_begin, lt.compute_end, 0});
  }
  double load_begin = -1, load_end = -1;
  int64_t load_bytes = 0;
  for (const auto& e : trace.events())
    if (e.what == "load") {
      load_begin = load_begin < 0 ? e.begin : std::min(load_begin, e.begin);
      load_end = std::max(load_end, e.end);
      load_bytes += e.bytes;
    }
  trace.set("fallback", fell_back);
  trace.set("wait_s", st.wait_seconds);
  trace.set("select_s", st.select_seconds);
  trace.set("recomputed_tokens", st.recomputed_tokens);
  // Which rule chose the recomputed tokens, and how many came from each chunk.
  trace.set("selection", st.selection);
  trace.set("recomputed_per_chunk", st.recomputed_per_chunk);
  trace.set("computed_tokens", st.computed_tokens);
  if (load_begin >= 0) {
    const double span = load_end - load_begin;
    trace.set("load_span_s", span);
    trace.set("load_bytes", load_bytes);
    // Load time the worker did not spend waiting was hidden behind compute.
    trace.set("load_hidden_fraction", span > 0 ? std::clamp(1.0 - st.wait_seconds / span, 0.0, 1.0) : 1.0);
  }
  if (work.pauses > 0) {
    // Decode steps of other requests ran between this prefill's layers (counted in wait_s).
    trace.set("prefill_pauses", work.pauses);
    trace.set("prefill_pause_s", work.pause_seconds);
  }
}

}  // namespace bs
