// The intake's protocol (actor_protocol suite; the fixture and doubles are in
// actor_protocol_fixture.h): validating and planning a request, slots, the queue,
// deadlines, the restart backoff, a restarted intake's ledger, KV page admission.
#define CAF_SUITE actor_protocol
#include <caf/test/dsl.hpp>

#include "actor_protocol_fixture.h"

using namespace bs;
using namespace bs::protocol_test;

CAF_TEST_FIXTURE_SCOPE(actor_protocol_tests, fixture)

// -- 1. intake ----------------------------------------------------------------

CAF_TEST(intake_answers_the_id_and_hands_the_prepared_plan_to_the_controller) {
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  auto rec = new_record({kDocs[0], kDocs[1]});
  const auto a = submit(rec);
  CAF_REQUIRE(a.id);
  CAF_CHECK_EQUAL(*a.id, rec->id);
  CAF_CHECK(!a.error);
  // One message out: (plan, the plan) to the controller.
  CAF_REQUIRE_EQUAL(sched.jobs.size(), 1u);
  const RequestPlan r = planned_by_intake();
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(*log, std::vector<std::string>{"controller:plan"});
  CAF_CHECK_EQUAL(r.id, rec->id);
  // The prompt: prefix + one chunk per document + suffix, keyed.
  CAF_REQUIRE_EQUAL(r.prompt.chunks.size(), 2u);
  CAF_REQUIRE_EQUAL(r.chunk_keys.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    CAF_CHECK_EQUAL(r.prompt.chunks[i], tokens_of(kDocs[i]));
    CAF_CHECK(r.chunk_keys[i] == key_of(kDocs[i]));
  }
  CAF_CHECK(!(r.chunk_keys[0] == r.chunk_keys[1]));
  CAF_CHECK(!r.prompt.prefix.empty());
  CAF_CHECK(!r.prompt.suffix.empty());
  // The prefix's blocks (before the first chunk: whole blocks, then a partial one),
  // chained keys.
  const int64_t P = static_cast<int64_t>(r.prompt.prefix.size()), B = ctx->config.prefix_block_tokens;
  CAF_CHECK_EQUAL(r.prefix_block, B);
  CAF_CHECK_EQUAL(r.prefix_end, P);
  CAF_CHECK_EQUAL(static_cast<int64_t>(r.prefix_block_keys.size()), (P + B - 1) / B);
  CAF_CHECK(r.prefix_block_keys == ctx->engine->prefix_block_keys(r.prompt.prefix, r.prefix_block, P));
  // Options from the config; sampling completed with the template's stops.
  CAF_CHECK(r.options.mode == ctx->config.blend.mode);
  CAF_CHECK_EQUAL(r.options.ratio, ctx->config.blend.ratio);
  CAF_CHECK_EQUAL(r.options.check_layers, ctx->config.blend.check_layers);
  CAF_CHECK(!r.ratio_requested);
  CAF_CHECK_EQUAL(r.sampling.max_tokens, 8);
  CAF_CHECK_EQUAL(r.sampling.stop, ctx->model->chat_template().stop_strings());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(rec->admitted.load());
  CAF_CHECK_EQUAL(count_events(*rec->trace, "intake", "tokenize"), 1);

  // A request's own mode and ratio override the config's.
  auto rec2 = new_record({kDocs[2]}, 0.4f, BlendMode::Reuse);
  const auto a2 = submit(rec2);
  CAF_CHECK_EQUAL(a2.id.value_or(0), rec2->id);
  const RequestPlan r2 = planned_by_intake();
  CAF_CHECK(r2.options.mode == BlendMode::Reuse);
  CAF_CHECK_EQUAL(r2.options.ratio, 0.4f);
  CAF_CHECK(r2.ratio_requested);
  CAF_CHECK_EQUAL(r2.prompt.chunks.size(), 1u);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 2);
}

CAF_TEST(intake_refuses_invalid_requests_with_a_runtime_error_and_sends_nothing) {
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();  // the spawned actors start

  auto empty = new_record({kDocs[0]});
  empty->request.messages.clear();
  auto a = submit(empty);
  check_runtime_error(a, RequestErrc::invalid, "messages must not be empty");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  auto robot = new_record({kDocs[0]});
  robot->request.messages = {{"robot", "beep"}, {"user", kQuestion}};
  a = submit(robot);
  check_runtime_error(a, RequestErrc::invalid, "unknown role 'robot'");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  ctx->config.max_prompt_tokens = 24;
  auto longer = new_record({kDocs[0], kDocs[1]});
  a = submit(longer);
  check_runtime_error(a, RequestErrc::too_long, "at most 24 fit");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());

  // An id without a record (the caller did not register it) is refused too.
  auto reply = self->request(h->intake(), caf::infinite, submit_atom::value, uint64_t{987654});
  expect((submit_atom, uint64_t), from(self).to(h->intake()).with(_, 987654u));
  Answer unknown;
  reply.receive([&](uint64_t id) { unknown.id = id; }, [&](caf::error& e) { unknown.error = std::move(e); });
  check_runtime_error(unknown, RequestErrc::internal, "not known");

  // None of them holds an admission slot.
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_CHECK(log->empty());
}

