// Per-stream delivery of callers' callbacks (actors/runtime/stream_delivery.h) on its own: text
// and the end arrive in order on a delivery thread, never on the caller of the wrapper;
// a stuck callback holds only its own stream; a caller that falls behind by more than
// the bound is cancelled and told why; shutdown leaves a stuck callback behind after
// its deadline instead of waiting for it. Every wait is bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/runtime/stream_delivery.h"
#include "settles.h"

namespace bs {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

RequestResult ended(const std::string& reason) {
  RequestResult r;
  r.finish_reason = reason;
  return r;
}

TEST(StreamDelivery, TextThenTheEndInOrderOnADeliveryThread) {
  StreamDelivery d(2, 1 << 20);
  std::mutex mu;
  std::string text;
  std::promise<RequestResult> done;
  std::atomic<bool> on_caller_thread{false};
  const auto me = std::this_thread::get_id();
  RequestCallbacks cb;
  cb.on_text = [&](std::string_view t) {
    if (std::this_thread::get_id() == me) on_caller_thread = true;
    std::lock_guard<std::mutex> lock(mu);
    text += t;
    return true;
  };
  cb.on_done = [&](const RequestResult& r) { done.set_value(r); };
  RequestCallbacks w = d.wrap(std::move(cb));
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(w.on_text(std::to_string(i) + ","));
  w.on_done(ended("stop"));
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(f.get().finish_reason, "stop");
  std::string want;
  for (int i = 0; i < 100; ++i) want += std::to_string(i) + ",";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(text, want);  // all of it, in order, before the end
  EXPECT_FALSE(on_caller_thread.load());
  // Empty callbacks stay empty (the decoder then skips them).
  RequestCallbacks none = d.wrap({});
  EXPECT_FALSE(static_cast<bool>(none.on_text));
  EXPECT_FALSE(static_cast<bool>(none.on_done));
}

TEST(StreamDelivery, AStuckCallbackHoldsOnlyItsOwnStream) {
  StreamDelivery d(2, 1 << 20);
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  std::atomic<int> stuck_calls{0};
  RequestCallbacks stuck;
  stuck.on_text = [released, &stuck_calls](std::string_view) {
    ++stuck_calls;
    released.wait_for(30s);
    return true;
  };
  RequestCallbacks other;
  std::promise<std::string> other_done;
  auto other_text = std::make_shared<std::string>();
  other.on_text = [other_text](std::string_view t) {
    *other_text += t;
    return true;
  };
  other.on_done = [&, other_text](const RequestResult&) { other_done.set_value(*other_text); };
  RequestCallbacks ws = d.wrap(std::move(stuck)), wo = d.wrap(std::move(other));
  // The wrapper never blocks, however stuck the caller is.
  const auto t0 = clock_type::now();
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(ws.on_text("x"));
  EXPECT_LT(std::chrono::duration<double>(clock_type::now() - t0).count(), 1.0);
  ASSERT_TRUE(testing::settles([&] { return stuck_calls.load() == 1; }));
  for (int i = 0; i < 20; ++i) wo.on_text("y");
  wo.on_done(ended("stop"));
  auto f = other_done.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the other stream waited for the stuck one";
  EXPECT_EQ(f.get(), std::string(20, 'y'));
  release->set_value();
  EXPECT_TRUE(testing::settles([&] { return stuck_calls.load() == 50; }));
}

TEST(StreamDelivery, ACallerThatFallsBehindIsCancelledAndToldWhy) {
  StreamDelivery d(1, 64);
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  std::promise<RequestResult> done;
  RequestCallbacks cb;
  cb.on_text = [released](std::string_view) {
    released.wait_for(30s);
    return true;
  };
  cb.on_done = [&](const RequestResult& r) { done.set_value(r); };
  RequestCallbacks w = d.wrap(std::move(cb));
  int accepted = 0;
  while (accepted < 1000 && w.on_text("0123456789")) ++accepted;
  EXPECT_LE(accepted, 8);  // 64 bytes queued at most (one piece may be in the callback)
  EXPECT_FALSE(w.on_text("more"));  // stays cancelled
  EXPECT_EQ(d.overflowed(), 1);
  w.on_done(ended("cancelled"));  // what the decoder says of a stream it cancelled
  release->set_value();
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  const RequestResult r = f.get();
  EXPECT_EQ(r.finish_reason, "error");
  EXPECT_NE(r.error.find("fell behind the stream by more than 64 bytes"), std::string::npos) << r.error;
}

TEST(StreamDelivery, AnOnTextThatAnswersFalseCancelsAtTheNextPiece) {
  StreamDelivery d(1, 1 << 20);
  std::atomic<int> calls{0};
  RequestCallbacks cb;
  cb.on_text = [&](std::string_view) { return ++calls < 3; };
  RequestCallbacks w = d.wrap(std::move(cb));
  int accepted = 0;
  const auto deadline = clock_type::now() + 10s;
  while (clock_type::now() < deadline && w.on_text("z")) {
    ++accepted;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(calls.load(), 3);  // the caller's third call said stop; nothing after it
  EXPECT_GE(accepted, 3);
}

TEST(StreamDelivery, ShutdownLeavesAStuckCallbackBehindAfterItsDeadline) {
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  auto d = std::make_unique<StreamDelivery>(2, 1 << 20);
  std::atomic<bool> in_callback{false};
  RequestCallbacks cb;
  cb.on_done = [released, &in_callback](const RequestResult&) {
    in_callback = true;
    released.wait_for(30s);
  };
  RequestCallbacks w = d->wrap(std::move(cb));
  w.on_done(ended("stop"));
  ASSERT_TRUE(testing::settles([&] { return in_callback.load(); }));
  const auto t0 = clock_type::now();
  EXPECT_EQ(d->shutdown(500ms), 1u);
  const double took = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 5.0);
  d.reset();  // destroyed while its thread is still in the callback
  release->set_value();  // the thread left behind finishes on the state it holds
  std::this_thread::sleep_for(50ms);
}

}  // namespace
}  // namespace bs
