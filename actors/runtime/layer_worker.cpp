// layer worker (rank 0's; tensor-parallel followers have rank workers, actors/
// tp_ranks.h, which run what this one decides): owns the execution state of
// the requests it runs, keyed by request id — each prefill's load target (the
// cache and the layer gate, handed to the loaders it picked in their load message)
// and engine run, each decoding request's cache — and decides, one step at a time,
// what the compute thread runs next. It takes a plan (RequestPlan), allocates the
// cache from the KV page pool (the intake reserved its pages at admission; while the
// caches of ended requests still hold them it waits, bounded by limits.load_timeout;
// tensor parallel, each follower's rank worker opens the request's cache on its rank
// first), sends each tier's parts to the least busy loader of that tier's pool and
// runs the prefill as the blend engine's steps (BlendEngine::begin / step /
// finish): a step job computes the layers whose stored KV the loaders have
// delivered, then hands the prefill back; one that waits for a slow tier is parked
// and the compute thread goes to work that is ready (another request's prefill,
// decode steps), so loading layer l+1 overlaps computing layer l and a RAM-only
// request is not held up behind a slow SSD load. Ready prefills go oldest first.
// Cancellation (cancel_atom), a failed load and limits.load_timeout take effect at
// a layer boundary; the cache is dropped only once the request's loaders stopped
// writing it. The outcome (PrefillOutcome: the plan, the first logits) goes to the
// decoder, which asks for each decode step by id. Decode steps are batched
// (continuous batching, actors/runtime/decode_batcher.h): a request's next step waits in
// the worker's own batcher and one job runs every waiting request in one
// Transformer::decode_step; between the layers of a prefill (and of a write-back
// compute, and of a document stored through Runtime::store_document) a due decode
// step runs inline, so streams slow down instead of freezing. Prefills go first: while
// one is ready or running, the streams' next step is held until it is due
// (limits.decode_interleave since a waiting stream's last step began), so requests
// that arrive together are prefilled back to back and decode together. The chunks a
// prefill had to compute are computed alone in the background and go to the
// write-back actor. The compute jobs themselves are beside it: prefill_step.h (a
// prefill's steps), decode_steps.h (decode batches, and the step between layers),
// prefill_write_back.h (what a prefill leaves in the stores). Every decision is made in this actor's handlers from what they
// were told by message; at tp > 1 each compute job is sent to the follower ranks as
// it starts and every choice inside it is broadcast first (TpRanks::dispatch /
// announce).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"
#include "actors/runtime/decode_batcher.h"
#include "actors/runtime/decode_steps.h"
#include "actors/runtime/prefill_step.h"
#include "actors/runtime/prefill_write_back.h"

namespace bs {
namespace {

using WorkPtr = PrefillWorkPtr;

// limits.load_timeout as a clock duration.
std::chrono::steady_clock::duration load_timeout(const WorkerEnv& env) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(env.config.load_timeout, 0.001, 86400.0)));
}

// How often the worker looks at parked prefills (a cancel, a failed load, a
// timeout, loaders that stopped): decode_interleave, within [1 ms, 50 ms].
std::chrono::steady_clock::duration poll_interval(const WorkerEnv& env) {
  return std::clamp<std::chrono::steady_clock::duration>(interleave_interval(env), std::chrono::milliseconds(1),
                                                         std::chrono::milliseconds(50));
}

