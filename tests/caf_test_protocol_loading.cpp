// Loading's protocol (actor_protocol suite; the fixture and doubles are in
// actor_protocol_fixture.h): the controller's plans and profiles, the RAM and SSD
// loaders (tensor-parallel heads included), the SSD writer and its bounded queue.
#define CAF_SUITE actor_protocol
#include <caf/test/dsl.hpp>

#include "actor_protocol_fixture.h"

using namespace bs;
using namespace bs::protocol_test;

CAF_TEST_FIXTURE_SCOPE(actor_protocol_tests, fixture)

// -- 2. controller -------------------------------------------------------------

CAF_TEST(controller_plans_ram_ssd_and_missed_chunks_and_hands_the_plan_to_the_worker) {
  put(&ActorSet::controller, sys.spawn(controller, controller_env(*ctx), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  const auto ram_kv = kv_of(kDocs[0]);
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), ram_kv));
  // The SSD entry in the other 16-bit dtype: the estimate counts each entry's own bytes.
  const auto computed = kv_of(kDocs[1]);
  auto ssd_kv = std::make_shared<ChunkKv>(*computed);
  ssd_kv->dtype = computed->dtype == kernels::TensorType::BF16 ? kernels::TensorType::F16 : kernels::TensorType::BF16;
  ssd_kv->set_fp32(computed->k_fp32(), computed->v_fp32());
  CAF_REQUIRE(ctx->ssd->put(key_of(kDocs[1]), ssd_kv));
  CAF_REQUIRE(!ctx->ram->contains(key_of(kDocs[1])));

  const auto in = intake_output(kDocs);
  const auto r = plan(in);  // one message out: the plan to the worker (it starts the loaders)
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam, kSsd, kMissTier}));
  CAF_CHECK_EQUAL(r.loaded.chunk_loaded, (std::vector<char>{1, 1, 0}));
  CAF_CHECK_EQUAL(r.loaded.prefix_cached, 0);
  CAF_CHECK(r.prefix_block_tier.empty());
  CAF_CHECK_EQUAL(r.cache_capacity(), r.prompt.size() + r.sampling.max_tokens);
  // The controller only looked: the SSD file is closed again, the RAM entry not pinned.
  // Default profiles: loading is far faster than the recompute, the ratio is the floor.
  const auto decision = json::parse(r.decision);
  CAF_CHECK_EQUAL(decision.at("reason").get<std::string>(), "floor");
  CAF_CHECK_EQUAL(r.options.ratio, ctx->config.blend.ratio);
  // Each token's K and V of every layer, in the entry's dtype.
  const int64_t token_elements = 2 * int64_t{cfg().n_layers} * cfg().kv_dim();
  CAF_CHECK_EQUAL(decision.at("inputs").at("bytes_ram").get<int64_t>(),
                  static_cast<int64_t>(r.prompt.chunks[0].size()) * token_elements * ram_kv->elem_bytes());
  CAF_CHECK_EQUAL(decision.at("inputs").at("bytes_ssd").get<int64_t>(),
                  static_cast<int64_t>(r.prompt.chunks[1].size()) * token_elements * 2);
  CAF_CHECK_EQUAL(ram_kv->elem_bytes(), kernels::kv_dtype_bytes(ctx->model->kv_dtype()));
  // The trace has the decision and the tiers by name.
  const auto trace = json::parse(ctx->traces.find(r.id)->json());
  CAF_CHECK_EQUAL(trace.at("chunk_tiers"), json({"ram", "ssd", "miss"}));
  CAF_CHECK_EQUAL(trace.at("controller").at("reason").get<std::string>(), "floor");
  CAF_CHECK_EQUAL(*log, (std::vector<std::string>{"worker:prefill"}));

  // Mode full: nothing is looked up.
  const auto full = plan(intake_output(kDocs, std::nullopt, BlendMode::Full));
  CAF_CHECK_EQUAL(full.chunk_tier, (std::vector<TierId>{kMissTier, kMissTier, kMissTier}));
  CAF_CHECK_EQUAL(full.loaded.chunk_loaded, (std::vector<char>{0, 0, 0}));
  CAF_CHECK(!sched.has_job());
}

