// Continuous batching and admission in the runtime, on the real model: requests
// decoding at the same time share decode steps and still get exactly the tokens
// they get alone (Transformer::decode_step rows are bit-identical to one-token
// forwards); a request joins the others between steps; a long prefill lets the
// streams already decoding go on (a decode step between its layers) instead of
// freezing them; requests arriving together are prefilled first and decode as one
// batch; beyond max_requests requests wait in a bounded FIFO queue, can be
// cancelled there, are refused as overloaded beyond it, and end as cancelled at
// shutdown.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "model_fixture.h"
#include "rag_runtime_fixture.h"
#include "settles.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

using testing::TempDir;

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

RuntimeConfig config_in(const fs::path& dir) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ssd.direct_io = false;  // no stored chunks here; the temp dir may be a tmpfs
  c.write_back = false;     // no background computes between the steps measured
  return c;
}

// A completion without the chat template (no stop strings), greedy.
RuntimeRequest raw(const std::string& text, int max_tokens) {
  RuntimeRequest r;
  r.raw = true;
  r.raw_prompt = text;
  r.sampling.max_tokens = max_tokens;
  return r;
}

RuntimeRequest chat(const std::string& question, int max_tokens) {
  RuntimeRequest r;
  r.messages = {{"user", question}};
  r.sampling.max_tokens = max_tokens;
  return r;
}

// A raw prompt the model continues for as long as it may (it counts on).
RuntimeRequest counting(int from, int max_tokens) {
  std::string text;
  for (int i = from; i < from + 12; ++i) text += std::to_string(i) + ", ";
  return raw(text, max_tokens);
}


// The trace of request `id` among the inspector's last traces.
json trace_of(Runtime& rt, uint64_t id) {
  for (const auto& t : json::parse(rt.traces_json(64)))
    if (t.at("id").get<uint64_t>() == id) return t;
  ADD_FAILURE() << "no trace for request " << id;
  return json::object();
}

// Collects on_done results and counts the calls.
struct Done {
  std::mutex mu;
  std::vector<RequestResult> results;
  std::atomic<int> calls{0};
  std::promise<void> all;
  int expected = 0;
  RequestCallbacks callbacks() {
    RequestCallbacks cb;
    cb.on_done = [this](const RequestResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      results.push_back(r);
      if (++calls == expected) all.set_value();
    };
    return cb;
  }
  RequestResult of(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& r : results)
      if (r.id == id) return r;
    ADD_FAILURE() << "no result for request " << id;
    return {};
  }
};

TEST(Batching, ConcurrentRequestsShareDecodeStepsAndGiveTheTokensTheyGiveAlone) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path()));
  const std::vector<RuntimeRequest> reqs = {
      raw("The history of the printing press begins", 18),
      chat("Name three colours of the rainbow.", 12),
      counting(1, 24),
      raw("def add(a, b):\n    return", 9),
      chat("What is the capital of France?", 16),
      counting(40, 30),
  };
  std::vector<RequestResult> alone;
  for (const auto& r : reqs) {
    alone.push_back(rt.run(r));
    ASSERT_NE(alone.back().finish_reason, "error") << alone.back().error;
    EXPECT_GT(alone.back().tokens.size(), 1u);
  }
  const auto before = rt.decode_stats();
  const auto together = testing::run_together(rt, reqs);
  const auto after = rt.decode_stats();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_NE(together[i].finish_reason, "error") << together[i].error;
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].text, alone[i].text) << "request " << i;
    EXPECT_EQ(together[i].finish_reason, alone[i].finish_reason) << "request " << i;
  }
  // Every token after the first came from a decode step; steps were shared.
  const int64_t steps = after.steps - before.steps, tokens = after.tokens - before.tokens;
  int64_t decoded = 0;
  for (const auto& r : alone) decoded += static_cast<int64_t>(r.tokens.size()) - 1;
  EXPECT_GE(tokens, decoded);
  // (Requests of different lengths, prefilled one after the other: the first and
  // the last steps have one request, so the mean stays well below 6.) A claim about
  // Release speed: under ThreadSanitizer (tools/tsan.sh: one OpenMP thread, everything
  // several times slower) no step has held two of these requests in any run since
  // 2026-11-27, with no race reported (tests/RESULTS.md); there the test checks the
  // tokens and the races.
  if (!kThreadSanitizer) {
    EXPECT_GT(tokens, steps) << "no decode step had more than one request";
  }
  EXPECT_TRUE(testing::settles([&] { return rt.in_flight() == 0; }));
  EXPECT_EQ(rt.queued(), 0);
}

