// The actor runtime at device.tp 3 on the real model (SmolLM2: 9 query / 3 KV
// heads, one KV head per rank): requests through intake, controller, loaders,
// rank 0's layer worker and the two rank workers give the tokens tp 1 gives, in
// full and blend modes, from computed and from stored (RAM, SSD) chunks (each follower
// gets its heads of the loaded KV as values, into a cache its rank worker opened from
// its own pool: more requests than the cache holds wait for every rank's pages); a stored
// entry that fails mid-load falls back to computing every part on every rank; a
// rank that fails fails its request with that rank's error and the next request
// succeeds on rebuilt communicators; the trace shows every rank's layers and
// collective waits, the actor table the rank workers; a degree that does not
// divide the model is refused at start-up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "blend/rag_prompt.h"
#include "model_fixture.h"
#include "rag_runtime_fixture.h"
#include "settles.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::RagCase;
using testing::flip_byte_in_layer;
using testing::largest_chunk_file;
using testing::rag_cases;
using testing::wait_stored;

RuntimeRequest request_for(const RagCase& c, BlendMode mode, int max_tokens = 16) {
  RuntimeRequest r;
  r.messages = {{"user", c.question + " Answer briefly."}};
  r.documents = c.documents;
  r.sampling.max_tokens = max_tokens;
  r.mode = mode;
  r.ratio = 0.15f;  // fixed: both degrees run the same selection budget
  return r;
}

// fp32 GEMMs: the degrees then differ only in summation order (test_model_tensor_parallel
// measured one f16 ulp in the KV); f16 KV, the default.
RuntimeConfig config_in(const fs::path& dir, int tp, bool ram = true, bool ssd = true) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ram.enabled = ram;
  c.ssd.enabled = ssd;
  c.precision = "f32";
  c.tp = tp;
  c.max_requests = 4;
  return c;
}

// Each request of `reqs` run twice: computed (every chunk missed), then from RAM.
struct Runs {
  std::vector<RequestResult> computed, stored;
};
Runs run_twice(Runtime& rt, const std::vector<RuntimeRequest>& reqs) {
  Runs out;
  for (const auto& r : reqs) {
    out.computed.push_back(rt.run(r));
    wait_stored(rt, r);
    out.stored.push_back(rt.run(r));
  }
  return out;
}

TEST(TensorParallelRuntime, ThreeRanksGiveTheTokensOfOneInFullAndBlendFromComputedAndStoredChunks) {
  REQUIRE_MODEL();
  // One case (three documents) in both modes, computed and stored, at both degrees:
  // with two cases, its eight runs per degree took 53 s of the CI run.
  const auto cs = rag_cases(1);
  std::vector<RuntimeRequest> reqs;
  for (const auto& c : cs) {
    reqs.push_back(request_for(c, BlendMode::Blend));
    reqs.push_back(request_for(c, BlendMode::Full));
  }
  Runs one, three;
  {
    TempDir dir;
    Runtime rt(config_in(dir.path(), 1));
    one = run_twice(rt, reqs);
  }
  TempDir dir;
  Runtime rt(config_in(dir.path(), 3));
  ASSERT_NE(rt.context().tp, nullptr);
  EXPECT_EQ(rt.context().model->config().n_kv_heads, 1);
  three = run_twice(rt, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + (reqs[i].mode == BlendMode::Full ? " (full)" : " (blend)"));
    for (const auto* r : {&three.computed[i], &three.stored[i], &one.computed[i], &one.stored[i]})
      ASSERT_NE(r->finish_reason, "error") << r->error;
    EXPECT_EQ(three.computed[i].chunks_missed, 3);
    EXPECT_EQ(three.computed[i].tokens, one.computed[i].tokens);
    EXPECT_EQ(three.stored[i].tokens, one.stored[i].tokens);
    EXPECT_EQ(three.stored[i].text, one.stored[i].text);
    if (reqs[i].mode == BlendMode::Blend) {
      // The stored chunks were served from RAM to every rank, and the blend recomputed
      // as many tokens as at tp 1 (rank 0 picks them for all).
      EXPECT_EQ(three.stored[i].chunks_from("ram"), 3);
      EXPECT_GT(three.stored[i].cached_tokens, 0);
      EXPECT_EQ(three.stored[i].recomputed_tokens, one.stored[i].recomputed_tokens);
    }
  }
  // Every request ended: the followers hold no cache (their End jobs ran).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto held = [&] { return rt.context().tp->follower(1).requests() + rt.context().tp->follower(2).requests(); };
  while (held() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(held(), 0);
  EXPECT_EQ(rt.context().tp->follower(1).kv_pool().free_pages(), rt.context().tp->follower(1).kv_pool().total_pages());

  // The last request's trace: each follower's per-layer computes and collective waits,
  // and every rank's total wait.
  const auto trace = json::parse(rt.traces_json(1))[0];
  std::set<std::string> actors;
  std::set<int> rank1_layers;
  for (const auto& e : trace.at("events")) {
    actors.insert(e.at("actor").get<std::string>());
    if (e.at("actor") == "rank-1" && e.at("what") == "compute") rank1_layers.insert(e.at("layer").get<int>());
  }
  EXPECT_TRUE(actors.count("rank-0") && actors.count("rank-1") && actors.count("rank-2")) << trace.dump();
  EXPECT_EQ(rank1_layers.size(), 30u);
  for (const char* k : {"rank-0_collective_s", "rank-1_collective_s", "rank-2_collective_s"})
    EXPECT_TRUE(trace.contains(k)) << k;
  // The actor table lists the rank workers and their compute threads.
  const auto table = json::parse(rt.actors_json());
  std::set<std::string> names;
  for (const auto& a : table) names.insert(a.at("actor").get<std::string>());
  for (const char* n : {"rank-worker-1", "rank-worker-2", "compute-thread-rank-1", "compute-thread-rank-2"})
    EXPECT_TRUE(names.count(n)) << n << " in " << table.dump();
}

