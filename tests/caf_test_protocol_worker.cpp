// The compute side's protocol (actor_protocol suite; the fixture and doubles are in
// actor_protocol_fixture.h): the layer gate, the layer worker (loads, prefill,
// decode batches, cancels), write-back and documents, the decoder's ends.
#define CAF_SUITE actor_protocol
#include <caf/test/dsl.hpp>

#include "actor_protocol_fixture.h"

using namespace bs;
using namespace bs::protocol_test;

CAF_TEST_FIXTURE_SCOPE(actor_protocol_tests, fixture)

// -- 5. worker ------------------------------------------------------------------

CAF_TEST(a_layer_gate_counts_each_loaders_layers_and_ends_and_keeps_the_first_failure) {
  LayerGate gate;
  const uint64_t loader_a = 101, loader_b = 102;
  gate.reset(4, {loader_a, loader_b});
  CAF_CHECK_EQUAL(gate.loaders(), 2);
  CAF_CHECK(gate.holds(loader_a) && gate.holds(loader_b));
  // Layer 0 is there once both loaders delivered it; each wait is bounded.
  CAF_CHECK(!gate.wait_for(0, 10ms));
  gate.arrive(0);
  CAF_CHECK(!gate.delivered(0));
  auto wait0 = std::async(std::launch::async, [&gate] { return gate.wait_for(0, 10s); });
  CAF_CHECK(wait_on(wait0, 100ms) == Waited::blocked);
  gate.arrive(0);
  CAF_REQUIRE(wait_on(wait0, 10s) == Waited::ready);
  CAF_CHECK(wait0.get());
  CAF_CHECK(gate.delivered(0));
  CAF_CHECK(!gate.delivered(1));  // later layers still wait
  // Loader ends, per loader and idempotent: the wait for the loaders ends with the last.
  gate.loader_done(loader_a);
  gate.loader_done(loader_a);
  CAF_CHECK(!gate.holds(loader_a) && gate.holds(loader_b));
  CAF_CHECK(!gate.loaders_done());
  auto done = std::async(std::launch::async, [&gate] { return gate.wait_loaders_done_for(10s); });
  CAF_CHECK(wait_on(done, 100ms) == Waited::blocked);
  gate.loader_done(loader_b);
  CAF_REQUIRE(wait_on(done, 10s) == Waited::ready);
  CAF_CHECK(done.get());
  CAF_CHECK(gate.loaders_done());
  // A stored entry's failure is recoverable; every wait after it throws; the first wins.
  auto wait1 = std::async(std::launch::async, [&gate] { return gate.wait_for(1, 10s); });
  CAF_CHECK(wait_on(wait1, 100ms) == Waited::blocked);
  gate.fail("chunk 0123 layer 1 failed its read or checksum", true);
  gate.fail("later");
  CAF_REQUIRE(wait_on(wait1, 10s) == Waited::ready);
  bool recoverable = false;
  std::string thrown;
  try {
    wait1.get();
  } catch (const LayerGate::LoadFailed& e) {
    thrown = e.what();
    recoverable = e.recoverable;
  }
  CAF_CHECK_EQUAL(thrown, "chunk 0123 layer 1 failed its read or checksum");
  CAF_CHECK(recoverable);
  std::string why;
  CAF_CHECK(gate.failure(why, recoverable));
  CAF_CHECK_EQUAL(why, thrown);
}