// One prefill in the worker, touched only by the worker's handlers; its compute state
// (PrefillWork) goes to the compute thread and back by message.
struct PrefillTask {
  enum class Phase {
    Pages,      // waits for its KV pages: promised at admission, still held by the caches of ended requests
    Ready,      // may step: not begun, or its next layer is delivered
    Parked,     // waits for its next layer from the loaders
    Stopping,   // failed (a load, a cancel, a compute error): waits for its loaders to stop
    Done,       // prefilled, or failed: answered to the decoder
  };
  std::shared_ptr<const RequestPlan> plan;  // also the work's
  LoadTargetPtr target;  // rank 0's cache and the gate, shared with the loaders
  bool has_cache = false;  // target->cache came from the pool
  // Tensor parallel, per follower rank ([rank - 1]): its cache for this request asked
  // of its rank worker, and given (the loaders are sent once every rank has one).
  enum class RankOpen : char { No, Asked, Open };
  std::vector<RankOpen> rank_open;
  // A rank that had no pages free is asked again after this (the next look), not at once.
  std::chrono::steady_clock::time_point ask_ranks_after{};
  BatcherPtr batcher;    // the worker's: the decode steps due between this prefill's layers
  TracePtr trace;
  std::vector<uint64_t> loaders;  // the loaders it was sent to
  uint64_t order = 0;  // arrival: ready prefills step oldest first
  WorkPtr work;        // empty while a job has it (on_compute)
  bool on_compute = false;
  Phase phase = Phase::Ready;
  double begin_s = 0;  // seconds since submit when the worker took it
  // When the wait for the next layer times out (limits.load_timeout) — also the
  // bound on a stopping load.
  std::chrono::steady_clock::time_point deadline;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  // The failure was a stored entry that failed its read (recoverable): once the
  // loaders stopped, the prefill begins again with the parts in `failed_parts`
  // computed and the others loaded again by loaders.
  bool fall_back = false;
  bool fell_back = false;  // it was
  std::vector<int32_t> failed_parts;  // the plan's parts whose stored entries failed (load_fail_atom)
};
using TaskPtr = std::shared_ptr<PrefillTask>;

// The requests of one worker, owned by its handlers.
struct WorkerState {
  std::unordered_map<uint64_t, TaskPtr> prefills;
  std::unordered_map<uint64_t, DecodeSlotPtr> decodes;
  std::unordered_map<uint64_t, int> loads_out;  // per loader (actor id): requests it was sent and has not ended
  uint64_t arrivals = 0;
  // Requests waiting for their next decode step (continuous batching). The worker's
  // handlers add and forget; its compute jobs take (they hold their own reference).
  BatcherPtr batcher = std::make_shared<DecodeBatcher>();
  bool stepping = false;      // a prefill job is queued or running on the compute thread
  bool tick_pending = false;  // a tick is on its way (while a prefill is parked or stopping)
  // A drain job is owed (the batcher counts one as queued) but held back: prefills go
  // first while the streams' next step is not yet due (prefill_first). schedule()
  // submits it once nothing is ahead of it or the step is due.
  bool drain_held = false;
};
using WorkerStatePtr = std::shared_ptr<WorkerState>;

// Whether the decoding streams' next step waits behind prefill work: a prefill is on
// the compute thread or ready for it, and no waiting stream's last step began
// limits.decode_interleave ago (DecodeBatcher::due). Requests that arrive together are
// then prefilled back to back and decode in one batch from their first step (a step run
// between two prefills would send the first streams ahead, to finish alone in small
// batches later), and a waiting prompt's first token is not delayed by steps of others.
// The streams already decoding wait as they would inside one long prefill: a step at
// most every decode_interleave, inline between the layers of a prefill running then, or
// submitted ahead of the next prefill.
bool prefill_first(const WorkerEnv& env, const WorkerState& w) {
  if (w.batcher->due(interleave_interval(env))) return false;
  if (w.stepping) return true;
  for (const auto& [id, t] : w.prefills)
    if (!t->on_compute && t->phase == PrefillTask::Phase::Ready) return true;
  return false;
}

// The owed drain job goes to the compute thread. Shutting down: whatever waits goes
// back to the decoder uncomputed.
void submit_drain(worker_actor::pointer self, const WorkerEnv& env, const HandlesRef& h, WorkerState& w) {
  w.drain_held = false;
  const BatcherPtr batcher = w.batcher;
  if (!env.compute->submit([env, h, batcher] { drain_decode(env, h, batcher); }))
    for (auto& e : batcher->take_all()) self->send(h->decoder(), logits_atom::value, e.slot->id, DecodeStep{});
}

