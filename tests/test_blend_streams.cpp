// The runtime's per-stream delivery on the real model (issue 42): a caller whose
// on_text is stuck holds only its own stream — another request decodes and ends
// meanwhile, about as fast as alone — and its own request still ends when released;
// a runtime shut down while a caller's callback is stuck stops within the callback
// drain (10 s) plus its usual time instead of waiting for the caller. Bounded waits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "actors/runtime/runtime.h"
#include "counting_request.h"
#include "model_fixture.h"
#include "settles.h"
#include "temp_dir.h"

namespace bs {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using testing::TempDir;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

RuntimeConfig config_in(const TempDir& dir) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.path().string();
  return c;
}

// A stream whose caller blocks in its first on_text until released (30 s at most).
struct StuckCaller {
  std::shared_ptr<std::promise<void>> release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::promise<RequestResult>> done = std::make_shared<std::promise<RequestResult>>();
  RequestCallbacks callbacks() const {
    RequestCallbacks cb;
    cb.on_text = [released = released, calls = calls](std::string_view) {
      if (calls->fetch_add(1) == 0) released.wait_for(30s);
      return true;
    };
    cb.on_done = [done = done](const RequestResult& r) { done->set_value(r); };
    return cb;
  }
};

TEST(Streams, AStuckCallerHoldsOnlyItsOwnStream) {
  REQUIRE_MODEL();
  TempDir dir;
  Runtime rt(config_in(dir));
  const auto t_alone = clock_type::now();
  const RequestResult alone = rt.run(testing::counting_request(24));
  const double alone_s = seconds_since(t_alone);
  ASSERT_EQ(alone.tokens.size(), 24u);

  StuckCaller stuck;
  rt.submit(testing::counting_request(48), stuck.callbacks());
  ASSERT_TRUE(testing::settles([&] { return stuck.calls->load() >= 1; }, 30));
  const auto t0 = clock_type::now();
  const RequestResult other = rt.run(testing::counting_request(24));
  const double other_s = seconds_since(t0);
  EXPECT_EQ(other.tokens, alone.tokens);
  EXPECT_EQ(stuck.calls->load(), 1) << "the stuck caller was not stuck";
  std::printf("[ measured ] a 24-token stream alone %.3f s, beside a stuck caller's stream %.3f s\n", alone_s, other_s);
  EXPECT_LT(other_s, 3 * alone_s + 2) << "the other stream waited for the stuck caller";
  // Released, the stuck caller gets all of its text and its end.
  stuck.release->set_value();
  auto f = stuck.done->get_future();
  ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
  const RequestResult r = f.get();
  EXPECT_EQ(r.tokens.size(), 48u);
  EXPECT_GE(stuck.calls->load(), 2);
}

TEST(Streams, ShutdownWithAStuckCallbackIsBounded) {
  REQUIRE_MODEL();
  TempDir dir;
  auto rt = std::make_unique<Runtime>(config_in(dir));
  StuckCaller stuck;
  rt->submit(testing::counting_request(200), stuck.callbacks());
  ASSERT_TRUE(testing::settles([&] { return stuck.calls->load() >= 1; }, 30));
  const auto t0 = clock_type::now();
  rt->shutdown();
  const double took = seconds_since(t0);
  std::printf("[ measured ] shutdown with a caller stuck in on_text: %.2f s\n", took);
  EXPECT_GE(took, 9.5);  // the callback drain: the stuck caller's end waited for, that long
  EXPECT_LT(took, 20);
  rt.reset();
  stuck.release->set_value();  // the thread left behind delivers the end and finishes
  auto f = stuck.done->get_future();
  ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(f.get().finish_reason, "cancelled");
}

}  // namespace
}  // namespace bs