// More requests at once than the KV cache holds, each served from RAM (its loads go to
// every rank: rank 0's heads into its cache, the followers' as values to their rank
// workers): each waits for its pages on every rank — a follower's come free only when
// the End of an earlier request ran there, after rank 0's — and every one gives the
// tokens it gives alone. Afterwards every rank's pool is whole again.
TEST(TensorParallelRuntime, RequestsBeyondTheCacheWaitForEveryRanksPagesAndGiveTheirTokens) {
  REQUIRE_MODEL();
  TempDir dir;
  const auto cs = rag_cases(2);
  std::vector<RuntimeRequest> reqs;
  for (const auto& c : cs) {
    reqs.push_back(request_for(c, BlendMode::Blend, 8));
    reqs.push_back(request_for(c, BlendMode::Blend, 6));
  }
  // The page size of a rank at tp 3, and the requests' sizes, from a first runtime.
  int64_t page_bytes = 0, page_positions = 0, most_pages = 0;
  {
    Runtime probe(config_in(dir.path(), 3, true, false));
    page_bytes = probe.kv_pages().page_bytes;
    page_positions = probe.kv_pages().page_positions;
    for (const auto& r : reqs) {
      const auto res = probe.run(r);
      ASSERT_NE(res.finish_reason, "error") << res.error;
      const int64_t capacity = res.prompt_tokens + r.sampling.max_tokens;
      most_pages = std::max(most_pages, (capacity + page_positions - 1) / page_positions);
    }
  }
  auto cfg = config_in(dir.path(), 3, true, false);
  // device.kv_cache_bytes holds every rank's KV (a rank's page is a third of a whole one):
  // two requests at a time, not three.
  cfg.kv_cache_bytes = 3 * page_bytes * (2 * most_pages + 1);
  cfg.max_requests = 4;
  Runtime rt(cfg);
  ASSERT_EQ(rt.kv_pages().total, 2 * most_pages + 1);
  for (const auto& r : reqs) {
    rt.run(r);
    wait_stored(rt, r);
  }
  std::vector<RequestResult> alone;
  for (const auto& r : reqs) {
    alone.push_back(rt.run(r));
    ASSERT_EQ(alone.back().chunks_from("ram"), 3) << alone.back().error;
  }
  for (int round = 0; round < 2; ++round) {
    const auto together = testing::run_together(rt, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& res = together[i];
      ASSERT_NE(res.finish_reason, "error") << res.error;
      EXPECT_EQ(res.chunks_from("ram"), 3);
      EXPECT_EQ(res.tokens, alone[i].tokens) << "request " << i << " round " << round;
    }
  }
  EXPECT_TRUE(testing::settles([&] { return rt.in_flight() == 0; }));
  for (int r = 1; r < 3; ++r) {
    auto& f = rt.context().tp->follower(r);
    EXPECT_TRUE(testing::settles([&] { return f.requests() == 0 && f.kv_pool().free_pages() == f.kv_pool().total_pages(); }))
        << "rank " << r << ": " << f.requests() << " requests, " << f.kv_pool().free_pages() << " of "
        << f.kv_pool().total_pages() << " pages free";
  }
  EXPECT_EQ(rt.context().kv_pool->foreign_reservation_writes(), 0);
}