TEST(Batching, ARequestJoinsTheOthersBetweenSteps) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path()));
  const auto joiner = chat("Describe a lighthouse in two sentences.", 20);
  const auto alone = rt.run(joiner);
  ASSERT_NE(alone.finish_reason, "error") << alone.error;

  // Two streams decoding; the third arrives once they have produced text.
  Done done;
  done.expected = 3;
  std::promise<void> streaming;
  std::atomic<int> pieces{0};
  auto first = done.callbacks();
  first.on_text = [&](std::string_view) {
    if (++pieces == 4) streaming.set_value();
    return true;
  };
  const uint64_t a = rt.submit(counting(1, 120), std::move(first));
  const uint64_t b = rt.submit(counting(200, 120), done.callbacks());
  streaming.get_future().wait();
  const uint64_t c = rt.submit(joiner, done.callbacks());
  done.all.get_future().wait();
  EXPECT_EQ(done.calls.load(), 3);
  const auto joined = done.of(c);
  ASSERT_NE(joined.finish_reason, "error") << joined.error;
  EXPECT_EQ(joined.tokens, alone.tokens);
  EXPECT_EQ(joined.text, alone.text);
  EXPECT_EQ(done.of(a).finish_reason, "length");
  EXPECT_EQ(done.of(b).finish_reason, "length");
  // It shared its steps with the streams still decoding (trace counters).
  const json t = trace_of(rt, c);
  ASSERT_TRUE(t.contains("decode")) << t.dump();
  // One step per token fed back: every token but the last, and the last too when
  // the step after it sampled the end of turn.
  const int64_t n = static_cast<int64_t>(joined.tokens.size());
  EXPECT_GE(t["decode"]["steps"].get<int64_t>(), n - 1);
  EXPECT_LE(t["decode"]["steps"].get<int64_t>(), n);
  EXPECT_GT(t["decode"]["mean_batch"].get<double>(), 1.5) << t["decode"].dump();
}