CAF_TEST(controller_raises_the_ratio_when_the_ssd_is_the_bottleneck) {
  put(&ActorSet::controller, sys.spawn(controller, controller_env(*ctx), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  CAF_REQUIRE(ctx->ssd->put(key_of(kDocs[1]), kv_of(kDocs[1])));
  const float floor = ctx->config.blend.ratio;

  auto p = profile();
  CAF_CHECK_EQUAL(p.at("ssd_samples").get<int>(), 0);
  CAF_CHECK_EQUAL(p.at("ssd_bytes_per_s").get<double>(), 1.5e9);
  // A very slow SSD: two samples of 1 MB/s; a sample without units or time is ignored.
  for (int i = 0; i < 2; ++i) {
    self->send(h->controller(), profile_atom::value, std::string("ssd"), int64_t{2'000'000}, 2.0);
    expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ssd", 2'000'000, 2.0));
  }
  self->send(h->controller(), profile_atom::value, std::string("ssd"), int64_t{0}, 1.0);
  expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ssd", 0, 1.0));
  p = profile();
  CAF_CHECK_EQUAL(p.at("ssd_samples").get<int>(), 2);
  CAF_CHECK(std::abs(p.at("ssd_bytes_per_s").get<double>() - 1e6) < 1e-3);
  CAF_CHECK_EQUAL(p.at("ram_samples").get<int>(), 0);
  // Samples count by their size: a 1 MB load at 100 MB/s (its time mostly per-layer
  // setup), then a 50 MB one at 1 GB/s, estimate the tier near 1 GB/s — the decayed
  // bytes over the decayed seconds, (0.7 x 1 MB + 50 MB) / (0.7 x 10 ms + 50 ms) — not
  // the per-sample average's 370 MB/s, which would predict the next large load at
  // 2.7x its time.
  for (const auto& [bytes, seconds] : {std::pair<int64_t, double>{1'000'000, 0.01}, {50'000'000, 0.05}}) {
    self->send(h->controller(), profile_atom::value, std::string("ram"), bytes, seconds);
    expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ram", bytes, seconds));
  }
  p = profile();
  CAF_CHECK_EQUAL(p.at("ram_samples").get<int>(), 2);
  const double ram_rate = p.at("ram_bytes_per_s").get<double>();
  CAF_CHECK(std::abs(ram_rate - (0.7 * 1e6 + 50e6) / (0.7 * 0.01 + 0.05)) < 1.0);
  CAF_CHECK_GREATER(ram_rate, 0.85e9);

  // No requested ratio: the load takes longer than the recompute at the floor, so
  // the ratio goes up (here to 1: the load takes longer than a full recompute).
  auto r = plan(intake_output({kDocs[1]}));
  CAF_CHECK_EQUAL(r.chunk_tier, (std::vector<TierId>{kSsd}));
  CAF_CHECK_GREATER(r.options.ratio, floor);
  CAF_CHECK_EQUAL(r.options.ratio, 1.0f);
  auto d = json::parse(r.decision);
  CAF_CHECK_EQUAL(d.at("reason").get<std::string>().rfind("load-bound", 0), 0u);
  CAF_CHECK_EQUAL(d.at("ratio_floor").get<float>(), floor);
  CAF_CHECK(std::abs(d.at("inputs").at("ssd_bytes_per_s").get<double>() - 1e6) < 1e-3);
  CAF_CHECK_GREATER(d.at("est_load_s").get<double>(), d.at("est_compute_at_floor_s").get<double>());

  // A requested ratio is kept.
  auto fixed = plan(intake_output({kDocs[1]}, 0.2f));
  CAF_CHECK_EQUAL(fixed.options.ratio, 0.2f);
  d = json::parse(fixed.decision);
  CAF_CHECK_EQUAL(d.at("reason").get<std::string>(), "requested");

  // The planned recompute (overhead + the rows the filtering in use computes per
  // layer) meets the load time, less the margin, exactly where that lies between
  // floor and 1: a fresh controller whose one SSD sample makes margin x load time
  // the recompute time at ratio 0.5.
  put(&ActorSet::controller, sys.spawn(controller, controller_env(*ctx), h, make_counters("controller")));
  sched.run();  // the spawned actors start
  auto half_in = intake_output({kDocs[1]});
  const int64_t cached = static_cast<int64_t>(half_in.prompt.chunks[0].size());
  const int64_t other = half_in.prompt.size() - cached;
  const int64_t bytes = cached * 2 * int64_t{cfg().n_layers} * cfg().kv_dim() * 4;
  const double per_row_layer = profile().at("compute_s_per_token_layer").get<double>();
  const double overhead = profile().at("overhead_s_per_prompt_token").get<double>() * half_in.prompt.size();
  BlendOptions at_half = half_in.options;
  at_half.ratio = 0.5f;
  const auto rows = planned_rows_per_layer(at_half, cfg().n_layers, other, cached);
  double row_layers = 0;
  for (double x : rows) row_layers += x;
  // Gradual filtering (the default): every cached row through the layers before the
  // first check, fewer after each: more than the ratio's share, less than all.
  CAF_CHECK_GREATER(row_layers, (other + 0.5 * cached) * cfg().n_layers);
  CAF_CHECK_LESS(row_layers, static_cast<double>(other + cached) * cfg().n_layers);
  const double seconds = (overhead + per_row_layer * row_layers) / ControllerState::load_margin;
  self->send(h->controller(), profile_atom::value, std::string("ssd"), bytes, seconds);
  expect((profile_atom, std::string, int64_t, double), from(self).to(h->controller()).with(_, "ssd", bytes, seconds));
  auto half = plan(half_in);
  CAF_CHECK(std::abs(half.options.ratio - 0.5f) < 1e-4f);
  // The trace's prediction: the loads end at est_load; the compute fits in 0.85 of
  // it, so the first token comes just after the last layer's load, and before the
  // load plus all of the compute.
  const auto hd = json::parse(half.decision);
  const double est_load = hd.at("est_load_s").get<double>(), est_ttft = hd.at("est_ttft_s").get<double>();
  CAF_CHECK_GREATER(est_ttft, est_load);
  CAF_CHECK_LESS(est_ttft, est_load + hd.at("est_compute_s").get<double>());
}

// -- 3. loader (RAM) -----------------------------------------------------------

CAF_TEST(ram_loader_streams_layer_by_layer_into_the_target_then_ends_and_reports_its_profile) {
  put(&ActorSet::controller, sys.spawn(controller, controller_env(*ctx), h, make_counters("controller")));
  put_loader(kRam, 0, sys.spawn(loader, loader_env(*ctx), h, kRam, make_counters("loader-ram-0")));
  sched.run();  // the spawned actors start
  const auto kv0 = kv_of(kDocs[0]), kv1 = kv_of(kDocs[1]);
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv0));
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[1]), kv1));

  const auto r = plan(intake_output({kDocs[0], kDocs[1]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam, kRam}));
  const auto ram = loader_of(kRam);
  auto target = make_target(r, {ram.id()});
  self->send(ram, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ram).with(_, _, _));
  // The worker: the loader's n_layers layers in order, by request id, then its end.
  const int n_layers = cfg().n_layers;
  for (int32_t l = 0; l < n_layers; ++l)
    expect((layer_atom, uint64_t, int32_t), from(ram).to(h->worker()).with(_, r.id, l));
  expect((load_end_atom, uint64_t, uint64_t), from(ram).to(h->worker()).with(_, r.id, ram.id()));
  // The controller: the bytes it moved and the time it took.
  const int64_t tokens = static_cast<int64_t>(r.prompt.chunks[0].size() + r.prompt.chunks[1].size());
  const int64_t bytes = 2 * tokens * n_layers * cfg().kv_dim() * 4;
  const auto [atom, source, units, seconds] = extract<profile_atom, std::string, int64_t, double>(h->controller());
  CAF_CHECK_GREATER(seconds, 0.0);
  expect((profile_atom, std::string, int64_t, double), from(ram).to(h->controller()).with(_, "ram", bytes, _));
  CAF_CHECK(!sched.has_job());
  const auto p = profile();
  CAF_CHECK_EQUAL(p.at("ram_samples").get<int>(), 1);
  CAF_CHECK(std::abs(p.at("ram_bytes_per_s").get<double>() - bytes / seconds) < 1e-6 * (bytes / seconds));

  // The target's cache holds each chunk's stored KV at the chunk's offset, as stored.
  for (int l : {0, n_layers - 1}) {
    CAF_CHECK_EQUAL(mismatches(target->cache, *kv0, l, r.prompt.chunk_offset(0)), 0);
    CAF_CHECK_EQUAL(mismatches(target->cache, *kv1, l, r.prompt.chunk_offset(1)), 0);
  }
  // Guard: the comparison sees a difference where there is one.
  CAF_CHECK_GREATER(mismatches(target->cache, *kv0, 0, r.prompt.chunk_offset(1)), 0);
  CAF_CHECK_EQUAL(count_events(*ctx->traces.find(r.id), "loader-ram", "load"), n_layers);
}

