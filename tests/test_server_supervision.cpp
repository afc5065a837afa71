// Supervision and deadlines on the real model, a real runtime and a real HTTP server
// (issue 42): a loader that dies on every request is restarted, the second death
// within the window pauses admission (a plain request waits it out in the queue),
// and the death past limits.max_restarts fails the runtime loudly — the request it
// held, every later request (503 naming the role), /health (503) and /metrics say
// so. A request that runs past limits.max_request_seconds ends as an error that
// says so (504 over HTTP, streamed or not) whether it was decoding or queued, and
// one that cannot stop (its loader stuck in a slow device) is failed where it
// stands 10 s after its deadline. Every wait in these tests is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "counting_request.h"
#include "model_fixture.h"
#include "served_fixture.h"
#include "settles.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using testing::Served;
using testing::TempDir;

// The first case's documents of the small RAG set.
std::vector<std::string> three_documents() {
  std::ifstream in(std::string(BLENDSERVE_FIXTURES) + "/../data/rag_qa_small.jsonl");
  std::string line;
  std::getline(in, line);
  const json c = json::parse(line);  // named: a temporary in the range's expression would die before the loop
  std::vector<std::string> d;
  for (const auto& doc : c.at("documents")) {
    d.push_back(doc.get<std::string>());
    if (d.size() == 3) break;
  }
  return d;
}

RuntimeRequest rag_request(const std::vector<std::string>& docs) {
  RuntimeRequest r;
  r.messages = {{"user", "What do these documents say? Answer briefly."}};
  r.documents = docs;
  r.sampling.max_tokens = 4;
  return r;
}

RuntimeRequest plain_request() {
  RuntimeRequest r;
  r.messages = {{"user", "Say hello."}};
  r.sampling.max_tokens = 2;
  return r;
}

// Every stored chunk read from the SSD by one loader; everything under `dir`.
RuntimeConfig ssd_only_in(const fs::path& dir) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ssd.direct_io = false;
  c.ssd.loaders = 1;
  c.ram.enabled = false;
  c.write_back = false;
  return c;
}

