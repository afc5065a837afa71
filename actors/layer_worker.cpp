// layer worker (one per device rank; one rank today): receives the loaders'
// per-layer deliveries and feeds the compute thread. The prefill job runs the
// blend engine over the request's cache, waiting on the request's layer gate
// before each layer, so layer l computes while the loaders read l+1. Decode
// steps are batched (continuous batching, actors/decode_batcher.h): a request's
// next step waits in the batcher and one job runs every waiting request in one
// Transformer::decode_step; between the layers of a long prefill (and of a
// write-back compute, and of a document stored through Runtime::store_document) a
// due decode step runs inline, so streams slow down instead of freezing. Write-back
// computes run in the background. Results go back to the fusor and decoder by
// message.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

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

// Thrown between the layers of a prefill whose request was cancelled (the client
// left, Runtime::cancel): the rest of its layers are not computed.
struct PrefillCancelled : std::runtime_error {
  explicit PrefillCancelled(int layer)
      : std::runtime_error("cancelled before layer " + std::to_string(layer)), layer(layer) {}
  int layer;
};

// limits.load_timeout as a clock duration.
std::chrono::steady_clock::duration load_timeout(const RuntimeContext* ctx) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(ctx->config.load_timeout, 0.001, 86400.0)));
}

void run_prefill(RuntimeContext* ctx, const HandlesRef& h, const RequestPtr& r) {
  const double begin = r->now_s();
  // Before each layer: decode steps of the other requests, when due — also while
  // the layer's KV is still loading (a slow tier must not freeze the streams
  // either). Their time counts in the prefill's per-layer wait (stats.wait_seconds,
  // the trace's wait+repair) and is reported apart as prefill_pause_s.
  auto pause = [ctx, h, &r] {
    const double s = interleave_decode(ctx, h);
    if (s > 0) {
      ++r->prefill_pauses;
      r->prefill_pause_seconds += s;
    }
  };
  // A cancelled request stops at the next layer boundary (also while it waits for
  // a slow tier), so a client that left frees its slot and the compute thread
  // within one layer's time instead of a whole prefill's.
  auto stop_if_cancelled = [&r](int layer) {
    if (r->cancelled.load()) throw PrefillCancelled(layer);
  };
  const auto poll = std::max(interleave_interval(ctx), std::chrono::steady_clock::duration(std::chrono::milliseconds(1)));
  const auto timeout = load_timeout(ctx);
  // Once the prefill gave up (a failure, a cancel), the loaders stop at their next
  // layer; until they have, they may still write the cache, so it is only dropped
  // after. The streams step meanwhile. True when they stopped within the timeout.
  // The loaders stop within one layer's read: look often, and step the streams
  // whenever a step is due (pause() does nothing otherwise).
  auto loaders_stopped = [&] {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      pause();
      if (r->gate.wait_loaders_done_for(std::chrono::milliseconds(5))) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
  };
  bool cache_free = true;  // no loader writes into r->cache any more
  try {
    stop_if_cancelled(0);
    r->prefill = ctx->engine->prefill_planned(
        r->prompt, r->plan, r->cache, r->options,
        [&r, &pause, &stop_if_cancelled, poll, timeout](int layer) {
          const auto deadline = std::chrono::steady_clock::now() + timeout;
          while (!r->gate.wait_for(layer, poll)) {
            stop_if_cancelled(layer);
            pause();
            if (std::chrono::steady_clock::now() >= deadline)
              r->gate.fail("layer " + std::to_string(layer) + " of the stored KV did not arrive within " +
                           std::to_string(std::chrono::duration<double>(timeout).count()) + " s (limits.load_timeout)");
          }
          pause();
          stop_if_cancelled(layer);
        },
        1, r->submitted);
  } catch (const LayerGate::LoadFailed& e) {
    cache_free = loaders_stopped();
    if (e.recoverable && cache_free) {
      // A stored entry failed mid-load. Nothing writes the cache any more; prefill
      // again from whole entries, where the failed file (already removed by the
      // store) is a miss and its chunk is computed.
      r->fallback = true;
      r->add_event({"worker", std::string("fallback: ") + e.what(), -1, begin, r->now_s(), 0});
      try {
        r->prefill = ctx->from_store->prefill(r->prompt, r->options, r->request.sampling.max_tokens, 1,
                                          [&pause, &stop_if_cancelled](int layer) {
                                            pause();
                                            stop_if_cancelled(layer);
                                          });
      } catch (const PrefillCancelled& c) {
        r->prefill_error = c.what();
        r->add_event({"worker", std::string("prefill ") + c.what(), c.layer, begin, r->now_s(), 0});
      } catch (const std::exception& e2) {
        r->prefill_error = e2.what();
      }
    } else {
      // The load itself broke (a loader died, a timeout): the request fails.
      r->prefill_error = std::string("loading the stored KV failed: ") + e.what();
      r->add_event({"worker", r->prefill_error, -1, begin, r->now_s(), 0});
    }
  } catch (const PrefillCancelled& c) {
    // Loaders may still be writing the cache: they stop at the failed gate, and the
    // cache is dropped only once they are done.
    r->gate.fail(c.what());
    cache_free = loaders_stopped();
    r->prefill_error = c.what();
    r->add_event({"worker", std::string("prefill ") + c.what(), c.layer, begin, r->now_s(), 0});
  } catch (const std::exception& e) {
    r->gate.fail(e.what());
    cache_free = loaders_stopped();
    r->prefill_error = e.what();
  }
  // Moved into the prefill on success; freed otherwise — unless a loader that did
  // not stop in time may still write it: then it goes with the request.
  if (cache_free) r->cache = KvCache();
  r->add_event({"worker", "prefill", -1, begin, r->now_s(), 0});
  if (r->prefill_error.empty()) {
    // Compute time only: the final pass's layers, without the waits for loads.
    const auto& st = r->prefill.stats;
    double seconds = 0;
    for (const auto& lt : st.layers) seconds += lt.compute_end - lt.compute_begin;
    // Rows through the layers as computed (gradual filtering narrows them), the unit
    // the controller predicts with.
    caf::anon_send(h->controller(), profile_atom::value, std::string("compute"), st.row_layers, seconds);
    // The rest of the prefill (selection, embedding, logits), without load waits.
    const double overhead = st.total_seconds - st.wait_seconds - seconds;
    if (overhead > 0)
      caf::anon_send(h->controller(), profile_atom::value, std::string("overhead"), st.prompt_tokens, overhead);
  }
  caf::anon_send(h->fusor(), prefilled_atom::value, r);
}

}  // namespace

worker_actor::behavior_type layer_worker(worker_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](prefill_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        if (!ctx->compute->submit([ctx, h, r] { run_prefill(ctx, h, r); })) {
          r->prefill_error = "the runtime is shutting down";
          r->gate.fail(r->prefill_error);
          self->send(h->fusor(), prefilled_atom::value, r);
        }
      },
      [=](layer_atom, RequestPtr r, int32_t layer) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.arrive(layer);
      },
      [=](load_end_atom, RequestPtr r, uint64_t loader) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.loader_done(loader);
      },
      [=](load_fail_atom, RequestPtr r, const std::string& why) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.fail(why, /*recoverable=*/true);  // one stored entry failed: the prefill falls back
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