CAF_TEST(a_loader_stops_for_a_failed_gate_or_an_entry_that_is_gone) {
  put(&ActorSet::controller, sys.spawn(controller, controller_env(*ctx), h, make_counters("controller")));
  put_loader(kRam, 0, sys.spawn(loader, loader_env(*ctx), h, kRam, make_counters("loader-ram-0")));
  sched.run();  // the spawned actors start
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv_of(kDocs[0])));
  const auto ram = loader_of(kRam);
  const auto r = plan(intake_output({kDocs[0]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam}));

  // The gate failed (a cancel, another loader's failure, a timeout) before the
  // loader ran: it reads no layer, ends its work and reports no profile.
  auto target = make_target(r, {ram.id()});
  target->gate.fail("cancelled");
  self->send(ram, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ram).with(_, _, _));
  disallow((layer_atom, uint64_t, int32_t), from(_).to(h->worker()));
  expect((load_end_atom, uint64_t, uint64_t), from(ram).to(h->worker()).with(_, r.id, ram.id()));
  disallow((profile_atom, std::string, int64_t, double), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(count_events(*ctx->traces.find(r.id), "loader-ram", "load stopped"), 1);

  // The entry was evicted between the plan and the load: a recoverable failure (the
  // worker begins the prefill again with that part computed), then the end.
  target = make_target(r, {ram.id()});
  CAF_REQUIRE(ctx->ram->erase(key_of(kDocs[0])));
  self->send(ram, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ram).with(_, _, _));
  const auto [atom, id, part, why] = extract<load_fail_atom, uint64_t, int32_t, std::string>(h->worker());
  CAF_CHECK_EQUAL(mentions(why, "no longer in the ram tier"), "no longer in the ram tier");
  CAF_CHECK_EQUAL(part, 0);  // the plan's part that failed: the one chunk
  expect((load_fail_atom, uint64_t, int32_t, std::string), from(ram).to(h->worker()).with(_, r.id, 0, why));
  expect((load_end_atom, uint64_t, uint64_t), from(ram).to(h->worker()).with(_, r.id, ram.id()));
  CAF_CHECK(!sched.has_job());
}

