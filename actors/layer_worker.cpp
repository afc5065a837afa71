// layer worker (one per device rank; one rank today): owns the execution state of
// every prefill it runs (keyed by request id) and decides, one step at a time,
// what the compute thread runs next. A prefill is the blend engine's steps
// (BlendEngine::begin / step / finish): a step job computes the layers whose stored
// KV the loaders have delivered, then hands the prefill back; one that waits for a
// slow tier is parked and the compute thread goes to work that is ready (another
// request's prefill, decode steps), so loading layer l+1 overlaps computing layer l
// and a RAM-only request is not held up behind a slow SSD load. Ready prefills go
// oldest first. Cancellation, a failed load and limits.load_timeout take effect at
// a layer boundary; the cache is dropped only once the request's loaders stopped
// writing it. Decode steps are batched (continuous batching,
// actors/decode_batcher.h): a request's next step waits in the batcher and one job
// runs every waiting request in one Transformer::decode_step; between the layers
// of a prefill (and of a write-back compute, and of a document stored through
// Runtime::store_document) a due decode step runs inline, so streams slow down
// instead of freezing. Write-back computes run in the background. Results go back
// to the fusor and decoder by message.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {
namespace {

// How long a drain job waits at most for the requests of the previous step to come
// back from the decoder before it steps without them (DecodeBatcher::take). Each
// of them comes back or finishes (forget), usually within a millisecond; the bound
// only matters when the decoder is slow (a loaded machine, a slow on_text), and
// the decoder is then what every stream waits for anyway.
constexpr auto kGather = std::chrono::milliseconds(50);

// limits.decode_interleave as a clock duration (capped at a day: "never").
std::chrono::steady_clock::duration interleave_interval(const RuntimeContext* ctx) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(ctx->config.decode_interleave, 0.0, 86400.0)));
}

// One decode step for the taken entries. A cancelled request is not computed, but
// still goes to the decoder, which finishes it. If the batched step throws, each
// request is stepped alone, so only the one that fails gets the error.
void run_decode_batch(RuntimeContext* ctx, const HandlesRef& h, std::vector<DecodeBatcher::Entry> entries,
                      bool interleaved) {
  std::vector<DecodeBatcher::Entry> live;
  for (auto& e : entries) {
    if (e.request->cancelled.load()) caf::anon_send(h->decoder(), logits_atom::value, e.request);
    else live.push_back(std::move(e));
  }
  if (live.empty()) return;
  ctx->decode_batcher.step_began();
  const int64_t B = static_cast<int64_t>(live.size());
  const int64_t vocab = ctx->model->config().vocab;
  std::vector<int32_t> tokens;
  std::vector<KvCache*> caches;
  for (const auto& e : live) {
    tokens.push_back(e.token);
    caches.push_back(&e.request->prefill.cache);
  }
  try {
    const std::vector<float> logits = ctx->tf->decode_step(tokens, caches);
    for (int64_t b = 0; b < B; ++b) {
      auto& out = live[b].request->prefill.logits;
      out.resize(static_cast<size_t>(vocab));
      std::memcpy(out.data(), logits.data() + b * vocab, static_cast<size_t>(vocab) * sizeof(float));
    }
  } catch (const std::exception&) {
    // decode_step checks every cache before it writes any: stepping alone is safe.
    for (int64_t b = 0; b < B; ++b) {
      auto& r = *live[b].request;
      try {
        r.prefill.logits = ctx->tf->forward(std::span<const int32_t>(&tokens[b], 1), r.prefill.cache);
      } catch (const std::exception& e) {
        r.prefill_error = e.what();
      }
    }
  }
  ctx->decode_steps.fetch_add(1);
  ctx->decode_tokens.fetch_add(B);
  if (interleaved) ctx->interleaved_steps.fetch_add(1);
  for (auto& e : live) {
    auto& r = *e.request;
    ++r.decode_steps;
    r.decode_batch_sum += B;
    if (interleaved) ++r.decode_interleaved;
    caf::anon_send(h->decoder(), logits_atom::value, e.request);
  }
}