CAF_TEST(worker_publishes_the_load_target_sends_each_tier_to_its_least_busy_loader_and_stops_a_cancelled_prefill) {
  put(&ActorSet::worker, sys.spawn(layer_worker, worker_env(*ctx), h, make_counters("layer-worker")));
  sched.run();  // the spawned actors start
  // The compute thread is held, so the prefill's first step job waits in its queue.
  std::promise<void> release = hold_compute();
  const int64_t jobs_before = ctx->compute->jobs_done();

  // A: one chunk from RAM, one from the SSD.
  auto a = intake_output({kDocs[0], kDocs[1]});
  a.chunk_tier = {kRam, kSsd};
  a.loaded.chunk_loaded = {1, 1};
  self->send(h->worker(), prefill_atom::value, a);
  expect((prefill_atom, RequestPlan), from(self).to(h->worker()).with(_, _));
  // Each loader is handed the target with the plan (the worker keeps it: no table).
  const auto [load_a, plan_a, target] = extract<load_atom, RequestPlan, LoadTargetPtr>(loader_of(kRam, 0));
  expect((load_atom, RequestPlan, LoadTargetPtr), from(h->worker()).to(loader_of(kRam, 0)).with(_, _, target));
  expect((load_atom, RequestPlan, LoadTargetPtr), from(h->worker()).to(loader_of(kSsd, 0)).with(_, _, target));
  CAF_REQUIRE(target != nullptr);
  CAF_CHECK_EQUAL(plan_a.id, a.id);
  CAF_CHECK_EQUAL(target->gate.loaders(), 2);
  CAF_CHECK(target->gate.holds(loader_of(kRam, 0).id()) && target->gate.holds(loader_of(kSsd, 0).id()));
  CAF_CHECK_EQUAL(target->cache.capacity, a.cache_capacity());
  CAF_CHECK_EQUAL(ctx->compute->queued(), 1);  // its first step job

  // B, RAM only, while A's loads run: the other RAM loader takes it.
  auto b = intake_output({kDocs[2]});
  b.chunk_tier = {kRam};
  b.loaded.chunk_loaded = {1};
  self->send(h->worker(), prefill_atom::value, b);
  expect((prefill_atom, RequestPlan), from(self).to(h->worker()).with(_, _));
  const auto [load_b, plan_b, b_target] = extract<load_atom, RequestPlan, LoadTargetPtr>(loader_of(kRam, 1));
  expect((load_atom, RequestPlan, LoadTargetPtr), from(h->worker()).to(loader_of(kRam, 1)).with(_, _, b_target));
  CAF_REQUIRE(b_target != nullptr && b_target != target);
  CAF_CHECK(!sched.has_job());

  // The loaders' messages reach A's gate by request id.
  for (const auto& l : {loader_of(kRam, 0), loader_of(kSsd, 0)}) {
    self->send(h->worker(), layer_atom::value, a.id, int32_t{0});
    expect((layer_atom, uint64_t, int32_t), from(self).to(h->worker()).with(_, a.id, 0));
    (void)l;
  }
  CAF_CHECK(target->gate.delivered(0));
  CAF_CHECK(!target->gate.delivered(1));

  // A is cancelled: its gate fails at once (its loaders stop at their next layer).
  self->send(h->worker(), cancel_atom::value, a.id);
  expect((cancel_atom, uint64_t), from(self).to(h->worker()).with(_, a.id));
  std::string why;
  bool recoverable = true;
  CAF_CHECK(target->gate.failure(why, recoverable));
  CAF_CHECK_EQUAL(why, "cancelled");
  CAF_CHECK(!recoverable);

  // The compute thread goes on: A's job sees the cancel at its first layer. The
  // worker runs one prefill job at a time: B's first job is queued once A's came
  // back, and parks (its layer 0 is not there). The prefill of A ends once its
  // loaders stopped: then the decoder gets A's outcome, an error, and the target is gone.
  release.set_value();
  wait_compute(jobs_before + 2);  // the held job and A's
  expect((stepped_atom, uint64_t, PrefillWorkPtr), to(h->worker()).with(_, a.id, _));
  wait_compute(jobs_before + 3);  // B's
  expect((stepped_atom, uint64_t, PrefillWorkPtr), to(h->worker()).with(_, b.id, _));
  CAF_CHECK_GREATER(target.use_count(), 1);  // the worker keeps it: its loaders have not stopped
  for (const auto& l : {loader_of(kRam, 0), loader_of(kSsd, 0)}) {
    self->send(h->worker(), load_end_atom::value, a.id, l.id());
    expect((load_end_atom, uint64_t, uint64_t), from(self).to(h->worker()).with(_, a.id, l.id()));
  }
  sched.run();  // the worker concludes A
  CAF_CHECK_EQUAL(target.use_count(), 1);  // the worker dropped it (only this test holds it)
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"ram_loader0:load", "ssd_loader0:load", "ram_loader1:load",
                                                  "decoder:start"}));
  // B still waits for its RAM layers: its target stays, until the request ends.
  CAF_CHECK_GREATER(b_target.use_count(), 1);
  CAF_CHECK(!b_target->gate.failed());
  self->send(h->worker(), end_atom::value, b.id);
  sched.run();
  CAF_CHECK(b_target->gate.failed());
  // Its loader stops at the failed gate: the worker concludes B (without it, B would
  // wait limits.load_timeout for its loader in real time) and the target goes.
  self->send(h->worker(), load_end_atom::value, b.id, loader_of(kRam, 1).id());
  sched.run();
  CAF_CHECK_EQUAL(b_target.use_count(), 1);
  CAF_CHECK_EQUAL(log->size(), 5u);
  CAF_CHECK_EQUAL(log->back(), "decoder:start");  // B's outcome, an error
}