// Tensor parallel, 3 ranks of SmolLM2's 3 KV heads (one each): the loader reads each
// layer once, writes rank 0's head into the target (the only cache it is handed) and
// sends each follower's worker that rank's head as a value, then tells each follower
// it is done before it tells the worker. A loader that wrote a follower's memory, or
// sent a rank another rank's heads, fails here.
CAF_TEST(tensor_parallel_a_loader_writes_rank_0s_heads_and_sends_each_follower_its_own_as_values) {
  put(&ActorSet::controller, sys.spawn(controller, controller_env(*ctx), h, make_counters("controller")));
  put_loader(kRam, 0, sys.spawn(loader, loader_env(*ctx), h, kRam, make_counters("loader-ram-0")));
  std::vector<std::shared_ptr<RankInbox>> inbox{std::make_shared<RankInbox>(), std::make_shared<RankInbox>()};
  h->update([&](ActorSet& a) {
    a.rank_workers = {sys.spawn(rank_worker_double, inbox[0]), sys.spawn(rank_worker_double, inbox[1])};
  });
  sched.run();  // the spawned actors start
  const int ranks = 3;
  CAF_REQUIRE_EQUAL(cfg().n_kv_heads, ranks);
  const auto kv0 = kv_of(kDocs[0]), kv1 = kv_of(kDocs[1]);
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[0]), kv0));
  CAF_REQUIRE(ctx->ram->put(key_of(kDocs[1]), kv1));
  const auto r = plan(intake_output({kDocs[0], kDocs[1]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kRam, kRam}));
  const auto ram = loader_of(kRam);
  // Rank 0's target: a cache of its one head.
  auto target = std::make_shared<LoadTarget>();
  target->cache = KvCache(cfg().n_layers, 1, cfg().head_dim, r.cache_capacity(), kv0->dtype);
  target->ranks = ranks;
  target->gate.reset(cfg().n_layers, {ram.id()}, ranks);
  log->clear();
  self->send(ram, load_atom::value, r, target);
  sched.run();

  const int n_layers = cfg().n_layers;
  const int64_t hd = cfg().head_dim;
  // Stored head `head` of layer l of a chunk, K or V, as bytes.
  auto stored = [&](const ChunkKv& kv, int l, int head, bool k) {
    const size_t run = static_cast<size_t>(kv.length() * hd * kv.elem_bytes());
    const auto* at = reinterpret_cast<const char*>(k ? kv.k_layer(l) : kv.v_layer(l)) + head * run;
    return std::vector<char>(at, at + run);
  };
  for (int f = 0; f < 2; ++f) {
    const RankInbox& in = *inbox[static_cast<size_t>(f)];
    CAF_REQUIRE_EQUAL(in.kv.size(), static_cast<size_t>(n_layers));
    for (int l = 0; l < n_layers; ++l) {
      const RankKv& got = in.kv[static_cast<size_t>(l)];
      CAF_CHECK_EQUAL(got.id, r.id);
      CAF_CHECK_EQUAL(got.layer, l);  // in order
      CAF_CHECK_EQUAL(got.loader, ram.id());
      CAF_REQUIRE_EQUAL(got.parts.size(), 2u);
      for (size_t i = 0; i < 2; ++i) {
        const ChunkKv& kv = i == 0 ? *kv0 : *kv1;
        const RankKvPart& part = got.parts[i];
        CAF_CHECK_EQUAL(part.offset, r.prompt.chunk_offset(i));
        CAF_CHECK_EQUAL(part.length, kv.length());
        CAF_CHECK_EQUAL(part.dtype, static_cast<int32_t>(kv.dtype));
        CAF_CHECK(part.k == stored(kv, l, f + 1, true));  // rank f + 1's head, nobody else's
        CAF_CHECK(part.v == stored(kv, l, f + 1, false));
      }
    }
    CAF_CHECK_EQUAL(in.ends, (std::vector<std::pair<uint64_t, uint64_t>>{{r.id, ram.id()}}));
  }
  // Rank 0's cache holds head 0 of each chunk, as stored.
  for (int l : {0, n_layers - 1})
    for (size_t i = 0; i < 2; ++i) {
      const ChunkKv& kv = i == 0 ? *kv0 : *kv1;
      std::vector<char> k(static_cast<size_t>(kv.length() * hd * kv.elem_bytes())), v(k.size());
      target->cache.read_rows_raw(l, 0, r.prompt.chunk_offset(i), kv.length(), k.data(), v.data());
      CAF_CHECK(k == stored(kv, l, 0, true));
      CAF_CHECK(v == stored(kv, l, 0, false));
    }
  // Rank 0's own deliveries: every layer once (the followers' come from their
  // workers), and the copy event of each.
  for (int l = 0; l < n_layers; ++l) {
    CAF_CHECK(!target->gate.delivered(l));  // the followers have not said so
    CAF_CHECK_EQUAL(target->copied.take(l).size(), 1u);
  }
  CAF_CHECK(target->gate.holds(ram.id()));  // done on rank 0 only when the worker hears it
  // The worker heard of rank 0's layers, in order, then of the end.
  std::vector<std::string> worker_log;
  for (const auto& e : *log)
    if (e.rfind("worker:", 0) == 0) worker_log.push_back(e);
  CAF_REQUIRE_EQUAL(worker_log.size(), static_cast<size_t>(n_layers + 1));
  for (int l = 0; l < n_layers; ++l) CAF_CHECK_EQUAL(worker_log[static_cast<size_t>(l)], "worker:layer:" + std::to_string(l));
  CAF_CHECK_EQUAL(worker_log.back(), "worker:loadend");
}