// Ends a prefill: its profile to the controller, the outcome to the decoder, a
// successful request's cache to its decode slot, the missed parts to write-back.
void conclude(const WorkerEnv& env, const HandlesRef& h, WorkerState& w, const TaskPtr& t) {
  t->phase = PrefillTask::Phase::Done;
  PrefillOutcome out;
  std::vector<int32_t> exact_prompt;  // automatic prefix caching: the prompt's exact tokens
  DecodeSlotPtr stored_slot;          // whose cache holds them
  out.fallback = t->fell_back;
  if (!t->work->finished) {
    out.error = t->work->error.empty() ? "the prefill failed" : t->work->error;
  } else {
    const auto& st = t->work->result.stats;
    if (!t->fell_back) {
      // Compute time only: the final pass's layers, without the waits for loads.
      double seconds = 0;
      for (const auto& lt : st.layers) seconds += lt.compute_end - lt.compute_begin;
      // Rows through the layers as computed (gradual filtering narrows them), the unit
      // the controller predicts with.
      caf::anon_send(h->controller(), profile_atom::value, std::string("compute"), st.row_layers, seconds);
      // The rest of the prefill's compute (selection, embedding, logits).
      const double overhead = st.compute_seconds - seconds;
      if (overhead > 0)
        caf::anon_send(h->controller(), profile_atom::value, std::string("overhead"), st.prompt_tokens, overhead);
    }
    out.cached_tokens = st.cached_tokens + st.prefix_cached_tokens;
    out.prefix_cached_tokens = st.prefix_cached_tokens;
    out.recomputed_tokens = st.recomputed_tokens;
    out.logits = std::move(t->work->result.logits);
    auto slot = std::make_shared<DecodeSlot>();
    slot->id = t->plan->id;
    slot->cache = std::move(t->work->result.cache);
    w.batcher->expect(slot->id);  // back with its first step, or ended (forget)
    // The prompt's exact KV: before the first chunk, or all of it where it has none
    // (every row computed, or loaded as exact blocks); with no chunks the tokens the
    // steps append are exact too, and their blocks are stored when the request ends.
    // Stored after the outcome is sent (below), so the first token does not wait.
    if (env.config.write_back && t->plan->prefix_block > 0 && !t->cancelled->load()) {
      exact_prompt = t->plan->prompt.concatenated();
      if (!t->plan->prompt.chunks.empty()) exact_prompt.resize(t->plan->prompt.prefix.size());
      else {
        slot->exact_tokens = exact_prompt;
        slot->prompt_tokens = static_cast<int64_t>(exact_prompt.size());
      }
      stored_slot = slot;
    }
    w.decodes[slot->id] = std::move(slot);
  }
  trace_prefill(*t->work, t->fell_back);
  t->trace->add_event({"worker", "prefill", -1, t->begin_s, t->trace->now_s(), 0});
  // A loader that has not stopped keeps its own reference to the target.
  const uint64_t id = t->plan->id;
  if (t->work->finished && env.config.write_back && !t->cancelled->load()) {
    store_provisional_chunks(env, *t->plan, w.decodes.at(id)->cache);
    queue_write_back(env, h, w.batcher, *t->plan);
  }
  out.plan = *t->plan;
  caf::anon_send(h->decoder(), start_atom::value, std::move(out));
  if (stored_slot)
    store_prefix_blocks(env, h, w.batcher, std::move(exact_prompt), t->plan->prefix_block,
                        std::min<int64_t>(static_cast<int64_t>(t->plan->prefix_block_tier.size()),
                                          t->plan->prefix_end / t->plan->prefix_block),
                        t->plan->prefix_end, stored_slot);
  w.prefills.erase(id);
}

// A failed prefill's error, from what stopped it.
void take_failure(PrefillTask& t) {
  std::string why;
  bool recoverable = false;
  if (t.cancelled->load()) {
    t.work->error = cancelled_before(*t.work);
  } else if (t.work->error.empty() && t.target->gate.failure(why, recoverable)) {
    t.work->error = recoverable ? why : "loading the stored KV failed: " + why;
    t.fall_back = recoverable;
  }
}

bool launch(worker_actor::pointer self, const WorkerEnv& env, const HandlesRef& h, const WorkerStatePtr& w,
            PrefillTask& t);