CAF_TEST(worker_prefills_then_batches_decode_steps_and_a_request_that_fails_fails_alone) {
  put(&ActorSet::worker, sys.spawn(layer_worker, worker_env(*ctx), h, make_counters("layer-worker")));
  put(&ActorSet::decoder, sys.spawn(decoder_double, log));
  sched.run();  // the spawned actors start
  const int64_t vocab = cfg().vocab;
  ctx->config.write_back = false;
  // Two requests without stored KV (mode full): one with room for 4 more tokens,
  // one whose cache is full after its prompt.
  auto healthy = intake_output({kDocs[0]}, std::nullopt, BlendMode::Full);
  healthy.sampling.max_tokens = 4;
  auto full = intake_output({kDocs[1]}, std::nullopt, BlendMode::Full);
  full.sampling.max_tokens = 0;
  std::vector<PrefillOutcome> outcomes;
  for (const auto& plan : {healthy, full}) {
    const int64_t before = ctx->compute->jobs_done();
    self->send(h->worker(), prefill_atom::value, plan);
    expect((prefill_atom, RequestPlan), from(self).to(h->worker()).with(_, _));
    wait_compute(before + 1);
    expect((stepped_atom, uint64_t, PrefillWorkPtr), to(h->worker()).with(_, plan.id, _));
    const auto [atom, out] = extract<start_atom, PrefillOutcome>(h->decoder());
    expect((start_atom, PrefillOutcome), to(h->decoder()).with(_, _));
    CAF_CHECK(out.error.empty());
    CAF_CHECK_EQUAL(out.plan.id, plan.id);
    CAF_CHECK_EQUAL(out.logits.size(), static_cast<size_t>(vocab));
    outcomes.push_back(out);
  }

  // The reference: the same prompt and token through the transformer alone.
  const int32_t token = 42;
  const auto& tf = *ctx->tf;
  KvCache alone = tf.make_cache(healthy.prompt.size() + 1);
  tf.forward(healthy.prompt.concatenated(), alone);
  const auto want = tf.forward(std::span<const int32_t>(&token, 1), alone);

  // The compute thread is busy, so both steps wait in the batcher for one job.
  std::promise<void> release = hold_compute();
  for (const auto& plan : {healthy, full}) {
    self->send(h->worker(), decode_atom::value, plan.id, DecodeAsk{token, {}});
    expect((decode_atom, uint64_t, DecodeAsk), from(self).to(h->worker()).with(_, plan.id, _));
  }
  // Both wait in the worker's batcher (its own state): one drain job for both.
  CAF_CHECK_EQUAL(ctx->compute->queued(), 1);
  const int64_t done_before = ctx->compute->jobs_done();
  release.set_value();
  wait_compute(done_before + 2);

  // One batched step was tried; the full cache made it throw, so each ran alone:
  // the healthy request got its one-token logits, the full one its error.
  CAF_CHECK_EQUAL(ctx->decode_steps.load(), 1);
  CAF_CHECK_EQUAL(ctx->decode_tokens.load(), 2);
  const auto [a1, id1, step1] = extract<logits_atom, uint64_t, DecodeStep>(h->decoder());
  expect((logits_atom, uint64_t, DecodeStep), to(h->decoder()).with(_, healthy.id, _));
  const auto [a2, id2, step2] = extract<logits_atom, uint64_t, DecodeStep>(h->decoder());
  expect((logits_atom, uint64_t, DecodeStep), to(h->decoder()).with(_, full.id, _));
  CAF_CHECK(step1.error.empty());
  CAF_CHECK_EQUAL(step1.batch, 2);
  CAF_REQUIRE_EQUAL(step1.logits.size(), static_cast<size_t>(vocab));
  float diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(step1.logits[i] - want[i]));
  CAF_CHECK_LESS(diff, 2e-2f);  // the engine's full prefill and the plain forward round alike, not bit for bit
  CAF_CHECK(step2.logits.empty());
  CAF_CHECK_EQUAL(mentions(step2.error, "capacity"), "capacity");
  // The prefills' compute profiles went to the controller.
  sched.run();
  CAF_CHECK_EQUAL(std::count(log->begin(), log->end(), "controller:profile:compute"), 2);
  CAF_CHECK(!sched.has_job());

  // A request that ended: its slot is gone, a late step is answered with an error.
  self->send(h->worker(), end_atom::value, full.id);
  expect((end_atom, uint64_t), from(self).to(h->worker()).with(_, full.id));
  self->send(h->worker(), decode_atom::value, full.id, DecodeAsk{token, {}});
  expect((decode_atom, uint64_t, DecodeAsk), from(self).to(h->worker()).with(_, full.id, _));
  const auto [a3, id3, step3] = extract<logits_atom, uint64_t, DecodeStep>(h->decoder());
  CAF_CHECK_EQUAL(mentions(step3.error, "no cache"), "no cache");
  expect((logits_atom, uint64_t, DecodeStep), from(h->worker()).to(h->decoder()).with(_, full.id, _));
}