CAF_TEST(intake_admits_at_most_max_requests_in_flight) {
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 0;  // no queue: refused at once
  auto running = new_record({kDocs[1]});
  CAF_CHECK_EQUAL(submit(running).id.value_or(0), running->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, running->id);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  auto r = new_record({kDocs[0]});
  auto a = submit(r);
  check_runtime_error(a, RequestErrc::overloaded, "too many requests: 1 in flight and 0 waiting");
  disallow((plan_atom, RequestPlan), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  // Once the slot is free (the running request's release), the same request is admitted.
  CAF_CHECK(running->admitted.exchange(false));
  self->send(h->intake(), release_atom::value, running->id);
  expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, running->id));
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  a = submit(r);
  CAF_CHECK_EQUAL(a.id.value_or(0), r->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, r->id);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
}

CAF_TEST(intake_queues_beyond_max_requests_in_order_and_refuses_beyond_the_queue) {
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 2;
  auto running = new_record({kDocs[0]});
  CAF_CHECK_EQUAL(submit(running).id.value_or(0), running->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, running->id);
  CAF_CHECK(running->admitted.load());
  // Two more wait: answered with their ids (prepared, so a bad one would have been
  // refused now), nothing sent on.
  auto q1 = new_record({kDocs[1]});
  auto q2 = new_record({kDocs[2]});
  CAF_CHECK_EQUAL(submit(q1).id.value_or(0), q1->id);
  // With room in the queue, an invalid request is still refused as invalid, not queued.
  auto bad = new_record({kDocs[0]});
  bad->request.sampling.max_tokens = 0;
  check_runtime_error(submit(bad), RequestErrc::invalid, "max_tokens must be >= 1");
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(submit(q2).id.value_or(0), q2->id);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 2);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(!q1->admitted.load());
  // The queue is full: overloaded (before any tokenizing).
  auto over = new_record({kDocs[0]});
  check_runtime_error(submit(over), RequestErrc::overloaded, "1 in flight and 2 waiting");
  CAF_CHECK(!sched.has_job());
  // The running request ends (whoever ends it clears `admitted` and sends the
  // release): the first queued one starts, the second still waits.
  CAF_CHECK(running->admitted.exchange(false));
  self->send(h->intake(), release_atom::value, running->id);
  expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, running->id));
  const RequestPlan started = planned_by_intake();
  CAF_CHECK_EQUAL(started.id, q1->id);
  CAF_CHECK_EQUAL(started.prompt.chunks.size(), 1u);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(q1->admitted.load());
  // A queued request cancelled by id (the intake marks it: it is the one writer of a
  // record's cancel) leaves the queue and goes to the decoder, which finishes it
  // (cancelled); it never held a slot.
  CAF_CHECK(!q2->cancelled.load());
  self->send(h->intake(), cancel_atom::value, q2->id);
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, q2->id));
  expect((finish_atom, uint64_t), from(h->intake()).to(h->decoder()).with(_, q2->id));
  CAF_CHECK(q2->cancelled.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
  CAF_CHECK(!q2->admitted.load());
  CAF_CHECK_EQUAL(count_events(*q2->trace, "intake", "queued"), 1);
  // Cancelling a running request marks it and tells the worker (it stops at its next
  // step), after the mark.
  self->send(h->intake(), cancel_atom::value, q1->id);
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, q1->id));
  CAF_CHECK(q1->cancelled.load());
  expect((cancel_atom, uint64_t), from(h->intake()).to(h->worker()).with(_, q1->id));
  CAF_CHECK(!sched.has_job());
  // An unknown (finished) request: nothing.
  self->send(h->intake(), cancel_atom::value, uint64_t{987654});
  expect((cancel_atom, uint64_t), from(self).to(h->intake()).with(_, uint64_t{987654}));
  CAF_CHECK(!sched.has_job());
  // A slot with nobody waiting: nothing to start. A second release of the same
  // request changes nothing.
  CAF_CHECK(q1->admitted.exchange(false));
  for (int i = 0; i < 2; ++i) {
    self->send(h->intake(), release_atom::value, q1->id);
    expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, q1->id));
    CAF_CHECK(!sched.has_job());
    CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  }
  CAF_CHECK_EQUAL(ctx->kv_pool->reserved_pages(), 0);
  CAF_CHECK_EQUAL(ctx->kv_pool->foreign_reservation_writes(), 0);
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"controller:plan", "controller:plan", "decoder:finish",
                                                  "worker:cancel"}));
}

