// The actors' message protocols, one actor at a time, under CAF's deterministic
// test coordinator (caf/test/dsl.hpp): every actor is a plain scheduled actor, so
// nothing runs until the test lets it (`expect`, `allow`, `sched.run()`), and the
// messages an actor sends can be checked one by one, in order, before anyone
// handles them. The actors under test are the real ones (actors/runtime/*.cpp) over a
// RuntimeContext on the real model; the actors around them are test doubles that
// only log what they receive. Requests travel as values (RequestPlan,
// PrefillOutcome, ids); the worker's prefills run on the compute thread, which a
// test holds or waits for before it lets the actors go on. The prefill's numbers
// are covered by tests/test_blend_runtime.cpp.
// The tests are in four files of one binary (one suite, actor_protocol): this one
// (plans as values, the inspector; it brings CAF's test main),
// caf_test_protocol_intake.cpp, caf_test_protocol_loading.cpp (controller, loaders,
// the SSD writer) and caf_test_protocol_worker.cpp (the layer worker and its gate,
// write-back, the decoder); what they share is actor_protocol_fixture.h.
#define CAF_SUITE actor_protocol
#include <caf/test/dsl.hpp>
#include <caf/test/unit_test_impl.hpp>

#include "actor_protocol_fixture.h"

using namespace bs;
using namespace bs::protocol_test;

// Loading the model and computing chunk KV can be slow on a busy 2-core machine: allow
// more than CAF's default 30 s per test (`-r` on the command line still wins).
[[maybe_unused]] const bool longer_watchdog = [] {
  caf::test::engine::max_runtime(300);
  return true;
}();

CAF_TEST_FIXTURE_SCOPE(actor_protocol_tests, fixture)

// -- 0. plans are values --------------------------------------------------------

CAF_TEST(a_plan_and_an_outcome_survive_serialization_and_are_registered_by_name) {
  auto r = intake_output({kDocs[0], kDocs[1]}, 0.3f, BlendMode::Blend);
  r.chunk_tier = {kRam, kMissTier};
  r.prefix_block = 16;
  r.prefix_end = 27;  // a whole block and a partial one of 11 tokens
  r.prefix_block_keys = {ChunkKey{1, 2}, ChunkKey{3, 4}};
  r.prefix_block_tier = {kSsd, kRam};
  r.loaded.prefix_cached = 32;
  r.loaded.chunk_loaded = {1, 0};
  r.options.schedule = {0.5f, 0.25f};
  r.options.sink_tokens = 3;
  r.options.selection = Selection::Impact;  // not the default: it must travel
  r.options.query_first_from_layer = 4;
  r.sampling.stop = {"</s>", "\n\n"};
  r.sampling.seed = 77;
  r.decision = R"({"ratio":0.3})";
  PrefillOutcome out{r, "", {1.5f, -2.0f}, 120, 32, 12, true};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  CAF_REQUIRE(!sink(out));
  PrefillOutcome back;
  caf::binary_deserializer source{sys, buf};
  CAF_REQUIRE(!source(back));
  const RequestPlan& p = back.plan;
  CAF_CHECK_EQUAL(p.id, r.id);
  CAF_CHECK_EQUAL(p.prompt.prefix, r.prompt.prefix);
  CAF_CHECK_EQUAL(p.prompt.chunks, r.prompt.chunks);
  CAF_CHECK_EQUAL(p.prompt.suffix, r.prompt.suffix);
  CAF_CHECK_EQUAL(p.prefix_block, 16);
  CAF_CHECK_EQUAL(p.prefix_end, 27);
  CAF_CHECK_EQUAL(p.block_length(1), 11);
  CAF_CHECK_EQUAL(p.blocks_tokens(2), 27);
  CAF_CHECK(p.prefix_block_keys == r.prefix_block_keys);
  CAF_CHECK(p.chunk_keys == r.chunk_keys);
  CAF_CHECK(p.options.mode == BlendMode::Blend);
  CAF_CHECK_EQUAL(p.options.ratio, 0.3f);
  CAF_CHECK_EQUAL(p.options.check_layers, r.options.check_layers);
  CAF_CHECK_EQUAL(p.options.schedule, r.options.schedule);
  CAF_CHECK_EQUAL(p.options.sink_tokens, 3);
  CAF_CHECK(p.options.selection == Selection::Impact);
  CAF_CHECK_EQUAL(p.options.query_first_from_layer, 4);
  CAF_CHECK(p.options.deviation == r.options.deviation && p.options.quota == r.options.quota &&
            p.options.filtering == r.options.filtering);
  CAF_CHECK(p.ratio_requested);
  CAF_CHECK_EQUAL(p.sampling.stop, r.sampling.stop);
  CAF_CHECK_EQUAL(p.sampling.seed, 77u);
  CAF_CHECK_EQUAL(p.sampling.max_tokens, 8);
  CAF_CHECK_EQUAL(p.chunk_tier, r.chunk_tier);
  CAF_CHECK_EQUAL(p.prefix_block_tier, (std::vector<TierId>{kSsd, kRam}));
  CAF_CHECK_EQUAL(p.loaded.prefix_cached, 32);
  CAF_CHECK_EQUAL(p.loaded.chunk_loaded, r.loaded.chunk_loaded);
  CAF_CHECK_EQUAL(p.decision, r.decision);
  CAF_CHECK_EQUAL(back.logits, out.logits);
  CAF_CHECK_EQUAL(back.cached_tokens, 120);
  CAF_CHECK_EQUAL(back.prefix_cached_tokens, 32);
  CAF_CHECK_EQUAL(back.recomputed_tokens, 12);
  CAF_CHECK(back.fallback);
  // Registered under the names another node knows them by.
  for (const char* name : {"bs::RequestPlan", "bs::PrefillOutcome", "bs::DecodeStep", "bs::DecodeAsk"})
    CAF_CHECK(sys.types().make_value(name) != nullptr);
}