// -- 7. write-back --------------------------------------------------------------

CAF_TEST(write_back_stores_computed_chunks_in_ram_and_through_the_ssd_writer) {
  put(&ActorSet::write_back, sys.spawn(write_back, write_back_env(*ctx), h, make_counters("write-back")));
  sched.run();  // the spawned actors start
  const ChunkKey key = key_of(kDocs[2]);
  const auto kv = kv_of(kDocs[2]);
  self->send(h->write_back(), kv_ready_atom::value, KeyedKv{key, kv});
  expect((kv_ready_atom, KeyedKv), from(self).to(h->write_back()).with(_, _));
  CAF_CHECK(ctx->ram->get(key) == kv);
  CAF_REQUIRE_EQUAL(ready_jobs(), std::vector<caf::resumable*>{job_of(h->ssd_writer())});
  const auto [store, forwarded] = extract<store_atom, KeyedKv>(h->ssd_writer());
  CAF_CHECK(forwarded.key == key);
  CAF_CHECK(forwarded.kv == kv);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), static_cast<int64_t>(kv->bytes()));  // counted while queued
  expect((store_atom, KeyedKv), to(h->ssd_writer()).with(_, _));
  CAF_CHECK(!ctx->ssd->contains(key));  // written by the SSD writer, not here
  // flush: delegated to the SSD writer, whose answer comes after its stores.
  CAF_CHECK_EQUAL(ask<bool>(h->write_back(), flush_atom::value), true);
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"ssd_writer:store", "ssd_writer:flush"}));
}

// A document is written by the write-back actor at once (not queued through the SSD
// writer: its caller waits for the answer): the answer names the tiers that hold it
// and the pasted-passage index learns its tokens; erase removes it from every tier.
CAF_TEST(write_back_writes_and_erases_documents_at_once_and_answers_where_they_are) {
  ctx->pasted = std::make_unique<PastedChunkIndex>();  // before the spawn: the actor is given the index
  put(&ActorSet::write_back, sys.spawn(write_back, write_back_env(*ctx), h, make_counters("write-back")));
  sched.run();  // the spawned actors start
  const ChunkKey key = key_of(kDocs[1]);
  const auto kv = kv_of(kDocs[1]);
  CAF_REQUIRE(!ctx->tiered->contains(key));
  const auto written =
      ask<DocumentWritten>(h->write_back(), doc_write_atom::value, DocumentWrite{key, kv, kv->tokens, false, false});
  CAF_CHECK(ctx->ram->get(key) == kv);
  CAF_CHECK(ctx->ssd->contains(key));  // written here, not queued
  CAF_CHECK_EQUAL(written.tiers, (std::vector<std::string>{"ram", "ssd"}));
  CAF_CHECK(!written.on_storage_node);
  CAF_CHECK(log->empty());  // no writer was asked
  CAF_CHECK_EQUAL(ctx->pasted->size(), 1u);
  // Stored already: nothing is written again, the answer still names the tiers.
  const auto again = ask<DocumentWritten>(h->write_back(), doc_write_atom::value,
                                          DocumentWrite{key, nullptr, kv->tokens, true, false});
  CAF_CHECK_EQUAL(again.tiers, (std::vector<std::string>{"ram", "ssd"}));
  CAF_CHECK_EQUAL(ask<bool>(h->write_back(), doc_erase_atom::value, key), true);
  CAF_CHECK(!ctx->tiered->contains(key));
  CAF_CHECK_EQUAL(ask<bool>(h->write_back(), doc_erase_atom::value, key), false);  // gone
}