// The compute job behind decode_atom: one batched step of the waiting requests.
void drain_decode(RuntimeContext* ctx, const HandlesRef& h) {
  bool more = false;
  auto entries = ctx->decode_batcher.take(ctx->config.max_decode_batch, kGather, more);
  if (more && !ctx->compute->submit([ctx, h] { drain_decode(ctx, h); })) {
    // Shutting down: whatever waits is finished by the decoder as cancelled.
    for (auto& e : ctx->decode_batcher.take_all()) {
      e.request->cancelled = true;
      entries.push_back(std::move(e));
    }
  }
  run_decode_batch(ctx, h, std::move(entries), false);
}

// Between the layers of a long compute on the compute thread: one decode step
// when requests wait for one and the last step began decode_interleave ago.
// Nothing of the interrupted compute is live in the Transformer's scratch buffers
// here (they are only used inside one Transformer call), and the step touches
// only the decoding requests' own caches.
double interleave_decode(RuntimeContext* ctx, const HandlesRef& h) {
  if (!ctx->decode_batcher.due(interleave_interval(ctx))) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  run_decode_batch(ctx, h, ctx->decode_batcher.take_now(ctx->config.max_decode_batch), true);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Between two layers of a prefill: a due decode step of the other requests, its
// time counted in the prefill's pauses (and in its wait for the next layer).
void pause_for_decode(RuntimeContext* ctx, const HandlesRef& h, RequestState& r) {
  const double s = interleave_decode(ctx, h);
  if (s > 0) {
    ++r.prefill_pauses;
    r.prefill_pause_seconds += s;
  }
}

// limits.load_timeout as a clock duration.
std::chrono::steady_clock::duration load_timeout(const RuntimeContext* ctx) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(ctx->config.load_timeout, 0.001, 86400.0)));
}

// How often the worker looks at parked prefills (a cancel, a failed load, a
// timeout, loaders that stopped): decode_interleave, within [1 ms, 50 ms].
std::chrono::steady_clock::duration poll_interval(const RuntimeContext* ctx) {
  return std::clamp<std::chrono::steady_clock::duration>(interleave_interval(ctx), std::chrono::milliseconds(1),
                                                         std::chrono::milliseconds(50));
}

// One prefill in the worker. The worker's handlers and the compute thread take
// turns: while a step job for it is queued or running (on_compute), only that job
// touches it; otherwise only the worker does. The message that ends a job
// (stepped_atom) orders the two.
struct PrefillTask {
  enum class Phase {
    Ready,      // may step: not begun, or its next layer is delivered
    Parked,     // waits for its next layer from the loaders
    Stopping,   // failed (a load, a cancel, a compute error): waits for its loaders to stop
    Fallback,   // a stored entry failed: redone from whole entries (a job on the compute thread)
    Done,       // prefilled, or failed: answered to the fusor
  };
  RequestPtr r;
  uint64_t order = 0;  // arrival: ready prefills step oldest first
  PrefillRun run;
  bool begun = false;
  bool on_compute = false;
  Phase phase = Phase::Ready;
  double begin_s = 0;  // seconds since submit when the worker took it
  // When the wait for the next layer began (the step's per-layer wait), and when
  // that wait times out (limits.load_timeout) — also the bound on a stopping load.
  std::chrono::steady_clock::time_point waiting_since, deadline;
  // Set by a step job that ended it: finished (run.done() and finish() ran), or
  // failed with `error` (the gate is failed too, so the loaders stop).
  bool finished = false;
  std::string error;
  // The failure was a stored entry that failed its read (recoverable): once the
  // loaders stopped, the prefill is redone from whole entries.
  bool fall_back = false;
};
using TaskPtr = std::shared_ptr<PrefillTask>;