TEST(TensorParallelRuntime, ChunksStoredAtThreeRanksSurviveARestartOnTheSsd) {
  REQUIRE_MODEL();
  TempDir dir;
  const auto req = request_for(rag_cases(1)[0], BlendMode::Blend);
  RequestResult from_ram;
  {
    Runtime rt(config_in(dir.path(), 3));
    rt.run(req);
    wait_stored(rt, req);
    from_ram = rt.run(req);
    ASSERT_EQ(from_ram.chunks_from("ram"), 3);
  }
  Runtime rt(config_in(dir.path(), 3, /*ram=*/false));
  const auto from_ssd = rt.run(req);
  ASSERT_NE(from_ssd.finish_reason, "error") << from_ssd.error;
  EXPECT_EQ(from_ssd.chunks_from("ssd"), 3);
  EXPECT_EQ(from_ssd.tokens, from_ram.tokens);
}

TEST(TensorParallelRuntime, ChunksStoredAtOneDegreeAreNotServedAtAnother) {
  REQUIRE_MODEL();
  // Decided from measurement (test_model_tensor_parallel: one f16 ulp apart): the
  // degree is part of the model fingerprint, so of every chunk key.
  TempDir dir;
  const auto req = request_for(rag_cases(1)[0], BlendMode::Blend);
  {
    Runtime rt(config_in(dir.path(), 1));
    rt.run(req);
    wait_stored(rt, req);
  }
  Runtime rt(config_in(dir.path(), 3));
  const auto r = rt.run(req);
  ASSERT_NE(r.finish_reason, "error") << r.error;
  EXPECT_EQ(r.chunks_missed, 3);
  EXPECT_EQ(r.cached_tokens, 0);
}

// Automatic prefix caching at three ranks: the blocks of a plain prompt are stored
// (computed alone on every rank and gathered: rank 0's cache holds one KV head of three)
// and loaded by the same request again, each rank its heads; the answer is the first's.
TEST(TensorParallelRuntime, APromptsStoredPrefixBlocksAreLoadedOnEveryRankAndAnswerTheSame) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path(), 3, /*ram=*/true, /*ssd=*/false));
  const auto c = rag_cases(1)[0];
  std::string text;
  for (const auto& d : c.documents) text += d + "\n\n";
  RuntimeRequest req;
  req.messages = {{"system", "You answer from the passages."}, {"user", text + c.question}};
  req.sampling.max_tokens = 12;
  const auto first = rt.run(req);
  ASSERT_NE(first.finish_reason, "error") << first.error;
  EXPECT_EQ(first.prefix_cached_tokens, 0);
  auto& ctx = rt.context();
  const int64_t B = ctx.config.prefix_block_tokens;
  const auto prompt = assemble_rag_prompt(ctx.model->tokenizer(), ctx.model->chat_template(), req.messages, {});
  const auto keys = ctx.engine->prefix_block_keys(prompt.concatenated(), B, prompt.size() - 1);
  ASSERT_GE(keys.size(), 3u);
  // (Stored deepest first: block 0 is the last.)
  EXPECT_TRUE(testing::settles(
      [&] { return std::all_of(keys.begin(), keys.end(), [&](const ChunkKey& k) { return ctx.tiered->contains(k); }); },
      120));
  const auto second = rt.run(req);
  ASSERT_NE(second.finish_reason, "error") << second.error;
  EXPECT_EQ(second.prefix_cached_tokens, second.prompt_tokens - 1);
  EXPECT_EQ(second.tokens, first.tokens);
}