// -- 8. decoder ------------------------------------------------------------------

CAF_TEST(decoder_ends_a_running_request_frees_its_cache_and_slot_and_finishes_a_queued_one_as_cancelled) {
  put(&ActorSet::decoder, sys.spawn(decoder, decoder_env(*ctx), h, make_counters("decoder")));
  sched.run();  // the spawned actors start
  auto results = std::make_shared<std::vector<RequestResult>>();
  const int64_t vocab = cfg().vocab;

  // A running request (it holds a slot) whose first token ends it: the trace to the
  // inspector, its cache freed in the worker, the slot back to the intake, on_done.
  auto running = intake_output({kDocs[0], kDocs[1]});
  auto rec = ctx->requests.find(running.id);
  rec->admitted = true;
  rec->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  ctx->in_flight = 1;
  running.sampling.stop = ctx->model->chat_template().stop_strings();
  running.chunk_tier = {kRam, kMissTier};
  PrefillOutcome out{running, "", std::vector<float>(static_cast<size_t>(vocab), 0.0f), 40, 0, 4, false};
  out.logits[static_cast<size_t>(ctx->model->tokenizer().eos_id())] = 1.0f;
  self->send(h->decoder(), start_atom::value, out);
  expect((start_atom, PrefillOutcome), from(self).to(h->decoder()).with(_, _));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  expect((end_atom, uint64_t), from(h->decoder()).to(h->worker()).with(_, running.id));
  expect((release_atom, uint64_t), from(h->decoder()).to(h->intake()).with(_, running.id));
  CAF_CHECK(!sched.has_job());
  // The slot and pages are the intake's to give back: the decoder only told it.
  CAF_CHECK_EQUAL(ctx->in_flight.load(), 1);
  CAF_CHECK(!rec->admitted.load());
  CAF_REQUIRE_EQUAL(results->size(), 1u);
  const auto& r = results->back();
  CAF_CHECK_EQUAL(r.finish_reason, "stop");
  CAF_CHECK_EQUAL(r.chunks, 2);
  CAF_CHECK_EQUAL(r.chunks_from("ram"), 1);
  CAF_CHECK_EQUAL(r.chunks_missed, 1);
  CAF_CHECK_EQUAL(r.cached_tokens, 40);
  CAF_CHECK_EQUAL(r.recomputed_tokens, 4);
  CAF_CHECK(ctx->requests.find(running.id) == nullptr);  // the record is gone

  // A request cancelled in the queue never held a slot: finished as cancelled, no release.
  auto queued = new_record({kDocs[1]});
  queued->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  self->send(h->decoder(), finish_atom::value, queued->id);
  expect((finish_atom, uint64_t), from(self).to(h->decoder()).with(_, queued->id));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  CAF_CHECK(!sched.has_job());
  CAF_REQUIRE_EQUAL(results->size(), 2u);
  CAF_CHECK_EQUAL(results->back().finish_reason, "cancelled");
  CAF_CHECK(results->back().tokens.empty());

  // A failed prefill: the error is the result; the slot and the cache go.
  auto failing = intake_output({kDocs[2]});
  ctx->requests.find(failing.id)->admitted = true;
  ctx->requests.find(failing.id)->callbacks.on_done = [results](const RequestResult& r) { results->push_back(r); };
  self->send(h->decoder(), start_atom::value, PrefillOutcome{failing, "loading the stored KV failed: boom", {}, 0, 0, 0, false});
  expect((start_atom, PrefillOutcome), from(self).to(h->decoder()).with(_, _));
  expect((trace_atom, std::string), from(h->decoder()).to(h->inspector()).with(_, _));
  expect((end_atom, uint64_t), from(h->decoder()).to(h->worker()).with(_, failing.id));
  expect((release_atom, uint64_t), from(h->decoder()).to(h->intake()).with(_, failing.id));
  CAF_REQUIRE_EQUAL(results->size(), 3u);
  CAF_CHECK_EQUAL(results->back().finish_reason, "error");
  CAF_CHECK_EQUAL(results->back().error, "loading the stored KV failed: boom");
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"inspector:trace", "worker:end", "intake:release", "inspector:trace",
                                                  "inspector:trace", "worker:end", "intake:release"}));
}

CAF_TEST_FIXTURE_SCOPE_END()