// A stored entry failed mid-load and the request's loaders stopped: the prefill
// begins again (on every rank) from a new plan where the failed parts are computed
// and the others are loaded again by loaders into the same cache — the stores are
// read by loaders only, never on the compute thread. A failure that names no part
// still loaded (it cannot come from a loader, but must not loop) computes every
// part. Each fallback computes at least one more part, so they end.
void fall_back(worker_actor::pointer self, const WorkerEnv& env, const HandlesRef& h, const WorkerStatePtr& w,
               PrefillTask& t) {
  auto plan = std::make_shared<RequestPlan>(*t.plan);
  auto compute = [&](size_t part) {
    if (plan->is_prefix_block(part)) {
      // The blocks from this one on are computed (a block is used only behind the ones
      // before it).
      plan->prefix_block_tier.resize(plan->block_of(part));
      plan->loaded.prefix_cached = plan->blocks_tokens(plan->prefix_block_tier.size());
    } else {
      plan->chunk_tier[part] = kMissTier;
      plan->loaded.chunk_loaded[part] = 0;
    }
  };
  bool named = false;
  for (int32_t p : t.failed_parts) {
    const size_t part = static_cast<size_t>(p);
    if (p < 0 || part >= plan->parts() || plan->part_tier(part) == kMissTier) continue;
    compute(part);
    named = true;
  }
  if (!named)
    for (size_t part = 0; part < plan->parts(); ++part) compute(part);
  // The trace says where each chunk came from in the end.
  auto tier_names = nlohmann::json::array();
  for (TierId x : plan->chunk_tier) tier_names.push_back(x == kMissTier ? "miss" : env.tiers[static_cast<size_t>(x)].name);
  t.trace->set("chunk_tiers", std::move(tier_names));
  t.failed_parts.clear();
  t.fall_back = false;
  t.fell_back = true;
  t.plan = t.work->plan = std::move(plan);
  t.loaders.clear();
  t.work->begun = false;
  t.work->restart = true;
  // Its cache (and every follower's) is kept: launch sends the loaders at once.
  t.phase = PrefillTask::Phase::Pages;
  launch(self, env, h, w, t);
}