struct Pending {
  std::promise<RequestResult> done;
  std::future<RequestResult> result = done.get_future();
  RequestCallbacks callbacks() {
    RequestCallbacks cb;
    cb.on_done = [this](const RequestResult& r) { done.set_value(r); };
    return cb;
  }
  RequestResult get(std::chrono::seconds limit = 120s) {
    if (result.wait_for(limit) != std::future_status::ready) {
      ADD_FAILURE() << "the request hung";
      return {};
    }
    return result.get();
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string model_id(httplib::Client& c) {
  auto r = c.Get("/v1/models");
  return r && r->status == 200 ? json::parse(r->body)["data"][0]["id"].get<std::string>() : std::string();
}

TEST(Supervision, ALoaderThatDiesOnEveryRequestIsRestartedWithBackoffThenTheRuntimeFailsLoudly) {
  REQUIRE_MODEL();
  TempDir dir;
  RuntimeConfig config = ssd_only_in(dir.path());
  config.max_restarts = 2;
  config.restart_window = 60;
  config.restart_backoff = 1.0;
  Runtime rt(config);
  Served served(rt, config);
  auto c = served.client();
  const auto docs = three_documents();
  for (const auto& d : docs) rt.store_document(d);
  rt.context().loader_fault = [](const std::string& tier, int layer) {
    if (tier == "ssd" && layer == 2) throw std::runtime_error("test hook: the disk is gone");
  };

  // First death: the request fails naming the loader, a new loader starts at once.
  Pending first;
  rt.submit(rag_request(docs), first.callbacks());
  const RequestResult r1 = first.get();
  EXPECT_EQ(r1.finish_reason, "error");
  EXPECT_THAT(r1.error, HasSubstr("loader-ssd-0"));
  EXPECT_THAT(r1.error, HasSubstr("test hook: the disk is gone"));
  EXPECT_TRUE(testing::settles([&] { return rt.actor_restarts() == 1; }));
  EXPECT_TRUE(rt.failure().empty());

  // Second death within the window: restarted, and admission pauses 1 s (the
  // restart hook sets the pause before it fails the request): a plain request
  // submitted right after waits in the queue, then runs.
  Pending second;
  rt.submit(rag_request(docs), second.callbacks());
  const RequestResult r2 = second.get();
  EXPECT_EQ(r2.finish_reason, "error");
  const auto t_plain = std::chrono::steady_clock::now();
  const RequestResult plain = rt.run(plain_request());
  const double waited = seconds_since(t_plain);
  EXPECT_NE(plain.finish_reason, "error") << plain.error;
  EXPECT_GT(waited, 0.5) << "admission did not pause after the second death";
  EXPECT_LT(waited, 30);
  EXPECT_TRUE(testing::settles([&] { return rt.actor_restarts() == 2; }));
  EXPECT_TRUE(rt.failure().empty());
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  // Third death within 60 s, past max_restarts 2: no successor; the runtime fails.
  Pending third;
  rt.submit(rag_request(docs), third.callbacks());
  const RequestResult r3 = third.get();
  EXPECT_EQ(r3.finish_reason, "error");
  EXPECT_THAT(r3.error, HasSubstr("loader-ssd-0"));
  EXPECT_TRUE(testing::settles([&] { return !rt.failure().empty(); }));
  EXPECT_THAT(rt.failure(), HasSubstr("the loader-ssd-0 actor died 3 times within 60 s"));
  EXPECT_THAT(rt.failure(), HasSubstr("test hook: the disk is gone"));
  EXPECT_EQ(rt.actor_restarts(), 2);
  // Every later request is refused with the reason, a plain one too.
  try {
    rt.submit(plain_request(), {});
    ADD_FAILURE() << "a failed runtime accepted a request";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.code, RequestErrc::unavailable);
    EXPECT_THAT(e.what(), HasSubstr("loader-ssd-0"));
  }
  const std::string model = model_id(c);
  ASSERT_FALSE(model.empty());
  auto refused = c.Post("/v1/chat/completions",
                        json{{"model", model}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}.dump(),
                        "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;
  const json e = json::parse(refused->body);
  EXPECT_EQ(e["error"]["code"], "service_unavailable");
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("loader-ssd-0"));
  health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  const json h = json::parse(health->body);
  EXPECT_EQ(h["status"], "failed");
  EXPECT_THAT(h["reason"].get<std::string>(), HasSubstr("loader-ssd-0"));
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_THAT(m->body, HasSubstr("\nblendserve_failed 1"));
  EXPECT_EQ(rt.in_flight(), 0);
  EXPECT_EQ(rt.queued(), 0);
}

// The deadline of the test below. Under ASan+UBSan (-O1, two sanitizer tests beside it
// on CI) a 36-token prompt and two tokens took over 1.5 s, so the request that shows the
// runtime serves on ran past a 1.5 s limit; there the limit is 8 s. The 400-token stream
// runs past either (measured: 73 tokens in 1.5 s in Release, 32 in 8 s under ASan).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BS_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define BS_TEST_SANITIZED 1
#endif
#ifdef BS_TEST_SANITIZED
constexpr double kDeadlineSeconds = 8;
#else
constexpr double kDeadlineSeconds = 1.5;
#endif
constexpr int kPastDeadlineTokens = 400;

TEST(Deadlines, ARequestPastMaxRequestSecondsEndsAsAnErrorRunningOrQueued) {
  REQUIRE_MODEL();
  TempDir dir;
  RuntimeConfig config = default_runtime_config();
  config.data_dir = dir.path().string();
  config.max_requests = 1;
  config.max_request_seconds = kDeadlineSeconds;
  Runtime rt(config);
  // A counting stream of kPastDeadlineTokens takes far longer than the deadline; a
  // second request queued behind it expires in the queue at the same deadline.
  Pending running, queued;
  const auto t0 = std::chrono::steady_clock::now();
  rt.submit(testing::counting_request(kPastDeadlineTokens), running.callbacks());
  rt.submit(testing::counting_request(4), queued.callbacks());
  const RequestResult q = queued.get();
  const RequestResult r = running.get();
  const double took = seconds_since(t0);
  std::fprintf(stderr, "past the deadline: %.2f s, %zu tokens\n", took, r.tokens.size());
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", kDeadlineSeconds);
  for (const RequestResult* x : {&r, &q}) {
    EXPECT_EQ(x->finish_reason, "error");
    EXPECT_TRUE(x->deadline_exceeded);
    EXPECT_THAT(x->error, HasSubstr(std::string("limits.max_request_seconds (") + limit + " s)"));
  }
  EXPECT_FALSE(r.tokens.empty()) << "the running request's tokens so far are kept";
  EXPECT_LT(r.tokens.size(), static_cast<size_t>(kPastDeadlineTokens));
  EXPECT_TRUE(q.tokens.empty());
  EXPECT_GE(took, kDeadlineSeconds - 0.1);
  EXPECT_LT(took, kDeadlineSeconds + 13) << "a request past its deadline stops at its next step";
  EXPECT_TRUE(testing::settles([&] { return rt.in_flight() == 0 && rt.queued() == 0; }));
  // The runtime serves on: a short request well within the limit answers.
  const RequestResult ok = rt.run(testing::counting_request(2));
  EXPECT_NE(ok.finish_reason, "error") << ok.error;
  EXPECT_FALSE(ok.deadline_exceeded);
}

TEST(Deadlines, OverHttpARequestPastItsDeadlineGets504StreamedOrNot) {
  REQUIRE_MODEL();
  TempDir dir;
  RuntimeConfig config = ssd_only_in(dir.path());
  config.max_requests = 1;
  config.max_request_seconds = 1;
  Runtime rt(config);
  Served served(rt, config);
  auto c = served.client(60);
  const std::string model = model_id(c);
  ASSERT_FALSE(model.empty());
  const auto docs = three_documents();
  for (const auto& d : docs) rt.store_document(d);
  // The one slot is held by a request whose loader sticks in the device for 5 s:
  // the HTTP requests wait in the queue and reach their deadline there.
  auto armed = std::make_shared<std::atomic<bool>>(true);  // the hook may outlive this scope's locals
  rt.context().loader_fault = [armed](const std::string& tier, int layer) {
    if (tier == "ssd" && layer == 1 && armed->exchange(false)) std::this_thread::sleep_for(5s);
  };
  Pending blocker;
  rt.submit(rag_request(docs), blocker.callbacks());
  ASSERT_TRUE(testing::settles([&] { return rt.in_flight() == 1; }));
  for (const bool stream : {false, true}) {
    const json body = {{"model", model},
                       {"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                       {"max_tokens", 4},
                       {"stream", stream}};
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 504) << r->body;
    EXPECT_GE(seconds_since(t0), 0.9);
    const json e = json::parse(r->body);
    EXPECT_EQ(e["error"]["code"], "timeout") << r->body;
    EXPECT_EQ(e["error"]["type"], "server_error");
    EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("limits.max_request_seconds (1 s)"));
  }
  const RequestResult b = blocker.get();
  EXPECT_TRUE(b.deadline_exceeded);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_THAT(m->body, HasSubstr("blendserve_http_responses_total{route=\"/v1/chat/completions\",status=\"504\"} 2\n"));
}