TEST(Batching, ALongPrefillDoesNotFreezeTheStreams) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir.path()));
  const auto& tok = rt.context().model->tokenizer();
  // ~2200 tokens of prose, prefilled in full (every token through every layer).
  std::string text;
  for (int i = 0; tok.encode(text, false).size() < 2200; ++i)
    text += "Section " + std::to_string(i) +
            ". The river that runs through the old town was once the main road for merchants carrying salt and "
            "wool; in spring the water rises quickly and the lower streets near the bridge flood for days. ";
  RuntimeRequest long_req = raw(text, 4);
  long_req.mode = BlendMode::Full;

  // A stream decoding (counting on, so it does not stop), timestamps of its text.
  std::mutex mu;
  std::vector<clock_type::time_point> stamps;
  std::promise<void> streaming;
  RequestCallbacks cb;
  cb.on_text = [&](std::string_view) {
    std::lock_guard<std::mutex> lock(mu);
    stamps.push_back(clock_type::now());
    if (stamps.size() == 3) streaming.set_value();
    return true;
  };
  std::promise<RequestResult> stream_done;
  cb.on_done = [&](const RequestResult& r) { stream_done.set_value(r); };
  const uint64_t stream = rt.submit(counting(1, 4000), std::move(cb));
  streaming.get_future().wait();

  const auto before = rt.decode_stats();
  const auto submitted = clock_type::now();
  std::promise<RequestResult> long_done;
  RequestCallbacks lcb;
  lcb.on_done = [&](const RequestResult& r) { long_done.set_value(r); };
  const uint64_t long_id = rt.submit(long_req, std::move(lcb));
  const auto long_res = long_done.get_future().get();
  ASSERT_NE(long_res.finish_reason, "error") << long_res.error;
  const auto after = rt.decode_stats();
  EXPECT_TRUE(rt.cancel(stream));
  const auto stream_res = stream_done.get_future().get();
  EXPECT_EQ(stream_res.finish_reason, "cancelled");

  // The long request's prefill, from its trace (seconds since its submit).
  const json t = trace_of(rt, long_id);
  double begin = -1, end = -1;
  for (const auto& e : t.at("events"))
    if (e.at("actor") == "worker" && e.at("what") == "prefill") {
      begin = e.at("begin_s").get<double>();
      end = e.at("end_s").get<double>();
    }
  ASSERT_GE(begin, 0) << t.dump();
  const double interval = rt.context().config.decode_interleave;
  ASSERT_GT(end - begin, 4 * interval) << "the prefill is too short to show interleaving";
  int during = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& s : stamps) {
      const double at = std::chrono::duration<double>(s - submitted).count();
      if (at > begin && at < end) ++during;
    }
  }
  // A step may run after each layer's wait (one per layer at most), when the last
  // one began decode_interleave ago: at least half of that many, and 2.
  const int layers = rt.context().model->config().n_layers;
  const int expected = static_cast<int>(std::min<double>(layers, (end - begin) / interval) / 2);
  EXPECT_GE(during, std::max(2, expected)) << "stream text during the " << (end - begin) << " s prefill";
  EXPECT_GT(after.interleaved_steps - before.interleaved_steps, 0);
  EXPECT_GT(t.value("prefill_pauses", 0), 0) << t.dump();
}

// Requests that arrive together are prefilled back to back (prefills go first while
// the streams' next step is not due) and then decode as one batch: with
// decode_interleave longer than their prefills, every decode step holds all of them.
// (A step run between two prefills sent the first streams ahead, to finish alone in
// smaller batches: 32 streams started together on an H200 averaged 21 rows a step.)
TEST(Batching, RequestsArrivingTogetherArePrefilledFirstAndDecodeAsOneBatch) {
  REQUIRE_MODEL();
  TempDir dir;
  auto cfg = config_in(dir.path());
  cfg.decode_interleave = 60;  // seconds: longer than the four prefills together
  Runtime rt(cfg);
  constexpr int kStreams = 4, kTokens = 10;
  std::vector<RuntimeRequest> reqs;
  for (int i = 0; i < kStreams; ++i) {
    std::string text;  // ~150 tokens of counting: the model counts on, no stream stops early
    for (int n = 100 * i + 1; n < 100 * i + 60; ++n) text += std::to_string(n) + ", ";
    reqs.push_back(raw(text, kTokens));
  }
  std::vector<RequestResult> alone;
  for (const auto& r : reqs) alone.push_back(rt.run(r));
  const auto before = rt.decode_stats();
  const auto together = testing::run_together(rt, reqs);
  const auto after = rt.decode_stats();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_NE(together[i].finish_reason, "error") << together[i].error;
    EXPECT_EQ(together[i].finish_reason, "length");
    EXPECT_EQ(together[i].tokens.size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    const json t = trace_of(rt, together[i].id);
    ASSERT_TRUE(t.contains("decode")) << t.dump();
    EXPECT_EQ(t["decode"]["steps"].get<int64_t>(), kTokens - 1);
    EXPECT_DOUBLE_EQ(t["decode"]["mean_batch"].get<double>(), kStreams) << t["decode"].dump();
  }
  // Every decode step held every stream: kTokens - 1 steps of kStreams tokens.
  EXPECT_EQ(after.steps - before.steps, kTokens - 1);
  EXPECT_EQ(after.tokens - before.tokens, kStreams * (kTokens - 1));
  EXPECT_EQ(after.interleaved_steps, before.interleaved_steps);
}

