// intake: turns a caller's request into a keyed RAG prompt, or refuses it with a
// clear error before any work is queued. Admission: up to limits.max_requests run
// at once, and only while the KV page pool has room for a request's whole context
// (prompt + max_tokens) beside the pages promised to the running ones; otherwise up
// to limits.max_queue prepared requests wait here in arrival order and start as
// running ones finish (the release that follows every end); beyond that a request
// is refused as overloaded, so a burst gets a quick "retry later" instead of
// unbounded latency. A request larger than the whole pool is refused as too long.
// A queued request that is cancelled (by id, or at shutdown) leaves the queue and
// is finished as cancelled by the decoder. After an actor's repeated death the
// supervisor pauses admission (RuntimeContext::admit_after_ns): requests queue
// meanwhile and start when it ends.
//
// Deadlines: every accepted request is due limits.max_request_seconds after its
// submit. Then this actor cancels it (queued: it leaves the queue; running: it stops
// at its next step) and marks it expired, so it ends as an error that says so; if it
// has still not ended kExpiryGrace later, it is failed where it stands
// (by the supervisor, fail_atom: on_done now, its slot and cache given back).
//
// The slots and pages are this actor's state (IntakeState::admitted, and the
// pool's reservations, which only its thread writes): whoever ends a request sends
// release(id), and this actor gives the slot and pages back. When it dies, the
// supervisor fails every request and sends the new intake reconcile: it rebuilds the
// ledger from the records still admitted.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"
#include "blend/pasted_chunks.h"
#include "blend/rag_prompt.h"