TEST(Deadlines, ARequestThatCannotStopIsFailedWhereItStandsTenSecondsAfterItsDeadline) {
  REQUIRE_MODEL();
  TempDir dir;
  RuntimeConfig config = ssd_only_in(dir.path());
  // 2 s in Release; under the sanitizers 5 s, so that the short request at the end
  // (0.65 s there alone, more beside two other sanitizer tests) is well within it.
  const double limit = kDeadlineSeconds > 2 ? 5 : 2;
  config.max_request_seconds = limit;
  Runtime rt(config);
  const auto docs = three_documents();
  for (const auto& d : docs) rt.store_document(d);
  // The loader sticks in the device at layer 1 until 4 s after the request would be
  // failed where it stands: the prefill waits for it and a cancel cannot stop it.
  auto armed = std::make_shared<std::atomic<bool>>(true);  // the hook may outlive this scope's locals
  rt.context().loader_fault = [armed, limit](const std::string& tier, int layer) {
    if (tier == "ssd" && layer == 1 && armed->exchange(false)) std::this_thread::sleep_for(std::chrono::duration<double>(limit + 14));
  };
  Pending stuck;
  const auto t0 = std::chrono::steady_clock::now();
  rt.submit(rag_request(docs), stuck.callbacks());
  const RequestResult r = stuck.get();
  const double took = seconds_since(t0);
  EXPECT_EQ(r.finish_reason, "error");
  EXPECT_TRUE(r.deadline_exceeded);
  EXPECT_THAT(r.error, HasSubstr("had not stopped 10 s later"));
  EXPECT_GE(took, limit + 9.5);
  EXPECT_LT(took, limit + 13.9) << "it waited for the stuck loader instead of failing it";
  // The runtime serves on (a short request well within the limit).
  EXPECT_TRUE(testing::settles([&] { return rt.in_flight() == 0; }, 30));
  const RequestResult ok = rt.run(plain_request());
  EXPECT_NE(ok.finish_reason, "error") << ok.error;
}

}  // namespace
}  // namespace bs