// limits.max_request_seconds, on the test clock: at the deadline the intake cancels
// a running request (the worker is told; it ends as an error at its next step) and
// finishes a queued one through the decoder (it leaves the queue, its wait traced);
// both are marked expired with the sentence they end with. 10 s later a request that
// has still not ended is failed where it stands (the supervisor is asked to: it runs
// every fail decision); one that ended is left alone.
CAF_TEST(intake_expires_requests_at_max_request_seconds_running_or_queued) {
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();
  ctx->config.max_requests = 1;
  ctx->config.max_queue = 1;
  ctx->config.max_request_seconds = 5;
  auto running = new_record({kDocs[0]});
  CAF_CHECK_EQUAL(submit(running).id.value_or(0), running->id);
  CAF_CHECK_EQUAL(planned_by_intake().id, running->id);
  // Submitted a second after the first (its deadline a second later: the timers are
  // set from the real clock's submit times, the test clock runs them in that order).
  auto queued = new_record({kDocs[1]});
  queued->submitted += std::chrono::seconds(1);
  CAF_CHECK_EQUAL(submit(queued).id.value_or(0), queued->id);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  // Nothing before the deadline.
  advance_time(std::chrono::seconds(4));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK(!running->expired.load());
  advance_time(std::chrono::seconds(1));
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, running->id, 0));
  expect((cancel_atom, uint64_t), from(h->intake()).to(h->worker()).with(_, running->id));
  CAF_CHECK(running->expired.load());
  CAF_CHECK(running->cancelled.load());
  CAF_CHECK_EQUAL(running->expiry_error, "the request ran longer than limits.max_request_seconds (5 s)");
  CAF_CHECK(!sched.has_job());
  CAF_CHECK(!queued->expired.load());
  advance_time(std::chrono::seconds(1));
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, queued->id, 0));
  expect((finish_atom, uint64_t), from(h->intake()).to(h->decoder()).with(_, queued->id));
  expect((cancel_atom, uint64_t), from(h->intake()).to(h->worker()).with(_, queued->id));
  CAF_CHECK(queued->expired.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
  CAF_CHECK_EQUAL(count_events(*queued->trace, "intake", "queued"), 1);
  // The queued one ended (the decoder finished it); the running one did not stop.
  queued->finished = true;
  ctx->requests.erase(queued->id);
  advance_time(std::chrono::seconds(9));  // the running one's stage 0 + 10 s
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, running->id, 1));
  expect((fail_atom, uint64_t, std::string), from(h->intake()).to(h->supervisor()).with(
      _, running->id, "the request ran longer than limits.max_request_seconds (5 s) and had not stopped 10 s later"));
  advance_time(std::chrono::seconds(1));
  expect((expire_atom, uint64_t, int32_t), from(h->intake()).to(h->intake()).with(_, queued->id, 1));
  CAF_CHECK(!sched.has_job());  // the queued one had ended: nothing is failed
  ctx->config.max_request_seconds = 0;
}