// The worker's decision: prefills waiting for pages get them (oldest first), parked
// and stopping prefills move on (a delivered layer, a cancel, a failure, a timeout,
// loaders that stopped), then the oldest ready prefill gets the compute thread — one
// prefill job at a time, so every step is decided here with what is known then.
void schedule(worker_actor::pointer self, const WorkerEnv& env, const HandlesRef& h, const WorkerStatePtr& w) {
  using Phase = PrefillTask::Phase;
  const auto now = std::chrono::steady_clock::now();
  std::vector<TaskPtr> concluded;
  // Prefills waiting for pages get them oldest first.
  std::vector<TaskPtr> waiting_pages;
  for (auto& [id, t] : w->prefills)
    if (t->phase == Phase::Pages) waiting_pages.push_back(t);
  std::sort(waiting_pages.begin(), waiting_pages.end(),
            [](const TaskPtr& a, const TaskPtr& b) { return a->order < b->order; });
  for (auto& t : waiting_pages) {
    if (t->cancelled->load()) {
      t->work->error = "cancelled before its KV cache was allocated";
    } else if (now >= t->deadline) {
      t->work->error = "no KV cache pages came free within " + std::to_string(env.config.load_timeout) +
                 " s (limits.load_timeout)";
    } else if (!launch(self, env, h, w, *t)) {
      continue;
    }
    if (!t->work->error.empty()) concluded.push_back(t);
  }
  for (auto& [id, t] : w->prefills) {
    if (t->on_compute || t->phase == Phase::Pages || t->phase == Phase::Done) continue;
    auto& gate = t->target->gate;
    if (t->phase == Phase::Parked) {
      if (t->cancelled->load() || gate.failed()) {
        take_failure(*t);
      } else if (now >= t->deadline) {
        t->work->error = "loading the stored KV failed: layer " + std::to_string(t->work->run.next_layer()) +
                   " did not arrive within " + std::to_string(env.config.load_timeout) + " s (limits.load_timeout)";
        gate.fail(t->work->error);
      } else if (gate.delivered(t->work->run.next_layer())) {
        t->phase = Phase::Ready;
        continue;
      } else {
        continue;
      }
      t->phase = Phase::Stopping;
      t->deadline = now + load_timeout(env);
      t->trace->add_event({"worker", "prefill " + t->work->error, t->work->run.next_layer(), t->begin_s, t->trace->now_s(), 0});
    }
    if (t->phase == Phase::Stopping) {
      // The cache is the loaders' until they stopped (or did not within the bound:
      // then the request fails; they hold their own reference to it).
      const bool stopped = gate.loaders_done();
      if (!stopped && now < t->deadline) continue;
      if (stopped && t->fall_back && !t->cancelled->load()) {
        t->trace->add_event({"worker", "fallback: " + t->work->error, -1, t->begin_s, t->trace->now_s(), 0});
        t->work->error.clear();
        fall_back(self, env, h, w, *t);
        continue;
      }
      if (!stopped) t->work->error += " (the loaders did not stop within limits.load_timeout)";
      concluded.push_back(t);
    }
  }
  for (auto& t : concluded) conclude(env, h, *w, t);

  // A held decode step goes first when it is due or nothing is ahead of it.
  if (w->drain_held && !prefill_first(env, *w)) submit_drain(self, env, h, *w);
  if (!w->stepping) {
    TaskPtr next;
    for (auto& [id, t] : w->prefills)
      if (!t->on_compute && t->phase == Phase::Ready && (!next || t->order < next->order))
        next = t;
    if (next) {
      next->on_compute = true;
      w->stepping = true;
      // The work goes with the job (and comes back in its stepped_atom).
      WorkPtr work = std::move(next->work);
      const bool queued = env.compute->submit([env, h, work]() mutable { step_prefill(env, h, std::move(work)); });
      if (queued) {
        work.reset();
      } else {
        next->work = std::move(work);
        next->on_compute = false;
        w->stepping = false;
        next->work->error = "the runtime is shutting down";
        next->target->gate.fail(next->work->error);
        next->phase = Phase::Stopping;
        next->deadline = now + load_timeout(env);
      }
    }
  }
  // Parked and stopping prefills are looked at again shortly.
  bool waiting = w->drain_held;  // looked at again when it falls due
  for (auto& [id, t] : w->prefills)
    if (!t->on_compute && (t->phase == Phase::Parked || t->phase == Phase::Stopping || t->phase == Phase::Pages))
      waiting = true;
  if (waiting && !w->tick_pending) {
    w->tick_pending = true;
    self->delayed_send(self, poll_interval(env), tick_atom::value);
  }
}

// A step job ended: the prefill is done, failed, or waits for its next layer.
void on_stepped(worker_actor::pointer self, const WorkerEnv& env, const HandlesRef& h, const WorkerStatePtr& w,
                uint64_t id, WorkPtr work) {
  using Phase = PrefillTask::Phase;
  w->stepping = false;
  auto it = w->prefills.find(id);
  if (it != w->prefills.end() && work) {
    TaskPtr t = it->second;
    t->work = std::move(work);  // home again
    t->on_compute = false;
    const auto now = std::chrono::steady_clock::now();
    if (t->work->finished) {
      conclude(env, h, *w, t);
    } else if (!t->work->error.empty() || t->target->gate.failed() || t->cancelled->load()) {
      take_failure(*t);
      t->target->gate.fail(t->work->error);
      t->phase = Phase::Stopping;
      t->deadline = now + load_timeout(env);
      t->trace->add_event({"worker", "prefill " + t->work->error, t->work->run.next_layer(), t->begin_s, t->trace->now_s(), 0});
    } else {
      // Its next layer is not there yet: the compute thread goes to other work.
      t->phase = Phase::Parked;
      t->deadline = t->work->waiting_since + load_timeout(env);
    }
  }
  schedule(self, env, h, w);
}