// -- 6. inspector --------------------------------------------------------------

CAF_TEST(inspector_lists_registered_actors_and_keeps_the_last_traces) {
  const int history = 3;
  const fs::path trace_dir = dir / "traces";
  // A numbered trace of an earlier process: ids start again at 1, so it goes.
  fs::create_directories(trace_dir);
  std::ofstream(trace_dir / "7.json") << "{}";
  put(&ActorSet::inspector, sys.spawn(inspector, history, trace_dir.string(), std::string("node-a"),
                                      make_counters("inspector")));
  sched.run();  // the spawned actors start
  CAF_CHECK(!fs::exists(trace_dir / "7.json"));
  auto intake_counters = make_counters("intake");
  intake_counters->messages = 5;
  self->send(h->inspector(), register_atom::value, intake_counters);
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, intake_counters));
  self->send(h->inspector(), register_atom::value, make_counters("write-back"));
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, _));
  // An actor in the middle of a message that began 2 s ago, 50 more waiting.
  auto stuck = make_counters("rank-worker-2");
  stuck->busy_since_ns = steady_now_ns() - 2'000'000'000;
  stuck->mailbox = 50;
  stuck->set_error("the rank-worker-2 actor failed: injected");
  self->send(h->inspector(), register_atom::value, stuck);
  expect((register_atom, CountersPtr), from(self).to(h->inspector()).with(_, _));

  auto table = json::parse(ask<std::string>(h->inspector(), actors_atom::value));
  auto actors = table.at("actors");
  CAF_REQUIRE_EQUAL(actors.size(), 4u);
  CAF_CHECK_EQUAL(actors[0].at("actor").get<std::string>(), "inspector");
  CAF_CHECK_EQUAL(actors[1].at("actor").get<std::string>(), "intake");
  CAF_CHECK_EQUAL(actors[1].at("kind").get<std::string>(), "intake");
  CAF_CHECK_EQUAL(actors[1].at("node").get<std::string>(), "node-a");
  CAF_CHECK_EQUAL(actors[1].at("messages").get<int64_t>(), 5);
  CAF_CHECK_EQUAL(actors[1].at("state").get<std::string>(), "idle");
  CAF_CHECK_EQUAL(actors[1].at("busy_share").get<double>(), 0.0);
  CAF_CHECK(!actors[1].contains("last_error"));
  CAF_CHECK_EQUAL(actors[2].at("actor").get<std::string>(), "write-back");
  CAF_CHECK_EQUAL(actors[2].at("messages").get<int64_t>(), 0);
  // The stuck one: busy, its message in hand counted, the whole window busy.
  CAF_CHECK_EQUAL(actors[3].at("kind").get<std::string>(), "rank-worker");
  CAF_CHECK_EQUAL(actors[3].at("rank").get<int>(), 2);
  CAF_CHECK_EQUAL(actors[3].at("state").get<std::string>(), "busy");
  CAF_CHECK_EQUAL(actors[3].at("mailbox").get<int64_t>(), 50);
  CAF_CHECK_GREATER_OR_EQUAL(actors[3].at("busy_s").get<double>(), 2.0);
  CAF_CHECK_GREATER(actors[3].at("busy_share").get<double>(), 0.99);
  CAF_CHECK_EQUAL(actors[3].at("last_error").get<std::string>(), "the rank-worker-2 actor failed: injected");

  for (int i = 1; i <= history + 2; ++i) {
    const std::string trace = json{{"id", i}}.dump();
    self->send(h->inspector(), trace_atom::value, trace);
    expect((trace_atom, std::string), from(self).to(h->inspector()).with(_, trace));
  }
  auto ids = [&](int32_t n) {
    std::vector<int> out;
    const auto j = json::parse(ask<std::string>(h->inspector(), get_trace_atom::value, n));
    CAF_CHECK(j.is_array());
    for (const auto& t : j) out.push_back(t.at("id").get<int>());
    return out;
  };
  CAF_CHECK_EQUAL(ids(100), (std::vector<int>{3, 4, 5}));
  CAF_CHECK_EQUAL(ids(history), (std::vector<int>{3, 4, 5}));
  CAF_CHECK_EQUAL(ids(2), (std::vector<int>{4, 5}));
  CAF_CHECK_EQUAL(ids(0), std::vector<int>{});
  CAF_CHECK_EQUAL(ids(-1), std::vector<int>{});
  // The last trace is on disk for `blendctl trace --last`, the last `history` by id.
  std::ifstream last(trace_dir / "last.json");
  std::string text((std::istreambuf_iterator<char>(last)), {});
  CAF_CHECK_EQUAL(text, (json{{"id", 5}}.dump() + "\n"));
  for (int i = 1; i <= history + 2; ++i)
    CAF_CHECK_EQUAL(fs::exists(trace_dir / (std::to_string(i) + ".json")), i > 2);
  // The inspector counts (at least) the traces it handled in its own counters, and
  // the traces it let go.
  table = json::parse(ask<std::string>(h->inspector(), actors_atom::value));
  CAF_CHECK_GREATER_OR_EQUAL(table.at("actors")[0].at("messages").get<int64_t>(), history + 2);
  CAF_CHECK_EQUAL(table.at("traces").at("dropped").get<int64_t>(), 2);
  CAF_CHECK_EQUAL(table.at("traces").at("kept").get<int64_t>(), history);
}

CAF_TEST_FIXTURE_SCOPE_END()