// The compute job of one prefill: steps while its next layer is delivered (the
// first job begins it), runs a due decode step between layers, and ends the
// prefill after its last layer. Stops at a cancel, a failed gate or an undelivered
// layer; the worker decides what comes next (stepped_atom).
void step_prefill(RuntimeContext* ctx, const HandlesRef& h, const TaskPtr& t) {
  auto& r = t->r;
  try {
    if (!t->begun) {
      t->run = ctx->engine->begin(r->prompt, r->plan, r->cache, r->options, 1, r->submitted);
      t->begun = true;
    }
    while (!t->run.done()) {
      if (r->cancelled.load()) {
        t->error = "cancelled before layer " + std::to_string(t->run.next_layer());
        break;
      }
      if (r->gate.failed()) break;
      if (t->run.needs_delivery() && !r->gate.delivered(t->run.next_layer())) break;
      ctx->engine->step(t->run, t->waiting_since);
      // The wait for the next layer starts now; a decode step run here counts in it.
      t->waiting_since = std::chrono::steady_clock::now();
      pause_for_decode(ctx, h, *r);
    }
    if (t->error.empty() && !r->gate.failed() && t->run.done()) {
      r->prefill = ctx->engine->finish(std::move(t->run));
      t->finished = true;
    }
  } catch (const std::exception& e) {
    t->error = e.what();
  }
  // The loaders stop at their next layer.
  if (!t->error.empty()) r->gate.fail(t->error);
  caf::anon_send(h->worker(), stepped_atom::value, r->id);
}

// The compute job of a prefill whose stored entry failed mid-load, once its
// loaders stopped: the whole prefill again from whole entries, where the failed
// file (already removed by the store) is a miss and its chunk is computed.
void fallback_prefill(RuntimeContext* ctx, const HandlesRef& h, const TaskPtr& t) {
  auto& r = t->r;
  try {
    r->prefill = ctx->from_store->prefill(r->prompt, r->options, r->request.sampling.max_tokens, 1,
                                          [ctx, h, &r](int layer) {
                                            pause_for_decode(ctx, h, *r);
                                            if (r->cancelled.load())
                                              throw std::runtime_error("cancelled before layer " + std::to_string(layer));
                                          });
    t->finished = true;
  } catch (const std::exception& e) {
    t->error = e.what();
  }
  caf::anon_send(h->worker(), stepped_atom::value, r->id);
}

// The prefills of one worker, owned by its handlers.
struct WorkerState {
  std::unordered_map<uint64_t, TaskPtr> tasks;
  uint64_t arrivals = 0;
  bool stepping = false;      // a prefill job is queued or running on the compute thread
  bool tick_pending = false;  // a tick is on its way (while a prefill is parked or stopping)
};
using WorkerStatePtr = std::shared_ptr<WorkerState>;