TEST(TensorParallelRuntime, AStoredEntryThatFailsMidLoadIsComputedOnEveryRankAndTheOthersLoadedAgain) {
  REQUIRE_MODEL();
  TempDir dir;
  const auto req = request_for(rag_cases(1)[0], BlendMode::Blend);
  {
    Runtime rt(config_in(dir.path(), 3));
    ASSERT_EQ(rt.run(req).chunks_missed, 3);
    wait_stored(rt, req);
  }
  // The largest file (a document chunk): a byte of its layer-20 K data flipped; in a
  // copy of the store the same file is simply gone.
  const fs::path victim = largest_chunk_file(dir.path() / "kv");
  ASSERT_FALSE(victim.empty());
  const fs::path gone = dir.path() / "kv_gone";
  fs::copy(dir.path() / "kv", gone);
  fs::remove(gone / victim.filename());
  flip_byte_in_layer(victim, 20, 30);
  RequestResult expected;
  {
    auto cfg = config_in(dir.path(), 3, /*ram=*/false);
    cfg.ssd.path = gone.string();
    cfg.write_back = false;
    Runtime rt(cfg);
    expected = rt.run(req);
    ASSERT_EQ(expected.chunks_missed, 1);
  }
  auto cfg = config_in(dir.path(), 3, /*ram=*/false);
  cfg.write_back = false;
  Runtime rt(cfg);
  const auto r = rt.run(req);
  ASSERT_NE(r.finish_reason, "error") << r.error;
  // Begun again on every rank with the failed chunk computed and the other two loaded
  // again: the tokens of the store without that file.
  EXPECT_EQ(r.chunks_missed, 1);
  EXPECT_EQ(r.tokens, expected.tokens);
  EXPECT_EQ(rt.context().ssd->stats().corrupt, 1);
  const auto trace = json::parse(rt.traces_json(1))[0];
  EXPECT_TRUE(trace.at("fallback").get<bool>());
  // The trace says where each chunk came from in the end: one computed, two from the SSD.
  const auto tiers = trace.at("chunk_tiers").get<std::vector<std::string>>();
  EXPECT_EQ(std::count(tiers.begin(), tiers.end(), "miss"), 1);
  EXPECT_EQ(std::count(tiers.begin(), tiers.end(), "ssd"), 2);

}

TEST(TensorParallelRuntime, ARankThatFailsFailsItsRequestAndTheNextRequestSucceeds) {
  REQUIRE_MODEL();
  TempDir dir;
  // One document: what is tested is the failure and the rebuild, not the prompt's size
  // (five requests here; under the sanitizers three documents took ~100 s, one ~29 s).
  const auto req = request_for(rag_cases(1, 1)[0], BlendMode::Blend, 8);
  RequestResult expected;
  {
    Runtime one(config_in(dir.path() / "one", 1));
    expected = one.run(req);
    ASSERT_NE(expected.finish_reason, "error") << expected.error;
  }
  auto cfg = config_in(dir.path(), 3);
  cfg.write_back = false;
  // Rank 2 throws in its next job of the armed kind, once. Declared before the
  // runtime: its ranks run jobs (the requests' Ends) until it is destroyed.
  std::atomic<int> armed{RankJob::Prefill};
  Runtime rt(cfg);
  auto& tp = *rt.context().tp;
  tp.follower(2).fault = [&](int rank, const RankJob& job) {
    int kind = job.kind;
    if (armed.compare_exchange_strong(kind, -1))
      throw std::runtime_error("injected fault on rank " + std::to_string(rank));
  };
  const auto t0 = std::chrono::steady_clock::now();
  const auto failed_prefill = rt.run(req);
  EXPECT_EQ(failed_prefill.finish_reason, "error");
  EXPECT_THAT(failed_prefill.error, HasSubstr("injected fault on rank 2"));
  // The others stopped at once (the communicator was aborted), not at the 60 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));

  const auto after_prefill = rt.run(req);
  ASSERT_NE(after_prefill.finish_reason, "error") << after_prefill.error;
  EXPECT_EQ(after_prefill.tokens, expected.tokens);
  EXPECT_EQ(tp.rebuilds(), 1);
  EXPECT_EQ(rt.tensor_parallel_stats().failures, 1);

  // A decode step that fails on rank 2: the request fails, the next one is whole.
  armed = RankJob::Decode;
  const auto failed_decode = rt.run(req);
  EXPECT_EQ(failed_decode.finish_reason, "error");
  EXPECT_THAT(failed_decode.error, HasSubstr("injected fault on rank 2"));
  const auto after_decode = rt.run(req);
  ASSERT_NE(after_decode.finish_reason, "error") << after_decode.error;
  EXPECT_EQ(after_decode.tokens, expected.tokens);
  EXPECT_EQ(tp.rebuilds(), 2);
}

TEST(TensorParallelRuntime, ADegreeThatDoesNotDivideTheModelIsRefusedAtStartUp) {
  REQUIRE_MODEL();
  TempDir dir;
  try {
    Runtime rt(config_in(dir.path(), 2));
    FAIL() << "tp 2 of a 9-head model started";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("device.tp"));
    EXPECT_THAT(e.what(), HasSubstr("9 query / 3 KV heads"));
    EXPECT_THAT(e.what(), HasSubstr("degrees that fit: 1, 3"));
  }
}

}  // namespace
}  // namespace bs