// A prefill gets its cache from the KV page pool (tensor parallel: every follower's
// rank worker is asked for one from its rank's pool), then each tier's parts go to the
// least busy loader of the tier with the load target (the cache, the gate). False
// while a cache is missing (the task stays in Phase::Pages; asked again at the next
// look, or when a rank answered).
bool launch(worker_actor::pointer self, const WorkerEnv& env, const HandlesRef& h, const WorkerStatePtr& w,
            PrefillTask& t) {
  if (!t.has_cache) {
    auto cache = env.kv_pool->try_make_cache(t.plan->cache_capacity());
    if (!cache) return false;
    t.target->cache = std::move(*cache);
    t.has_cache = true;
  }
  using RankOpen = PrefillTask::RankOpen;
  const int ranks = env.tp ? env.tp->size() : 1;
  t.rank_open.resize(static_cast<size_t>(ranks - 1), RankOpen::No);
  bool all_open = true;
  const bool may_ask = std::chrono::steady_clock::now() >= t.ask_ranks_after;
  for (int r = 1; r < ranks; ++r) {
    auto& state = t.rank_open[static_cast<size_t>(r - 1)];
    if (state == RankOpen::No && may_ask) {
      self->send(h->rank_worker(r), rank_open_atom::value, t.plan->id, t.plan->cache_capacity());
      state = RankOpen::Asked;
    }
    all_open = all_open && state == RankOpen::Open;
  }
  if (!all_open) return false;
  t.target->ranks = ranks;
  t.phase = PrefillTask::Phase::Ready;
  t.work->waiting_since = std::chrono::steady_clock::now();
  t.deadline = t.work->waiting_since + load_timeout(env);
  std::vector<loader_actor> picked;
  for (size_t tier = 0; tier < env.tiers.size(); ++tier) {
    bool used = false;
    for (size_t i = 0; i < t.plan->parts() && !used; ++i) used = t.plan->part_tier(i) == static_cast<TierId>(tier);
    if (!used) continue;
    loader_actor best;
    for (const auto& l : h->loaders(static_cast<TierId>(tier)))
      if (l && (!best || w->loads_out[l.id()] < w->loads_out[best.id()])) best = l;
    if (!best) {
      // No loader for a tier the plan uses: its parts never arrive.
      t.work->error = "no loader for the " + env.tiers[tier].name + " tier";
      continue;
    }
    picked.push_back(best);
    t.loaders.push_back(best.id());
    ++w->loads_out[best.id()];
  }
  t.target->gate.reset(env.model->config().n_layers, t.loaders, ranks);
  if (!t.work->error.empty()) t.target->gate.fail(t.work->error);
  for (const auto& l : picked) self->send(l, load_atom::value, *t.plan, t.target);
  return true;
}

// Takes a plan: launched at once when the pool has its pages, else it waits for them
// (admission promised them: the caches of requests that ended are going).
void take_prefill(worker_actor::pointer self, const WorkerEnv& env, const HandlesRef& h, const WorkerStatePtr& w,
                  RequestPlan plan) {
  auto t = std::make_shared<PrefillTask>();
  t->order = ++w->arrivals;
  t->trace = env.traces.find(plan.id);
  t->begin_s = t->trace->now_s();
  t->target = std::make_shared<LoadTarget>();
  t->target->gate.reset(env.model->config().n_layers, {});
  t->batcher = w->batcher;
  t->plan = std::make_shared<const RequestPlan>(std::move(plan));
  t->work = std::make_shared<PrefillWork>();
  t->work->id = t->plan->id;
  t->work->plan = t->plan;
  t->work->target = t->target;
  t->work->batcher = t->batcher;
  t->work->trace = t->trace;
  t->work->cancelled = t->cancelled;
  t->work->waiting_since = std::chrono::steady_clock::now();
  t->deadline = t->work->waiting_since + load_timeout(env);
  t->phase = PrefillTask::Phase::Pages;
  w->prefills[t->plan->id] = t;
  if (!launch(self, env, h, w, *t))
    t->trace->add_event({"worker", "waiting for KV pages", -1, t->begin_s, t->trace->now_s(), 0});
  schedule(self, env, h, w);
}

}  // namespace

