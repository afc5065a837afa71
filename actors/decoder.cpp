// decoder: one decode step per message. Samples from the request's logits,
// applies end of turn, stop strings and max_tokens (DecodeSession), streams the
// newly final text to the caller, and asks the worker for the next step (the
// worker batches the steps of all decoding requests). At the end: the result to
// the caller, the trace to the inspector, and the request's slot back to the
// intake (the next queued request starts).
#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {
namespace {

void finish(decoder_actor::pointer self, RuntimeContext* ctx, const HandlesRef& h, const RequestPtr& r,
            const std::string& error) {
  if (r->finished.exchange(true)) return;  // the supervisor failed it already
  auto& res = r->result;
  res.id = r->id;
  const auto& st = r->prefill.stats;
  res.prompt_tokens = r->prompt.size();
  res.cached_tokens = st.cached_tokens + (st.prefix_hit ? st.prefix_tokens : 0);
  res.recomputed_tokens = st.recomputed_tokens;
  res.chunks = static_cast<int>(r->prompt.chunks.size());
  for (Tier t : r->chunk_tier) {
    if (t == Tier::Ram) ++res.chunks_ram;
    if (t == Tier::Ssd) ++res.chunks_ssd;
    if (t == Tier::Miss) ++res.chunks_missed;
  }
  res.ratio = r->options.ratio;
  if (!error.empty()) {
    res.finish_reason = "error";
    res.error = error;
  } else if (r->decode) {
    res.text = r->decode->text();
    res.tokens = r->decode->tokens();
    res.finish_reason = r->decode->finish_reason();
  } else {
    res.finish_reason = "cancelled";
  }
  if (r->has_first_token) {
    res.ttft_seconds = r->seconds_since_submit(r->first_token);
    res.decode_seconds = r->now_s() - res.ttft_seconds;
  }
  res.total_seconds = r->now_s();
  r->prefill.cache = KvCache();  // the request's KV is no longer needed
  ctx->decode_batcher.forget(r->id);  // no decode step waits for it
  self->send(h->inspector(), trace_atom::value, r->trace_json());
  if (r->admitted) {
    ctx->in_flight.fetch_sub(1);
    self->send(h->intake(), release_atom::value);
  }
  if (r->callbacks.on_done) r->callbacks.on_done(res);
}

void step(decoder_actor::pointer self, RuntimeContext* ctx, const HandlesRef& h, const RequestPtr& r) {
  if (r->finished.load()) return;  // failed by the supervisor: nothing more to do
  if (r->cancelled.load()) {
    if (r->decode) r->decode->cancel();
    return finish(self, ctx, h, r, "");
  }
  if (!r->prefill_error.empty()) return finish(self, ctx, h, r, r->prefill_error);
  const auto& cache = r->prefill.cache;
  auto st = r->decode->step(r->prefill.logits.data(), cache.length + 1 <= cache.capacity);
  if (!r->has_first_token) {
    r->has_first_token = true;
    r->first_token = RequestState::clock::now();
    const double t = r->seconds_since_submit(r->first_token);
    r->add_event({"decoder", "first token", -1, t, t, 0});
  }
  if (!st.text.empty() && r->callbacks.on_text && !r->callbacks.on_text(st.text)) {
    r->cancelled = true;
    r->decode->cancel();
    return finish(self, ctx, h, r, "");
  }
  if (st.done) return finish(self, ctx, h, r, "");
  self->send(h->worker(), decode_atom::value, r, st.token);
}

}  // namespace

decoder_actor::behavior_type decoder(decoder_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](start_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        if (r->prefill_error.empty() && !r->finished.load())
          r->decode = std::make_unique<DecodeSession>(ctx->model->tokenizer(), ctx->model->config().vocab,
                                                      r->request.sampling);
        step(self, ctx, h, r);
      },
      [=](logits_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        step(self, ctx, h, r);
      },
  };
}

}  // namespace bs