TEST(Batching, BeyondMaxRequestsRequestsWaitInABoundedQueue) {
  REQUIRE_MODEL();
  TempDir dir;
  auto cfg = config_in(dir.path());
  cfg.max_requests = 1;
  cfg.max_queue = 2;
  Runtime rt(cfg);
  const auto running_req = counting(1, 40);
  const auto queued_req = chat("Name a fruit that is yellow.", 10);
  const auto cancelled_req = chat("Name a planet.", 10);
  const auto alone_running = rt.run(running_req);
  const auto alone_queued = rt.run(queued_req);

  Done done;
  done.expected = 3;
  const uint64_t r1 = rt.submit(running_req, done.callbacks());
  const uint64_t q1 = rt.submit(queued_req, done.callbacks());
  const uint64_t q2 = rt.submit(cancelled_req, done.callbacks());
  EXPECT_EQ(rt.queued(), 2);
  EXPECT_LE(rt.in_flight(), 1);
  // The queue is full: refused, and the caller can retry later.
  try {
    rt.submit(queued_req, {});
    ADD_FAILURE() << "a fourth request was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.code, RequestErrc::overloaded) << e.what();
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("too many requests"));
  }
  // A queued request cancelled by id ends at once, as cancelled.
  EXPECT_TRUE(rt.cancel(q2));
  done.all.get_future().wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a second on_done would show here
  EXPECT_EQ(done.calls.load(), 3);
  const auto c = done.of(q2);
  EXPECT_EQ(c.finish_reason, "cancelled");
  EXPECT_TRUE(c.tokens.empty());
  const auto a = done.of(r1), b = done.of(q1);
  ASSERT_NE(a.finish_reason, "error") << a.error;
  ASSERT_NE(b.finish_reason, "error") << b.error;
  EXPECT_EQ(a.tokens, alone_running.tokens);
  EXPECT_EQ(b.tokens, alone_queued.tokens);
  // The queued one started after the running one ended: its first token came later.
  EXPECT_GT(b.ttft_seconds, a.ttft_seconds);
  EXPECT_EQ(rt.queued(), 0);
  EXPECT_TRUE(testing::settles([&] { return rt.in_flight() == 0; }));
  // Its time in the queue is in its trace.
  bool queued_event = false;
  const json t = trace_of(rt, q1);
  for (const auto& e : t.at("events")) queued_event |= e.at("what") == "queued";
  EXPECT_TRUE(queued_event) << t.dump();
}

TEST(Batching, ShutdownFinishesQueuedRequestsAsCancelled) {
  REQUIRE_MODEL();
  TempDir dir;
  auto cfg = config_in(dir.path());
  cfg.max_requests = 1;
  cfg.max_queue = 3;
  Runtime rt(cfg);
  Done done;
  done.expected = 4;
  std::promise<void> streaming;
  auto first = done.callbacks();
  std::atomic<int> pieces{0};
  first.on_text = [&](std::string_view) {
    if (++pieces == 2) streaming.set_value();
    return true;
  };
  const uint64_t running = rt.submit(counting(1, 2000), std::move(first));
  std::vector<uint64_t> queued;
  for (int i = 0; i < 3; ++i) queued.push_back(rt.submit(counting(100 * (i + 1), 50), done.callbacks()));
  streaming.get_future().wait();
  EXPECT_EQ(rt.queued(), 3);
  const auto t0 = clock_type::now();
  rt.shutdown();
  const double took = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_LT(took, 30.0);
  ASSERT_EQ(done.all.get_future().wait_for(std::chrono::seconds(0)), std::future_status::ready)
      << "shutdown returned before every request had its on_done";
  EXPECT_EQ(done.calls.load(), 4);
  EXPECT_EQ(done.of(running).finish_reason, "cancelled");
  EXPECT_GT(done.of(running).tokens.size(), 0u);
  for (uint64_t id : queued) {
    EXPECT_EQ(done.of(id).finish_reason, "cancelled") << id;
    EXPECT_TRUE(done.of(id).tokens.empty()) << id;
  }
  EXPECT_EQ(rt.queued(), 0);
  EXPECT_TRUE(testing::settles([&] { return rt.in_flight() == 0; }));
}

}  // namespace
}  // namespace bs