// Ends a prefill: its profile to the controller, the request to the fusor.
void conclude(const HandlesRef& h, WorkerState& w, const TaskPtr& t) {
  auto& r = t->r;
  t->phase = PrefillTask::Phase::Done;
  if (!t->finished) {
    r->prefill_error = t->error.empty() ? "the prefill failed" : t->error;
  } else if (!r->fallback) {
    // Compute time only: the final pass's layers, without the waits for loads.
    const auto& st = r->prefill.stats;
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
  // Moved into the prefill on success; freed otherwise — unless a loader that did
  // not stop in time may still write it: then it goes with the request.
  if (r->gate.loaders_done()) r->cache = KvCache();
  r->add_event({"worker", "prefill", -1, t->begin_s, r->now_s(), 0});
  caf::anon_send(h->fusor(), prefilled_atom::value, r);
  w.tasks.erase(r->id);
}

// The worker's decision: parked and stopping prefills move on (a delivered layer,
// a cancel, a failure, a timeout, loaders that stopped), then the oldest ready
// prefill gets the compute thread — one prefill job at a time, so every step is
// decided here with what is known then.
void schedule(worker_actor::pointer self, RuntimeContext* ctx, const HandlesRef& h, const WorkerStatePtr& w) {
  using Phase = PrefillTask::Phase;
  const auto now = std::chrono::steady_clock::now();
  std::vector<TaskPtr> concluded;
  for (auto& [id, t] : w->tasks) {
    if (t->on_compute) continue;
    auto& r = t->r;
    if (t->phase == Phase::Parked) {
      std::string why;
      bool recoverable = false;
      if (r->gate.failure(why, recoverable)) {
        t->error = recoverable ? why : "loading the stored KV failed: " + why;
        t->fall_back = recoverable;
      } else if (r->cancelled.load()) {
        t->error = "cancelled before layer " + std::to_string(t->run.next_layer());
        r->gate.fail(t->error);
      } else if (now >= t->deadline) {
        t->error = "loading the stored KV failed: layer " + std::to_string(t->run.next_layer()) +
                   " did not arrive within " + std::to_string(ctx->config.load_timeout) + " s (limits.load_timeout)";
        r->gate.fail(t->error);
      } else if (r->gate.delivered(t->run.next_layer())) {
        t->phase = Phase::Ready;
        continue;
      } else {
        continue;
      }
      t->phase = Phase::Stopping;
      t->deadline = now + load_timeout(ctx);
      r->add_event({"worker", "prefill " + t->error, t->run.next_layer(), t->begin_s, r->now_s(), 0});
    }
    if (t->phase == Phase::Stopping) {
      // The cache is the loaders' until they stopped (or did not within the bound:
      // then the request fails and the cache goes with it).
      const bool stopped = r->gate.loaders_done();
      if (!stopped && now < t->deadline) continue;
      if (stopped && t->fall_back && !r->cancelled.load()) {
        r->fallback = true;
        r->add_event({"worker", "fallback: " + t->error, -1, t->begin_s, r->now_s(), 0});
        t->error.clear();
        t->phase = Phase::Fallback;
        continue;
      }
      if (!stopped) t->error += " (the loaders did not stop within limits.load_timeout)";
      concluded.push_back(t);
    }
  }
  for (auto& t : concluded) conclude(h, *w, t);

  if (!w->stepping) {
    TaskPtr next;
    for (auto& [id, t] : w->tasks)
      if (!t->on_compute && (t->phase == Phase::Ready || t->phase == Phase::Fallback) &&
          (!next || t->order < next->order))
        next = t;
    if (next) {
      next->on_compute = true;
      w->stepping = true;
      const bool fallback = next->phase == Phase::Fallback;
      const bool queued = ctx->compute->submit([ctx, h, next, fallback] {
        if (fallback) fallback_prefill(ctx, h, next);
        else step_prefill(ctx, h, next);
      });
      if (!queued) {
        next->on_compute = false;
        w->stepping = false;
        next->error = "the runtime is shutting down";
        next->r->gate.fail(next->error);
        next->phase = Phase::Stopping;
        next->deadline = now + load_timeout(ctx);
      }
    }
  }
  // Parked and stopping prefills are looked at again shortly.
  bool waiting = false;
  for (auto& [id, t] : w->tasks)
    if (!t->on_compute && (t->phase == Phase::Parked || t->phase == Phase::Stopping)) waiting = true;
  if (waiting && !w->tick_pending) {
    w->tick_pending = true;
    self->delayed_send(self, poll_interval(ctx), tick_atom::value);
  }
}

// A step job ended: the prefill is done, failed, or waits for its next layer.
void on_stepped(worker_actor::pointer self, RuntimeContext* ctx, const HandlesRef& h, const WorkerStatePtr& w,
                uint64_t id) {
  using Phase = PrefillTask::Phase;
  w->stepping = false;
  auto it = w->tasks.find(id);
  if (it != w->tasks.end()) {
    TaskPtr t = it->second;
    t->on_compute = false;
    const auto now = std::chrono::steady_clock::now();
    if (t->finished) {
      conclude(h, *w, t);
    } else if (t->phase == Phase::Fallback) {
      conclude(h, *w, t);  // the fallback failed: t->error says why
    } else if (!t->error.empty() || t->r->gate.failed()) {
      std::string why;
      bool recoverable = false;
      if (t->error.empty() && t->r->gate.failure(why, recoverable)) {
        t->error = recoverable ? why : "loading the stored KV failed: " + why;
        t->fall_back = recoverable;
      }
      t->phase = Phase::Stopping;
      t->deadline = now + load_timeout(ctx);
      t->r->add_event({"worker", "prefill " + t->error, t->run.next_layer(), t->begin_s, t->r->now_s(), 0});
    } else {
      // Its next layer is not there yet: the compute thread goes to other work.
      t->phase = Phase::Parked;
      t->deadline = t->waiting_since + load_timeout(ctx);
    }
  }
  schedule(self, ctx, h, w);
}

}  // namespace

