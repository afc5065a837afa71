// layer worker (one per device rank; one rank today): receives the loaders'
// per-layer deliveries and feeds the compute thread. The prefill job runs the
// blend engine over the request's cache, waiting on the request's layer gate
// before each layer, so layer l computes while the loaders read l+1. Decode
// steps and write-back computes run on the same thread (write-back in the
// background). Results go back to the fusor and decoder by message.
#include <chrono>

#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {
namespace {

void run_prefill(RuntimeContext* ctx, const HandlesRef& h, const RequestPtr& r) {
  const auto& cfg = ctx->model->config();
  const double begin = r->now_s();
  try {
    if (r->cancelled.load()) throw std::runtime_error("cancelled");
    r->prefill = ctx->engine->prefill_planned(r->prompt, r->plan, r->cache, r->options,
                                              [&r](int layer) { r->gate.wait(layer); }, 1, r->submitted);
  } catch (const LayerGate::LoadFailed& e) {
    // A stored entry failed mid-load. Nothing may write the cache any more before
    // it is dropped; then prefill again from whole entries, where the failed file
    // (already removed by the store) is a miss and its chunk is computed.
    r->gate.wait_loaders_done();
    r->fallback = true;
    r->add_event({"worker", std::string("fallback: ") + e.what(), -1, begin, r->now_s(), 0});
    try {
      r->prefill = ctx->engine->prefill(r->prompt, r->options, r->request.sampling.max_tokens, 1);
    } catch (const std::exception& e2) {
      r->prefill_error = e2.what();
    }
  } catch (const std::exception& e) {
    r->gate.fail(e.what());
    r->gate.wait_loaders_done();
    r->prefill_error = e.what();
  }
  r->cache = KvCache();  // moved into the prefill on success; freed otherwise
  r->add_event({"worker", "prefill", -1, begin, r->now_s(), 0});
  if (r->prefill_error.empty()) {
    // Compute time only: the final pass's layers, without the waits for loads.
    const auto& st = r->prefill.stats;
    double seconds = 0;
    for (const auto& lt : st.layers) seconds += lt.compute_end - lt.compute_begin;
    caf::anon_send(h->controller, profile_atom::value, std::string("compute"),
                   static_cast<int64_t>(st.computed_tokens) * cfg.n_layers, seconds);
    // The rest of the prefill (selection, embedding, logits), without load waits.
    const double overhead = st.total_seconds - st.wait_seconds - seconds;
    if (overhead > 0)
      caf::anon_send(h->controller, profile_atom::value, std::string("overhead"), st.prompt_tokens, overhead);
  }
  caf::anon_send(h->fusor, prefilled_atom::value, r);
}

void run_decode_step(RuntimeContext* ctx, const HandlesRef& h, const RequestPtr& r, int32_t token) {
  if (!r->cancelled.load()) {
    try {
      r->prefill.logits = ctx->tf->forward(std::span<const int32_t>(&token, 1), r->prefill.cache);
    } catch (const std::exception& e) {
      r->prefill_error = e.what();
    }
  }
  caf::anon_send(h->decoder, logits_atom::value, r);
}

}  // namespace

worker_actor::behavior_type layer_worker(worker_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c) {
  return {
      [=](prefill_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        if (!ctx->compute->submit([ctx, h, r] { run_prefill(ctx, h, r); })) {
          r->prefill_error = "the runtime is shutting down";
          r->gate.fail(r->prefill_error);
          self->send(h->fusor, prefilled_atom::value, r);
        }
      },
      [=](layer_atom, RequestPtr r, int32_t layer) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.arrive(layer);
      },
      [=](load_end_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.loader_done();
      },
      [=](load_fail_atom, RequestPtr r, const std::string& why) {
        BusyScope busy(*c, self->mailbox().size());
        r->gate.fail(why);
      },
      [=](decode_atom, RequestPtr r, int32_t token) {
        BusyScope busy(*c, self->mailbox().size());
        if (!ctx->compute->submit([ctx, h, r, token] { run_decode_step(ctx, h, r, token); })) {
          r->cancelled = true;
          self->send(h->decoder, logits_atom::value, r);
        }
      },
      [=](warm_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        // One background job per missed part, so a decode step waits for at most one
        // chunk's compute.
        auto queue = [&](const std::vector<int32_t>& tokens, const ChunkKey& key) {
          if (tokens.empty()) return;
          ctx->compute->submit(
              [ctx, h, tokens, key] {
                if (ctx->tiered->contains(key)) return;
                caf::anon_send(h->fusor, kv_ready_atom::value, KeyedKv{key, ctx->engine->compute_chunk_kv(tokens)});
              },
              ComputeThread::Priority::Background);
        };
        // Every mode stores what it had to compute: a `full` request warms the
        // cache for the blend requests after it.
        if (!r->prompt.prefix.empty() && !r->plan.prefix_loaded) queue(r->prompt.prefix, r->prefix_key);
        for (size_t i = 0; i < r->prompt.chunks.size(); ++i)
          if (!r->plan.chunk_loaded[i] || r->fallback) queue(r->prompt.chunks[i], r->chunk_keys[i]);
      },
  };
}

}  // namespace bs