namespace bs {
namespace {

void check(bool ok, RequestErrc code, const std::string& message) {
  if (!ok) throw RequestError(code, message);
}

// The plan's prompt, keys, options and sampling for the record's request; throws RequestError.
void prepare(const IntakeEnv& env, const RequestRecord& rec, RequestPlan& r) {
  const auto& q = rec.request;
  r.id = rec.id;
  check(!env.shutting_down.load(), RequestErrc::shutting_down, "the server is shutting down");
  if (q.raw || q.prompt) {
    check(q.messages.empty() && q.documents.empty(), RequestErrc::invalid,
          "a raw or pre-tokenized prompt takes no messages or documents");
  } else {
    check(!q.messages.empty(), RequestErrc::invalid, "messages must not be empty");
    for (const auto& m : q.messages)
      check(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool", RequestErrc::invalid,
            "unknown role '" + m.role + "' (system, user, assistant, tool)");
    check(q.messages.back().role == "user" || q.messages.back().role == "tool", RequestErrc::invalid,
          "the last message must be the user's or a tool's result");
  }
  const auto& s = q.sampling;
  check(s.max_tokens >= 1, RequestErrc::invalid, "max_tokens must be >= 1");
  check(std::isfinite(s.temperature) && s.temperature >= 0.0f && s.temperature <= 2.0f, RequestErrc::invalid,
        "temperature must be in [0, 2]");
  check(std::isfinite(s.top_p) && s.top_p > 0.0f && s.top_p <= 1.0f, RequestErrc::invalid, "top_p must be in (0, 1]");
  check(s.top_k >= 0, RequestErrc::invalid, "top_k must be >= 0");
  if (q.ratio) check(*q.ratio >= 0.0f && *q.ratio <= 1.0f, RequestErrc::invalid, "ratio must be in [0, 1]");

  const auto& model = *env.model;
  const int64_t context = model.config().context_length;
  const int64_t limit = env.config.max_prompt_tokens > 0 ? std::min<int64_t>(env.config.max_prompt_tokens, context - 1)
                                                         : context - 1;
  if (!q.prompt) {
    // Before tokenizing: a text of B bytes takes at least B / (the longest token's
    // bytes) tokens, so a prompt far over the limit is refused without encoding it
    // (a 5 MB prompt took seconds of CPU to tokenize only to be refused).
    size_t bytes = q.raw_prompt.size();
    for (const auto& m : q.messages) bytes += m.content.size();
    for (const auto& d : q.documents) bytes += d.size();
    const size_t per_token = model.tokenizer().max_token_bytes();
    const int64_t at_least = static_cast<int64_t>((bytes + per_token - 1) / per_token);
    check(at_least <= limit, RequestErrc::too_long,
          "the prompt has at least " + std::to_string(at_least) + " tokens (" + std::to_string(bytes) +
              " bytes of text); at most " + std::to_string(limit) + " fit");
  }
  if (q.prompt) {
    r.prompt = *q.prompt;
    for (int32_t t : r.prompt.concatenated())
      check(t >= 0 && t < model.config().vocab, RequestErrc::invalid, "token id out of range");
  } else if (q.raw) {
    r.prompt = RagPrompt{};
    r.prompt.suffix = model.tokenizer().encode(q.raw_prompt, false);
    r.prompt.prefix = with_bos(model.tokenizer(), {});  // the model's BOS, where it adds one
  } else if (q.documents.empty() && env.pasted) {
    // No documents: the stored chunks pasted into the message, if any, become its parts.
    PastedMatch m;
    r.prompt = assemble_pasted_prompt(model.tokenizer(), model.chat_template(), q.messages, *env.pasted, &m, q.tools);
    // Stored passages found, but the message's exact prefix blocks save as much compute
    // (the same request again, a conversation's next turn): the prompt is used as
    // written, exact, instead of blending the passages (cut out, the text tokenizes
    // into other blocks). Blending computes the rest and `ratio` of the passages' rows;
    // the exact prefix everything after it.
    if (m.chunks_found > 0 && env.config.prefix_block_tokens > 0) {
      RagPrompt plain = assemble_rag_prompt(model.tokenizer(), model.chat_template(), q.messages, {}, q.tools);
      const int64_t B = env.config.prefix_block_tokens;
      const int64_t end = plain.size() - 1;
      const auto keys = env.engine->prefix_block_keys(plain.concatenated(), B, end);
      int64_t hit = 0;
      while (hit < static_cast<int64_t>(keys.size()) && env.tiered->contains(keys[static_cast<size_t>(hit)])) ++hit;
      const double ratio = q.ratio ? *q.ratio : env.config.blend.ratio;
      if (static_cast<double>(std::min(hit * B, end)) >= (1.0 - ratio) * static_cast<double>(m.chunk_tokens)) {
        r.prompt = std::move(plain);
        m = PastedMatch{};
        rec.trace->set("pasted_chunks_over_prefix", true);
      }
    }
    rec.trace->set("pasted_chunks", m.chunks_found);
    rec.trace->set("pasted_chunk_tokens", m.chunk_tokens);
    // The text around found passages is not stored as chunks; the message's paragraphs
    // are learnt instead (those stored already are skipped by the write-back).
    r.store_missed_chunks = false;
    r.pasted = true;
    if (env.config.learn_passage_tokens > 0 && env.config.write_back && !q.messages.empty() &&
        q.messages.back().role == "user") {
      int64_t learnt = 0;
      for (const auto& para : blank_line_paragraphs(q.messages.back().content)) {
        auto tokens = document_chunk_tokens(model.tokenizer(), para);
        if (static_cast<int64_t>(tokens.size()) < env.config.learn_passage_tokens) continue;
        if (std::find(r.learn.begin(), r.learn.end(), tokens) != r.learn.end()) continue;
        learnt += static_cast<int64_t>(tokens.size());
        r.learn.push_back(std::move(tokens));
      }
      rec.trace->set("learn_candidates", static_cast<int64_t>(r.learn.size()));
      rec.trace->set("learn_candidate_tokens", learnt);
    }
  } else {
    r.prompt = assemble_rag_prompt(model.tokenizer(), model.chat_template(), q.messages, q.documents, q.tools);
  }
  const int64_t n = r.prompt.size();
  check(n > 0, RequestErrc::invalid, "the prompt is empty");
  check(n <= limit, RequestErrc::too_long,
        "the prompt has " + std::to_string(n) + " tokens; at most " + std::to_string(limit) + " fit");
  // Generation stops with "length" where the context ends.
  r.sampling = s;
  r.sampling.max_tokens = static_cast<int>(std::min<int64_t>(s.max_tokens, context - n));
  if (!q.raw)
    for (const auto& stop : model.chat_template().stop_strings()) r.sampling.stop.push_back(stop);

  r.options = env.config.blend;
  if (q.mode) r.options.mode = *q.mode;
  if (q.ratio) r.options.ratio = *q.ratio;
  r.ratio_requested = q.ratio.has_value();
  try {
    env.engine->validate(r.prompt, r.options, r.sampling.max_tokens, 1);
  } catch (const std::length_error& e) {
    throw RequestError(RequestErrc::too_long, e.what());
  } catch (const std::invalid_argument& e) {
    throw RequestError(RequestErrc::invalid, e.what());
  }
  const auto& pool = *env.kv_pool;
  const int64_t pages = pool.pages_for(r.cache_capacity());
  check(pages <= pool.total_pages(), RequestErrc::too_long,
        "the prompt (" + std::to_string(n) + " tokens) and max_tokens (" + std::to_string(r.sampling.max_tokens) +
            ") need " + std::to_string(pages) + " KV cache pages; the whole cache has " +
            std::to_string(pool.total_pages()) + " (device.kv_cache_bytes)");
  // The blocks that may come stored: before the first chunk, or before the last token.
  r.prefix_block = env.config.prefix_block_tokens;
  r.prefix_end = r.prefix_block > 0 ? (r.prompt.chunks.empty() ? n - 1 : static_cast<int64_t>(r.prompt.prefix.size())) : 0;
  r.prefix_block_keys = env.engine->prefix_block_keys(r.prompt.concatenated(), r.prefix_block, r.prefix_end);
  r.chunk_keys.clear();
  for (const auto& chunk : r.prompt.chunks) r.chunk_keys.push_back(env.engine->chunk_key(chunk));
}

}  // namespace

namespace {

using IntakeSelf = intake_actor::stateful_pointer<IntakeState>;

// What the ledger says, published for readers (Runtime::in_flight, metrics).
void publish(IntakeSelf self, const IntakeEnv& env) {
  env.in_flight.store(static_cast<int>(self->state.admitted.size()));
}

// How long a request that ran past its deadline may take to stop before it is
// failed where it stands (a prefill stops at its next layer boundary: milliseconds
// on the models here, seconds for a large model's long prompt on a CPU).
constexpr std::chrono::seconds kExpiryGrace{10};

// True while a restart's admission pause lasts; then a resume message is on its way.
bool paused(IntakeSelf self, const IntakeEnv& env) {
  const auto until = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(env.admit_after_ns.load()));
  const auto now = std::chrono::steady_clock::now();
  if (now >= until) return false;
  if (!self->state.resume_due || *self->state.resume_due < until) {
    self->state.resume_due = until;
    self->delayed_send(self, until - now, resume_atom::value);
  }
  return true;
}

// Takes a slot and the request's KV pages if both are free (only this actor takes
// them, so what it sees free stays free until it takes it) and admission is not paused.
bool admit(IntakeSelf self, const IntakeEnv& env, const RequestPlan& plan) {
  return !paused(self, env) && static_cast<int>(self->state.admitted.size()) < env.config.max_requests &&
         env.kv_pool->try_reserve(env.kv_pool->pages_for(plan.cache_capacity()));
}

// The sentence a request that ran past limits.max_request_seconds ends with.
std::string deadline_error(const IntakeEnv& env) {
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", env.config.max_request_seconds);
  return std::string("the request ran longer than limits.max_request_seconds (") + limit + " s)";
}

// Starts an admitted request: it holds its slot and pages (in this actor's ledger)
// and goes to the controller. Its record says it is admitted: whoever ends it sends
// the release, once (it clears `admitted` first).
void start(IntakeSelf self, const IntakeEnv& env, const HandlesRef& h, RequestPlan plan) {
  const int64_t pages = env.kv_pool->pages_for(plan.cache_capacity());
  if (auto rec = env.requests.find(plan.id)) {
    self->state.admitted[plan.id] = pages;
    publish(self, env);
    rec->kv_pages = pages;
    rec->admitted = true;
  } else {
    env.kv_pool->unreserve(pages);  // not expected: the record lives until the request ends
  }
  self->send(h->controller(), plan_atom::value, std::move(plan));
}

// The ledger rebuilt from the requests' records (a restarted intake: its
// predecessor's ledger died with it): every record still admitted holds its slot
// and pages; nothing else does.
void rebuild_ledger(IntakeSelf self, const IntakeEnv& env) {
  auto& admitted = self->state.admitted;
  admitted.clear();
  int64_t pages = 0;
  for (const auto& r : env.requests.all())
    if (r->admitted.load()) {
      admitted[r->id] = r->kv_pages.load();
      pages += r->kv_pages.load();
    }
  env.kv_pool->set_reserved(pages);
  publish(self, env);
}


// A request that leaves the queue without running: the decoder finishes it (as
// cancelled), which calls on_done and records its trace.
void finish_unstarted(IntakeSelf self, const HandlesRef& h, uint64_t id) {
  self->send(h->decoder(), finish_atom::value, id);
}

void end_wait(const IntakeEnv& env, uint64_t id, std::chrono::steady_clock::time_point queued_at) {
  env.queued.fetch_sub(1);
  auto trace = env.traces.find(id);
  trace->add_event({"intake", "queued", -1, trace->seconds_since_submit(queued_at), trace->now_s(), 0});
}

// A queued request leaves the queue and the decoder finishes it (a cancel, an
// expiry); false when it is not queued.
bool leave_queue(IntakeSelf self, const IntakeEnv& env, const HandlesRef& h, uint64_t id) {
  auto& queue = self->state.queue;
  for (auto it = queue.begin(); it != queue.end(); ++it)
    if (it->id == id) {
      queue.erase(it);
      end_wait(env, id, self->state.queued_at[id]);
      self->state.queued_at.erase(id);
      finish_unstarted(self, h, id);
      return true;
    }
  return false;
}

bool cancelled(const IntakeEnv& env, uint64_t id) {
  auto rec = env.requests.find(id);
  return !rec || rec->cancelled.load();
}

// Starts queued requests while the oldest fits (or drops it: cancelled, shutting down).
void admit_queued(IntakeSelf self, const IntakeEnv& env, const HandlesRef& h) {
  auto& queue = self->state.queue;
  while (!queue.empty()) {
    const bool drop = cancelled(env, queue.front().id) || env.shutting_down.load();
    if (!drop && !admit(self, env, queue.front())) break;  // the oldest waits for its slot and pages
    RequestPlan plan = std::move(queue.front());
    queue.pop_front();
    end_wait(env, plan.id, self->state.queued_at[plan.id]);
    self->state.queued_at.erase(plan.id);
    if (drop) finish_unstarted(self, h, plan.id);
    else start(self, env, h, std::move(plan));
  }
}

}  // namespace