// -- 3b. writer (SSD) ----------------------------------------------------------

CAF_TEST(ssd_writer_stores_in_order_and_its_queue_is_bounded_in_bytes) {
  auto writer_counters = make_counters("ssd-writer");
  put(&ActorSet::ssd_writer, sys.spawn(writer, ssd_writer_env(*ctx), writer_counters));
  sched.run();  // the spawned actors start
  const auto kv0 = kv_of(kDocs[0]), kv1 = kv_of(kDocs[1]), kv2 = kv_of(kDocs[2]);
  const auto b0 = static_cast<int64_t>(kv0->bytes()), b1 = static_cast<int64_t>(kv1->bytes());
  // Room for the first two entries, not the third.
  ctx->config.ssd.write_queue_bytes = b0 + b1;
  CAF_CHECK(enqueue_write(ssd_writer_env(*ctx), h->ssd_writer(), KeyedKv{key_of(kDocs[0]), kv0}));
  CAF_CHECK(enqueue_write(ssd_writer_env(*ctx), h->ssd_writer(), KeyedKv{key_of(kDocs[1]), kv1}));
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), b0 + b1);
  CAF_CHECK(!enqueue_write(ssd_writer_env(*ctx), h->ssd_writer(), KeyedKv{key_of(kDocs[2]), kv2}));  // dropped, counted
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.dropped.load(), 1);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.high_water.load(), b0 + b1);
  // Nothing is written before the writer runs; then both, in order, and the queue is empty.
  CAF_CHECK(!ctx->ssd->contains(key_of(kDocs[0])));
  expect((store_atom, KeyedKv), to(h->ssd_writer()).with(_, _));
  CAF_CHECK(ctx->ssd->contains(key_of(kDocs[0])));
  CAF_CHECK(!ctx->ssd->contains(key_of(kDocs[1])));
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), b1);
  expect((store_atom, KeyedKv), to(h->ssd_writer()).with(_, _));
  CAF_CHECK(ctx->ssd->contains(key_of(kDocs[1])));
  CAF_CHECK(!ctx->ssd->contains(key_of(kDocs[2])));
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), 0);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.written.load(), 2);
  // Room again: the third is taken now. A key already stored is not rewritten.
  CAF_CHECK(enqueue_write(ssd_writer_env(*ctx), h->ssd_writer(), KeyedKv{key_of(kDocs[2]), kv2}));
  CAF_CHECK(enqueue_write(ssd_writer_env(*ctx), h->ssd_writer(), KeyedKv{key_of(kDocs[0]), kv0}));
  const int64_t puts = ctx->ssd->stats().puts;
  CAF_CHECK_EQUAL(ask<bool>(h->ssd_writer(), flush_atom::value), true);  // after every store before it
  CAF_CHECK(ctx->ssd->contains(key_of(kDocs[2])));
  CAF_CHECK_EQUAL(ctx->ssd->stats().puts, puts + 1);
  CAF_CHECK_EQUAL(ctx->ssd_write_queue.bytes.load(), 0);
  CAF_CHECK(ctx->ram->get(key_of(kDocs[2])) == nullptr);  // the writer writes its tier only
  CAF_CHECK_EQUAL(writer_counters->messages.load(), 5);
}