worker_actor::behavior_type layer_worker(worker_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  auto w = std::make_shared<WorkerState>();
  return {
      [=](prefill_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        auto t = std::make_shared<PrefillTask>();
        t->order = ++w->arrivals;
        t->begin_s = r->now_s();
        t->waiting_since = std::chrono::steady_clock::now();
        t->deadline = t->waiting_since + load_timeout(ctx);
        t->r = std::move(r);
        w->tasks[t->r->id] = t;
        schedule(self, ctx, h, w);
      },
      [=](layer_atom, RequestPtr r, int32_t layer) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.arrive(layer);
        schedule(self, ctx, h, w);
      },
      [=](load_end_atom, RequestPtr r, uint64_t loader) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.loader_done(loader);
        schedule(self, ctx, h, w);
      },
      [=](load_fail_atom, RequestPtr r, const std::string& why) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.fail(why, /*recoverable=*/true);  // one stored entry failed: the prefill falls back
        schedule(self, ctx, h, w);
      },
      [=](stepped_atom, uint64_t id) {
        BusyScope busy(*c, self->mailbox().size());
        on_stepped(self, ctx, h, w, id);
      },
      [=](tick_atom) {
        BusyScope busy(*c, self->mailbox().size());
        w->tick_pending = false;
        schedule(self, ctx, h, w);
      },
      [=](decode_atom, RequestPtr r, int32_t token) {
        BusyScope busy(*c, self->mailbox().size());
        // One drain job at a time: requests that arrive while it is queued join it.
        if (ctx->decode_batcher.add(std::move(r), token) && !ctx->compute->submit([ctx, h] { drain_decode(ctx, h); })) {
          // Shutting down: the decoder finishes whatever waits as cancelled.
          for (auto& e : ctx->decode_batcher.take_all()) {
            e.request->cancelled = true;
            self->send(h->decoder(), logits_atom::value, e.request);
          }
        }
      },
      [=](warm_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        // One background job per missed part, so a decode step waits for at most one
        // chunk's compute.
        auto queue = [&](const std::vector<int32_t>& tokens, const ChunkKey& key, bool prefix) {
          if (tokens.empty()) return;
          ctx->compute->submit(
              [ctx, h, tokens, key, prefix] {
                if (ctx->tiered->contains(key)) return;
                // Decode steps between its layers too: a long document must not stall the streams.
                const LayerWait step = [ctx, h](int) { interleave_decode(ctx, h); };
                auto kv = prefix ? ctx->engine->compute_prefix_kv(tokens, step)
                                 : ctx->engine->compute_chunk_kv(tokens, step);
                caf::anon_send(h->fusor(), kv_ready_atom::value, KeyedKv{key, std::move(kv)});
              },
              ComputeThread::Priority::Background);
        };
        // Every mode stores what it had to compute: a `full` request warms the
        // cache for the blend requests after it.
        if (!r->prompt.prefix.empty() && !r->plan.prefix_loaded) queue(r->prompt.prefix, r->prefix_key, true);
        for (size_t i = 0; i < r->prompt.chunks.size(); ++i)
          if (!r->plan.chunk_loaded[i] || r->fallback) queue(r->prompt.chunks[i], r->chunk_keys[i], false);
      },
      [=](document_atom, const std::vector<int32_t>& tokens) -> caf::typed_response_promise<KeyedKv> {
        BusyScope busy(*c, self->mailbox().size());
        auto reply = self->make_response_promise<KeyedKv>();
        const ChunkKey key = ctx->engine->chunk_key(tokens);
        // Urgent, like a prefill (a caller waits for it), and like a prefill it lets
        // the decoding streams step between its layers instead of freezing them.
        // The answer goes back through this actor (document_done): the promise is
        // delivered in its context, not on the compute thread.
        const bool queued = ctx->compute->submit([ctx, h, tokens, key, reply] {
          DocumentKv done{reply, KeyedKv{key, nullptr}, ""};
          try {
            done.kv.kv = ctx->engine->compute_chunk_kv(tokens, [ctx, h](int) { interleave_decode(ctx, h); });
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