worker_actor::behavior_type layer_worker(worker_actor::pointer self, WorkerEnv env, HandlesRef h, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  auto w = std::make_shared<WorkerState>();
  // The worker's load targets die with it: their loaders stop at their next layer.
  self->attach_functor([w](const caf::error&) {
    for (auto& [id, t] : w->prefills) t->target->gate.fail("the layer worker stopped");
  });
  // The load target of a prefill in flight (null when it ended): where the loaders' messages land.
  auto target_of = [w](uint64_t id) -> LoadTarget* {
    auto it = w->prefills.find(id);
    return it == w->prefills.end() ? nullptr : it->second->target.get();
  };
  return {
      [=](prefill_atom, RequestPlan& plan) {
        BusyScope busy(*c, self->mailbox().size());
        take_prefill(self, env, h, w, std::move(plan));
      },
      [=](layer_atom, uint64_t id, int32_t layer) {
        BusyScope busy(*c, self->mailbox().size());
        if (auto* t = target_of(id)) t->gate.arrive(layer);
        schedule(self, env, h, w);
      },
      [=](load_end_atom, uint64_t id, uint64_t loader) {
        BusyScope busy(*c, self->mailbox().size());
        auto out = w->loads_out.find(loader);
        if (out != w->loads_out.end() && --out->second <= 0) w->loads_out.erase(out);
        if (auto* t = target_of(id)) t->gate.loader_done(loader);
        schedule(self, env, h, w);
      },
      [=](rank_opened_atom, uint64_t id, int32_t rank, bool ok) {
        BusyScope busy(*c, self->mailbox().size());
        auto it = w->prefills.find(id);
        const size_t r = static_cast<size_t>(rank - 1);
        if (it == w->prefills.end() || rank < 1 || r >= it->second->rank_open.size()) return;
        // Not yet: that rank's pages of ended requests are still going back; asked
        // again at the next look (poll_interval), not in a loop of messages.
        it->second->rank_open[r] = ok ? PrefillTask::RankOpen::Open : PrefillTask::RankOpen::No;
        if (!ok) it->second->ask_ranks_after = std::chrono::steady_clock::now() + poll_interval(env);
        schedule(self, env, h, w);
      },
      [=](rank_load_end_atom, uint64_t id, uint64_t loader, int32_t rank) {
        BusyScope busy(*c, self->mailbox().size());
        if (auto* t = target_of(id)) t->gate.loader_done(loader, rank);
        schedule(self, env, h, w);
      },
      [=](loader_down_atom, uint64_t loader, const std::string& why) {
        BusyScope busy(*c, self->mailbox().size());
        // The layers its requests wait for will not come, and nothing writes their
        // caches for it any more (a value it sent a follower before it died still
        // lands there, in a cache nobody computes from: the request fails).
        w->loads_out.erase(loader);
        for (auto& [id, t] : w->prefills)
          if (t->target->gate.holds(loader)) {
            t->target->gate.fail(why);
            t->target->gate.loader_gone(loader);
          }
        schedule(self, env, h, w);
      },
      [=](rank_down_atom, int32_t rank, const std::string& why) {
        BusyScope busy(*c, self->mailbox().size());
        // Its targets died with it: the prefills loading there fail; one still
        // waiting for its cache there asks the new rank worker.
        const size_t r = static_cast<size_t>(rank - 1);
        for (auto& [id, t] : w->prefills) {
          if (t->phase == PrefillTask::Phase::Pages) {
            if (r < t->rank_open.size()) t->rank_open[r] = PrefillTask::RankOpen::No;
            continue;
          }
          t->target->gate.fail(why);
          t->target->gate.rank_gone(rank);
        }
        schedule(self, env, h, w);
      },
      [=](load_fail_atom, uint64_t id, int32_t part, const std::string& why) {
        BusyScope busy(*c, self->mailbox().size());
        // One stored entry failed: the prefill begins again with that part computed.
        if (auto it = w->prefills.find(id); it != w->prefills.end()) {
          it->second->failed_parts.push_back(part);
          it->second->target->gate.fail(why, /*recoverable=*/true);
        }
        schedule(self, env, h, w);
      },
      [=](stepped_atom, uint64_t id, PrefillWorkPtr& work) {
        BusyScope busy(*c, self->mailbox().size());
        on_stepped(self, env, h, w, id, std::move(work));
      },
      [=](tick_atom) {
        BusyScope busy(*c, self->mailbox().size());
        w->tick_pending = false;
        schedule(self, env, h, w);
      },
      [=](cancel_atom, uint64_t id) {
        BusyScope busy(*c, self->mailbox().size());
        // A prefill stops at its next layer boundary (its loaders at their next
        // layer); a decode step waiting in the batcher goes back uncomputed.
        if (auto it = w->prefills.find(id); it != w->prefills.end()) {
          it->second->cancelled->store(true);
          it->second->target->gate.fail("cancelled");
        }
        if (auto it = w->decodes.find(id); it != w->decodes.end()) it->second->cancelled = true;
        schedule(self, env, h, w);
      },
      [=](decode_atom, uint64_t id, const DecodeAsk& ask) {
        BusyScope busy(*c, self->mailbox().size());
        auto it = w->decodes.find(id);
        if (it == w->decodes.end()) {
          self->send(h->decoder(), logits_atom::value, id, DecodeStep{{}, -1, 0, false, "the request has no cache"});
          return;
        }
        // One drain job at a time: requests that arrive while it is queued (or held)
        // join it. Held while prefills go first (prefill_first).
        if (!it->second->exact_tokens.empty()) it->second->exact_tokens.push_back(ask.token);
        if (w->batcher->add(it->second, ask.token, ask.next)) {
          if (prefill_first(env, *w)) w->drain_held = true;
          else submit_drain(self, env, h, *w);
        }
      },
      [=](end_atom, uint64_t id) {
        BusyScope busy(*c, self->mailbox().size());
        // The request ended (finished, or failed by the runtime): its cache goes. A
        // batch still stepping it holds its own reference.
        if (auto it = w->decodes.find(id); it != w->decodes.end()) {
          it->second->cancelled = true;  // a step that runs after this skips it (before the followers' End)
          // The blocks the generated tokens completed (the prompt's were stored at the
          // first token).
          // The last token asked for may still be stepping (a cancel): its row is left out.
          auto& slot = it->second;
          if (env.config.write_back && env.config.prefix_block_tokens > 0 && !slot->exact_tokens.empty()) {
            slot->exact_tokens.pop_back();
            const int64_t B = env.config.prefix_block_tokens;
            store_prefix_blocks(env, h, w->batcher, std::move(slot->exact_tokens), B, slot->prompt_tokens / B, 0, slot);
          }
          w->decodes.erase(it);
        }
        w->batcher->forget(id);
        if (auto it = w->prefills.find(id); it != w->prefills.end()) {
          it->second->cancelled->store(true);
          it->second->target->gate.fail("the request ended");
        }
        // The followers free its caches after every job already sent for it: the End
        // goes out from the compute thread, in order (a job that runs after it sees the
        // flags set above and tells the followers nothing of this request).
        if (env.tp)
          env.compute->submit([env, id] { env.tp->dispatch(RankJob{RankJob::End, id, {}, false, {}, {}, false}); });
        schedule(self, env, h, w);
      },
      [=](document_atom, const std::vector<int32_t>& tokens) -> caf::typed_response_promise<KeyedKv> {
        BusyScope busy(*c, self->mailbox().size());
        auto reply = self->make_response_promise<KeyedKv>();
        const ChunkKey key = env.engine->chunk_key(tokens);
        // Urgent, like a prefill (a caller waits for it), and like a prefill it lets
        // the decoding streams step between its layers instead of freezing them.
        // The answer goes back through this actor (document_done): the promise is
        // delivered in its context, not on the compute thread.
        const bool queued = env.compute->submit([env, h, batcher = w->batcher, tokens, key, reply] {
          DocumentKv done{reply, KeyedKv{key, nullptr}, ""};
          try {
            done.kv.kv = compute_alone(env, h, batcher, tokens, false);
          } catch (const std::exception& e) {
            done.error = e.what();
          } catch (...) {
            done.error = "unknown error";
          }
          caf::anon_send(h->worker(), document_done_atom::value, std::move(done));
        });
        if (!queued) reply.deliver(make_runtime_error(RequestErrc::shutting_down, "the runtime is shut down"));
        return reply;
      },
      [=](document_done_atom, DocumentKv& done) {
        BusyScope busy(*c, self->mailbox().size());
        if (done.kv.kv) done.reply.deliver(std::move(done.kv));
        else done.reply.deliver(make_runtime_error(RequestErrc::internal, "the document's compute failed: " + done.error));
      },
  };
}

}  // namespace bs