intake_actor::behavior_type intake(intake_actor::stateful_pointer<IntakeState> self, IntakeEnv env, HandlesRef h,
                                   CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  // Detached: this runs on the actor's own thread, which from now on is the only one
  // that writes the pool's reservations. A restarted intake starts with an empty
  // queue and the ledger rebuilt (again on reconcile, once the supervisor failed what
  // its predecessor held).
  env.kv_pool->claim_reservations();
  env.queued.store(0);
  rebuild_ledger(self, env);
  return {
      [=](submit_atom, uint64_t id) -> caf::result<uint64_t> {
        BusyScope busy(*c, self->mailbox().size());
        auto& queue = self->state.queue;
        // The queue is full: refused before any work (tokenizing) is spent on it.
        if (!queue.empty() && static_cast<int>(queue.size()) >= env.config.max_queue)
          return make_runtime_error(RequestErrc::overloaded,
                                    "too many requests: " + std::to_string(self->state.admitted.size()) +
                                        " in flight and " + std::to_string(queue.size()) + " waiting");
        const auto rec = env.requests.find(id);
        if (!rec) return make_runtime_error(RequestErrc::internal, "request " + std::to_string(id) + " is not known");
        RequestPlan plan;
        try {
          prepare(env, *rec, plan);
        } catch (const RequestError& e) {
          return make_runtime_error(e.code, e.what());
        } catch (const std::exception& e) {
          return make_runtime_error(RequestErrc::invalid, e.what());
        }
        auto& trace = *rec->trace;
        trace.add_event({"intake", "tokenize", -1, 0, trace.now_s(), 0});
        trace.set("prompt_tokens", plan.prompt.size());
        trace.set("chunks", plan.prompt.chunks.size());
        trace.set("mode", mode_name(plan.options.mode));
        // Queued requests go first: a free slot with a queue is about to be theirs.
        if (queue.empty() && admit(self, env, plan)) {
          start(self, env, h, std::move(plan));
        } else if (static_cast<int>(queue.size()) >= env.config.max_queue) {
          return make_runtime_error(RequestErrc::overloaded,
                                    "too many requests: " + std::to_string(self->state.admitted.size()) + " in flight and " +
                                        std::to_string(queue.size()) + " waiting (KV cache pages promised: " +
                                        std::to_string(env.kv_pool->reserved_pages()) + " of " +
                                        std::to_string(env.kv_pool->total_pages()) + ")");
        } else {
          self->state.queued_at[id] = std::chrono::steady_clock::now();
          queue.push_back(std::move(plan));
          env.queued.fetch_add(1);
        }
        // Due limits.max_request_seconds after its submit (the time tokenizing took counts).
        const double limit = env.config.max_request_seconds;
        if (limit > 0) {
          const auto due = rec->submitted + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::chrono::duration<double>(limit));
          self->delayed_send(self, std::max(due - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration{0}),
                             expire_atom::value, id, int32_t{0});
        }
        return id;
      },
      [=](expire_atom, uint64_t id, int32_t stage) {
        BusyScope busy(*c, self->mailbox().size());
        const auto rec = env.requests.find(id);
        if (!rec || rec->finished.load()) return;  // it ended in time
        if (stage == 0) {
          rec->expiry_error = deadline_error(env);
          rec->expired = true;  // after its sentence, before cancelled: whoever sees the cancel sees why
          rec->cancelled = true;
          leave_queue(self, env, h, id);
          self->send(h->worker(), cancel_atom::value, id);  // running: stops at its next step
          self->delayed_send(self, kExpiryGrace, expire_atom::value, id, int32_t{1});
          return;
        }
        // The supervisor ends it (on_done once; its slot back; the worker drops what it
        // holds for it), as it ends what a dead actor held.
        self->send(h->supervisor(), fail_atom::value, id,
                   deadline_error(env) + " and had not stopped " + std::to_string(kExpiryGrace.count()) + " s later");
      },
      [=](resume_atom) {
        BusyScope busy(*c, self->mailbox().size());
        self->state.resume_due.reset();
        admit_queued(self, env, h);
      },
      [=](release_atom, uint64_t id) {
        BusyScope busy(*c, self->mailbox().size());
        // Unknown: not admitted by this actor (a predecessor's request, failed when it
        // died and left out of the rebuilt ledger), or released already.
        auto it = self->state.admitted.find(id);
        if (it != self->state.admitted.end()) {
          const int64_t pages = it->second;
          self->state.admitted.erase(it);
          publish(self, env);  // the slot before the pages: in_flight never counts more than hold pages
          env.kv_pool->unreserve(pages);
        }
        admit_queued(self, env, h);
      },
      [=](reconcile_atom) {
        BusyScope busy(*c, self->mailbox().size());
        env.kv_pool->claim_reservations();
        rebuild_ledger(self, env);
        admit_queued(self, env, h);
      },
      [=](cancel_atom, uint64_t id) {
        BusyScope busy(*c, self->mailbox().size());
        // The caller's cancel (Runtime::cancel) or shutdown's. The intake is the one writer
        // of a record's `cancelled`: set before the worker hears of it, so whoever sees the
        // request stop sees why.
        const auto rec = env.requests.find(id);
        if (!rec) return;  // it ended already
        rec->cancelled = true;
        // Queued: it leaves the queue and the decoder finishes it. Running: it ends at its
        // next step.
        if (!leave_queue(self, env, h, id)) self->send(h->worker(), cancel_atom::value, id);
      },
  };
}

}  // namespace bs