// After a role's repeated death the supervisor pauses admission (admit_after_ns): a
// request that arrives meanwhile is queued, and starts when the pause ends (the
// intake's resume on the test clock), not before.
CAF_TEST(intake_holds_admission_while_a_restart_backoff_lasts) {
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();
  ctx->config.max_requests = 4;
  ctx->config.max_queue = 4;
  const auto until = std::chrono::steady_clock::now() + std::chrono::hours(1);
  ctx->admit_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
  auto r = new_record({kDocs[0]});
  CAF_CHECK_EQUAL(submit(r).id.value_or(0), r->id);
  CAF_CHECK(!r->admitted.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK(!sched.has_job());
  // The pause ends (the supervisor's time passes); the resume message admits it.
  ctx->admit_after_ns = 0;
  advance_time(std::chrono::hours(1));
  expect((resume_atom), from(h->intake()).to(h->intake()));
  CAF_CHECK_EQUAL(planned_by_intake().id, r->id);
  CAF_CHECK(r->admitted.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
}

// The slots and pages are the intake's state. One that dies takes its ledger with
// it; its successor rebuilds the ledger from the records still admitted (when it
// starts, and again on the supervisor's reconcile), so a release the dead one never
// got cannot leak a slot or pages, and a release of a request it does not hold
// changes nothing. Nobody but the intake wrote the pool's reservations.
CAF_TEST(a_restarted_intake_rebuilds_its_slots_and_pages_from_the_records) {
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();
  ctx->config.max_requests = 2;
  ctx->config.max_queue = 2;
  auto a = new_record({kDocs[0]});
  auto b = new_record({kDocs[1]});
  CAF_CHECK_EQUAL(submit(a).id.value_or(0), a->id);
  planned_by_intake();
  CAF_CHECK_EQUAL(submit(b).id.value_or(0), b->id);
  planned_by_intake();
  auto& pool = *ctx->kv_pool;
  const int64_t pa = a->kv_pages.load(), pb = b->kv_pages.load();
  CAF_REQUIRE(pa > 0 && pb > 0);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 2);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa + pb);
  // The intake dies. Meanwhile b ends: its release goes to the dead actor and is lost.
  caf::actor dead = caf::actor_cast<caf::actor>(h->intake());
  anon_send_exit(dead, caf::exit_reason::kill);
  sched.run();
  CAF_CHECK(b->admitted.exchange(false));
  anon_send(h->intake(), release_atom::value, b->id);
  sched.run();
  ctx->requests.erase(b->id);
  // The new intake: its ledger holds a alone.
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa);
  // A late release of b (it never held a slot here) and the reconcile change nothing.
  self->send(h->intake(), release_atom::value, b->id);
  expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, b->id));
  self->send(h->intake(), reconcile_atom::value);
  expect((reconcile_atom), from(self).to(h->intake()));
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa);
  // There is room for one more: admitted by the new intake, counted beside a.
  auto c = new_record({kDocs[2]});
  CAF_CHECK_EQUAL(submit(c).id.value_or(0), c->id);
  planned_by_intake();
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 2);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pa + c->kv_pages.load());
  // a and c end: everything is back.
  for (const auto& r : {a, c}) {
    CAF_CHECK(r->admitted.exchange(false));
    self->send(h->intake(), release_atom::value, r->id);
    expect((release_atom, uint64_t), from(self).to(h->intake()).with(_, r->id));
  }
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_CHECK_EQUAL(pool.reserved_pages(), 0);
  CAF_CHECK_EQUAL(pool.foreign_reservation_writes(), 0);
}

// Admission counts KV cache pages too: with the pool's pages promised to running
// requests, a request waits in the queue though slots are free, and starts (its
// pages promised) once a release finds them.
CAF_TEST(intake_admits_only_while_the_requests_kv_pages_fit) {
  const auto& mc = cfg();
  // Before the spawn: the actor is given the pool.
  ctx->kv_pool = KvPagePool::make(*ctx->backend, mc.n_layers, mc.n_kv_heads, mc.head_dim, 8);  // 512 positions
  put(&ActorSet::intake, sys.spawn(intake, intake_env(*ctx), h, make_counters("intake")));
  sched.run();  // the spawned actors start
  ctx->config.max_requests = 8;
  ctx->config.max_queue = 2;
  auto& pool = *ctx->kv_pool;
  const int64_t others = pool.total_pages() - 1;
  CAF_REQUIRE(pool.try_reserve(others));  // running requests hold all but one page
  auto r = new_record({kDocs[0]});
  r->request.sampling.max_tokens = 100;  // a document, a question and 100 tokens: more than one page
  CAF_CHECK_EQUAL(submit(r).id.value_or(0), r->id);
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(ctx->queued.load(), 1);
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 0);
  CAF_CHECK(!r->admitted.load());
  CAF_CHECK_EQUAL(pool.reserved_pages(), others);
  // The running requests end (their pages go back with their slots): it starts. (They
  // held their pages outside the intake's ledger here, so the release names a request
  // it does not know: that changes no count, and the queue still gets its try.)
  pool.unreserve(others);
  self->send(h->intake(), release_atom::value, uint64_t{0});
  expect((release_atom, uint64_t), from(self).to(h->intake()));
  const RequestPlan started = planned_by_intake();
  CAF_CHECK_EQUAL(started.id, r->id);
  const int64_t pages = pool.pages_for(started.cache_capacity());
  CAF_CHECK(pages > 1);
  CAF_CHECK_EQUAL(r->kv_pages.load(), pages);
  CAF_CHECK_EQUAL(pool.reserved_pages(), pages);
  CAF_CHECK(r->admitted.load());
  CAF_CHECK_EQUAL(ctx->queued.load(), 0);
  // A request larger than the whole cache is refused as too long, never queued.
  auto huge = new_record({kDocs[0]});
  huge->request.sampling.max_tokens = 4096;
  check_runtime_error(submit(huge), RequestErrc::too_long, "KV cache pages");
  pool.unreserve(pages);
}

CAF_TEST_FIXTURE_SCOPE_END()