// -- 4. loader (SSD), corrupt file ---------------------------------------------

CAF_TEST(ssd_loader_fails_the_load_on_a_corrupt_layer_and_reports_no_profile) {
  put(&ActorSet::controller, sys.spawn(controller, controller_env(*ctx), h, make_counters("controller")));
  put_loader(kSsd, 0, sys.spawn(loader, loader_env(*ctx), h, kSsd, make_counters("loader-ssd-0")));
  sched.run();  // the spawned actors start
  const ChunkKey key = key_of(kDocs[1]);
  CAF_REQUIRE(ctx->ssd->put(key, kv_of(kDocs[1])));
  const std::string path = ctx->ssd->path_of(key);
  CAF_REQUIRE_EQUAL(path, (fs::path(ctx->ssd->dir()) / (key.hex() + ".bskv")).string());
  // Layout (storage/disk_store.h): a 4096-byte header, then equal 4096-aligned
  // layer spans, K first. Flip a byte inside the K data of layer 3.
  const int64_t m = static_cast<int64_t>(tokens_of(kDocs[1]).size());
  const int64_t layer_bytes = 2 * m * cfg().kv_dim() * 4;
  const int64_t span = (layer_bytes + 4095) / 4096 * 4096;
  const off_t at = static_cast<off_t>(4096 + 3 * span + 100);
  CAF_REQUIRE_LESS(100, m * cfg().kv_dim() * 4);
  CAF_REQUIRE_EQUAL(static_cast<int64_t>(fs::file_size(path)), 4096 + cfg().n_layers * span);
  {
    const int fd = ::open(path.c_str(), O_RDWR);
    CAF_REQUIRE(fd >= 0);
    unsigned char b = 0;
    CAF_REQUIRE_EQUAL(::pread(fd, &b, 1, at), 1);
    b ^= 0x5a;
    CAF_REQUIRE_EQUAL(::pwrite(fd, &b, 1, at), 1);
    ::close(fd);
  }

  const auto r = plan(intake_output({kDocs[1]}));
  CAF_REQUIRE_EQUAL(r.chunk_tier, (std::vector<TierId>{kSsd}));  // the header is intact
  const auto ssd = loader_of(kSsd);
  auto target = make_target(r, {ssd.id()});
  self->send(ssd, load_atom::value, r, target);
  expect((load_atom, RequestPlan, LoadTargetPtr), from(self).to(ssd).with(_, _, _));
  for (int32_t l = 0; l < 3; ++l)
    expect((layer_atom, uint64_t, int32_t), from(ssd).to(h->worker()).with(_, r.id, l));
  const auto [atom, failed, part, why] = extract<load_fail_atom, uint64_t, int32_t, std::string>(h->worker());
  CAF_CHECK_EQUAL(mentions(why, key.hex()), key.hex());
  CAF_CHECK_EQUAL(mentions(why, "layer 3"), "layer 3");
  CAF_CHECK_EQUAL(part, 0);
  expect((load_fail_atom, uint64_t, int32_t, std::string), from(ssd).to(h->worker()).with(_, r.id, 0, why));
  expect((load_end_atom, uint64_t, uint64_t), from(ssd).to(h->worker()).with(_, r.id, ssd.id()));
  disallow((profile_atom, std::string, int64_t, double), from(_).to(h->controller()));
  CAF_CHECK(!sched.has_job());
  CAF_CHECK_EQUAL(profile().at("ssd_samples").get<int>(), 0);
  // The corrupt file is gone; nothing was promoted to RAM.
  CAF_CHECK(!fs::exists(path));
  CAF_CHECK(!ctx->ssd->contains(key));
  CAF_CHECK_EQUAL(ctx->ssd->stats().corrupt, 1);
  CAF_CHECK(!ctx->ram->contains(key));
}

CAF_TEST_FIXTURE_SCOPE_END()
