// decoder (the front end's end of a request): one decode step per message. Takes
// the worker's PrefillOutcome (the plan, the first logits), samples, applies end
// of turn, stop strings and max_tokens (DecodeSession), streams the newly final
// text to the caller (its callbacks as Runtime::submit wrapped them: they only queue
// for the delivery threads) and asks the worker for the next step by request id (the
// worker batches the steps of all decoding requests and answers with the next
// logits). At the end: the result to the caller, the trace to the inspector, the
// request's cache freed in the worker (end) and its slot back to the intake (the
// next queued request starts).
#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"

namespace bs {
namespace {

using DecoderSelf = decoder_actor::stateful_pointer<DecoderState>;

// Ends request `id` (error empty: as its decode session says, or cancelled: by the
// record, which the intake marks, or `cancelled_here`, what the decoder itself saw: the
// caller stopped reading, the request never ran or its step was not computed).
// `d` is its decoding state, null for a request that never ran.
void finish(DecoderSelf self, const DecoderEnv& env, const HandlesRef& h, const RecordPtr& rec, Decoding* d,
            const std::string& error, bool cancelled_here = false) {
  const uint64_t id = rec->id;
  if (rec->finished.exchange(true)) {  // the runtime failed it already
    self->state.requests.erase(id);
    return;
  }
  RequestResult res;
  res.id = id;
  auto& trace = *rec->trace;
  if (d) {
    const auto& plan = d->prefill.plan;
    res.prompt_tokens = plan.prompt.size();
    res.cached_tokens = d->prefill.cached_tokens;
    res.prefix_cached_tokens = d->prefill.prefix_cached_tokens;
    trace.set("prefix_cached_tokens", res.prefix_cached_tokens);
    res.recomputed_tokens = d->prefill.recomputed_tokens;
    res.chunks = static_cast<int>(plan.prompt.chunks.size());
    int64_t chunk_tokens = 0;  // from stored chunks (blended)
    for (size_t i = 0; i < plan.chunk_tier.size(); ++i) {
      const TierId t = plan.chunk_tier[i];
      if (t == kMissTier) {
        ++res.chunks_missed;
      } else {
        ++res.chunks_by_tier[env.tiers[static_cast<size_t>(t)].name];
        if (plan.loaded.chunk_loaded[i]) chunk_tokens += static_cast<int64_t>(plan.prompt.chunks[i].size());
      }
    }
    if (plan.pasted) res.pasted_tokens = chunk_tokens;
    // Where the prompt's stored KV came from: the prefix cache (exact), documents'
    // chunks and passages found pasted in the message (both blended).
    trace.set("reused", {{"prefix_cache_tokens", res.prefix_cached_tokens},
                         {"document_tokens", plan.pasted ? 0 : chunk_tokens},
                         {"pasted_passage_tokens", res.pasted_tokens}});
    res.ratio = plan.options.ratio;
    if (d->steps > 0)
      trace.set("decode", {{"steps", d->steps},
                           {"mean_batch", static_cast<double>(d->batch_sum) / static_cast<double>(d->steps)},
                           {"interleaved_steps", d->interleaved}});
    if (d->has_first_token) {
      res.ttft_seconds = trace.seconds_since_submit(d->first_token);
      trace.set("first_token_s", res.ttft_seconds);
    }
  }
  if (rec->expired.load()) {
    // Past limits.max_request_seconds: the intake cancelled it.
    res.finish_reason = "error";
    res.error = rec->expiry_error;
    res.deadline_exceeded = true;
    if (d && d->session) {
      res.text = d->session->text();  // what it had said so far
      res.tokens = d->session->tokens();
    }
  } else if (!error.empty()) {
    res.finish_reason = "error";
    res.error = error;
  } else if (d && d->session && !cancelled_here && !rec->cancelled.load()) {
    res.text = d->session->text();
    res.tokens = d->session->tokens();
    res.finish_reason = d->session->finish_reason();
  } else {
    if (d && d->session) {
      d->session->cancel();
      res.text = d->session->text();
      res.tokens = d->session->tokens();
    }
    res.finish_reason = "cancelled";
  }
  res.total_seconds = trace.now_s();
  if (d && d->has_first_token) res.decode_seconds = res.total_seconds - res.ttft_seconds;
  trace.set("finish_reason", res.finish_reason);
  if (!res.error.empty()) trace.set("error", res.error);
  trace.set("total_s", res.total_seconds);
  self->state.requests.erase(id);
  env.traces.close(id);
  self->send(h->inspector(), trace_atom::value, trace.json());
  if (rec->admitted.exchange(false)) {
    self->send(h->worker(), end_atom::value, id);  // its cache goes
    // Its slot and pages are the intake's to give back (and to the next in its queue).
    self->send(h->intake(), release_atom::value, id);
  }
  env.requests.erase(id);
  if (rec->callbacks.on_done) rec->callbacks.on_done(res);
}

// Takes the next token — sampled here from `logits` (the prefill's, or a step's when
// the backend returns logits) with the draw made for it, or `picked` on the backend —
// streams the text, and asks the worker for the next step, with the draw for the one
// after, unless the request ends here. One draw per token either way, so a seeded
// request gets the same tokens on every backend.
void step(DecoderSelf self, const DecoderEnv& env, const HandlesRef& h, const RecordPtr& rec, Decoding& d,
          const std::vector<float>& logits, int32_t picked, bool first) {
  // A step the worker did not compute (it was cancelled there, or shutting down).
  if (rec->cancelled.load() || (logits.empty() && picked < 0)) return finish(self, env, h, rec, &d, "", true);
  const auto& plan = d.prefill.plan;
  const int64_t done_tokens = static_cast<int64_t>(d.session->tokens().size());
  // Room for the sampled token's KV: the cache holds prompt + max_tokens positions.
  const bool room = plan.prompt.size() + done_tokens + 1 <= plan.cache_capacity();
  if (first) d.next = d.session->next_row();
  auto st = picked >= 0 ? d.session->step_token(picked, room) : d.session->step(logits.data(), d.next, room);
  if (!d.has_first_token) {
    d.has_first_token = true;
    d.first_token = std::chrono::steady_clock::now();
    const double t = rec->trace->seconds_since_submit(d.first_token);
    rec->trace->add_event({"decoder", "first token", -1, t, t, 0});
    rec->trace->set("first_token_s", t);
  }
  rec->trace->set("tokens_out", static_cast<int64_t>(d.session->tokens().size()));
  if (!st.text.empty() && rec->callbacks.on_text && !rec->callbacks.on_text(st.text))
    return finish(self, env, h, rec, &d, "", /*cancelled_here=*/true);  // the caller stopped reading
  if (st.done) return finish(self, env, h, rec, &d, "");
  d.next = d.session->next_row();
  self->send(h->worker(), decode_atom::value, rec->id, DecodeAsk{st.token, d.next});
}

}  // namespace

decoder_actor::behavior_type decoder(DecoderSelf self, DecoderEnv env, HandlesRef h, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](start_atom, PrefillOutcome& out) {
        BusyScope busy(*c, self->mailbox().size());
        const uint64_t id = out.plan.id;
        const RecordPtr rec = env.requests.find(id);
        if (!rec || rec->finished.load()) {
          // The runtime failed it already: only the worker still holds its cache.
          self->send(h->worker(), end_atom::value, id);
          return;
        }
        auto& d = self->state.requests[id];
        std::vector<float> logits = std::move(out.logits);
        d.prefill = std::move(out);
        // A prefill stopped by a cancel ends "cancelled", not as an error.
        if (rec->cancelled.load()) return finish(self, env, h, rec, &d, "");
        if (!d.prefill.error.empty()) return finish(self, env, h, rec, &d, d.prefill.error);
        d.session = std::make_unique<DecodeSession>(env.model->tokenizer(), env.model->config().vocab,
                                                    d.prefill.plan.sampling);
        step(self, env, h, rec, d, logits, -1, /*first=*/true);
      },
      [=](logits_atom, uint64_t id, DecodeStep& s) {
        BusyScope busy(*c, self->mailbox().size());
        const RecordPtr rec = env.requests.find(id);
        auto it = self->state.requests.find(id);
        if (!rec || it == self->state.requests.end()) return;  // finished already
        auto& d = it->second;
        if (s.batch > 0) {
          ++d.steps;
          d.batch_sum += s.batch;
          if (s.interleaved) ++d.interleaved;
        }
        if (!s.error.empty()) return finish(self, env, h, rec, &d, s.error);
        step(self, env, h, rec, d, s.logits, s.token, /*first=*/false);
      },
      [=](finish_atom, uint64_t id) {
        BusyScope busy(*c, self->mailbox().size());
        // It never ran (cancelled while queued, or the runtime shut down).
        if (const RecordPtr rec = env.requests.find(id)) finish(self, env, h, rec, nullptr, "", true);
      },
  };
}

}  // namespace bs
