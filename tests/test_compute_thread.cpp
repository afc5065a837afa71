// The compute thread's two queues: urgent jobs (prefill, decode) run before
// background jobs (write-back), but a background job that has waited its bound runs
// even while urgent work keeps coming, so many decoding streams cannot starve the
// write-back for ever; stop() finishes urgent work and runs or drops the background;
// the background queue is bounded; the idle hook (where the runtime frees a thread's
// scratch) runs on the thread once it has had no job for its pause, once per idle spell.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/runtime/compute_thread.h"

namespace bs {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

TEST(ComputeThread, UrgentJobsRunBeforeBackgroundJobs) {
  ComputeThread ct(1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::mutex mu;
  std::vector<std::string> order;
  auto log = [&](std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(std::move(s));
  };
  std::promise<void> started;
  ASSERT_TRUE(ct.submit([&] {
    started.set_value();
    released.wait_for(30s);
  }));
  started.get_future().wait();  // the blocker runs: everything below queues behind it
  ASSERT_TRUE(ct.submit([&] { log("background"); }, ComputeThread::Priority::Background));
  ASSERT_TRUE(ct.submit([&] { log("urgent 1"); }));
  ASSERT_TRUE(ct.submit([&] { log("urgent 2"); }));
  EXPECT_EQ(ct.queued(), 3);
  release.set_value();
  ct.stop(/*finish_background=*/true);
  EXPECT_EQ(order, (std::vector<std::string>{"urgent 1", "urgent 2", "background"}));
  EXPECT_EQ(ct.jobs_done(), 4);
  EXPECT_FALSE(ct.submit([] {}));  // stopped
}

TEST(ComputeThread, SteadyUrgentWorkDoesNotStarveABackgroundJob) {
  const auto max_wait = 200ms;
  ComputeThread ct(1, max_wait);
  // Urgent work that never lets the urgent queue run dry for 3 s: five steps in the
  // queue, each queueing the next before it ends (as decode steps of many streams do).
  const auto until = clock_type::now() + 3s;
  std::atomic<int64_t> urgent_done{0};
  std::function<void()> step = [&] {
    if (clock_type::now() < until) ct.submit(step);
    std::this_thread::sleep_for(1ms);
    urgent_done.fetch_add(1);
  };
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ct.submit(step));
  std::this_thread::sleep_for(20ms);  // the urgent queue is full now
  const auto queued_at = clock_type::now();
  std::promise<clock_type::time_point> ran;
  ASSERT_TRUE(ct.submit([&] { ran.set_value(clock_type::now()); }, ComputeThread::Priority::Background));
  auto when = ran.get_future();
  ASSERT_EQ(when.wait_for(10s), std::future_status::ready) << "the background job was starved";
  const double waited = std::chrono::duration<double>(when.get() - queued_at).count();
  EXPECT_GE(waited, 0.19);  // not before its bound: urgent work goes first
  EXPECT_LT(waited, 1.0);   // but soon after it (one urgent job of ~1 ms in between)
  EXPECT_GT(ct.queued(), 0);  // urgent work was still waiting when it ran
  ct.stop(false);
  EXPECT_GT(urgent_done.load(), 50);
}

TEST(ComputeThread, StopDropsQueuedBackgroundJobsUnlessAskedToFinishThem) {
  for (bool finish : {false, true}) {
    ComputeThread ct(1);
    std::promise<void> release, started;
    std::shared_future<void> released = release.get_future().share();
    std::atomic<int> background_ran{0}, urgent_ran{0};
    ASSERT_TRUE(ct.submit([&] {
      started.set_value();
      released.wait_for(30s);
    }));
    started.get_future().wait();
    ASSERT_TRUE(ct.submit([&] { background_ran.fetch_add(1); }, ComputeThread::Priority::Background));
    ASSERT_TRUE(ct.submit([&] { urgent_ran.fetch_add(1); }));
    std::thread stopper([&] { ct.stop(finish); });
    // Once submit() is refused, stop() has begun (what it queued meanwhile is no-ops).
    const auto deadline = clock_type::now() + 10s;
    while (ct.submit([] {}) && clock_type::now() < deadline) std::this_thread::sleep_for(1ms);
    release.set_value();
    stopper.join();
    EXPECT_EQ(urgent_ran.load(), 1);  // urgent work queued before stop() always runs
    EXPECT_EQ(background_ran.load(), finish ? 1 : 0);
  }
}

// The background queue holds at most max_background jobs: one more is refused and
// counted (urgent jobs are not), and once the queue drains it takes jobs again.
TEST(ComputeThread, TheBackgroundQueueIsBounded) {
  ComputeThread ct(1, 2s, nullptr, 3);
  std::promise<void> release, started;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  ASSERT_TRUE(ct.submit([&] {
    started.set_value();
    released.wait_for(30s);
  }));
  started.get_future().wait();
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(ct.submit([&] { ran.fetch_add(1); }, ComputeThread::Priority::Background));
  EXPECT_FALSE(ct.submit([&] { ran.fetch_add(100); }, ComputeThread::Priority::Background));
  EXPECT_EQ(ct.background_refused(), 1);
  EXPECT_TRUE(ct.submit([&] { ran.fetch_add(10); }));  // urgent: not bounded here
  EXPECT_EQ(ct.queued(), 4);
  release.set_value();
  const auto deadline = clock_type::now() + 10s;
  while (ran.load() < 13 && clock_type::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(ran.load(), 13);
  EXPECT_TRUE(ct.submit([&] { ran.fetch_add(1); }, ComputeThread::Priority::Background));
  ct.stop(true);
  EXPECT_EQ(ran.load(), 14);
  EXPECT_EQ(ct.background_refused(), 1);
}

TEST(ComputeThread, TheIdleHookRunsOnTheThreadOnceItHasHadNoJobForItsPause) {
  const auto pause = 1s;
  std::thread::id hook_thread, job_thread;
  ComputeThread ct(1, 2s, nullptr, ComputeThread::kDefaultMaxBackground,
                   {pause, [&] { hook_thread = std::this_thread::get_id(); }});
  std::this_thread::sleep_for(pause + 200ms);
  EXPECT_EQ(ct.idle_runs(), 0);  // no job has run: nothing to free
  // Twenty jobs, each queueing the next (the queue never runs dry, as a stream's
  // steps or back-to-back requests): the hook does not run between them.
  // Read inside the last job: the hook cannot run while a job does, so this is the
  // count over the whole chain, whatever the test thread's timing.
  int left = 20;
  int64_t runs_during_chain = -1;
  std::promise<void> chain_done;
  std::function<void()> step = [&] {
    job_thread = std::this_thread::get_id();
    if (--left > 0) {
      ct.submit(step);
    } else {
      runs_during_chain = ct.idle_runs();
      chain_done.set_value();
    }
  };
  const auto t0 = clock_type::now();
  ASSERT_TRUE(ct.submit(step));
  chain_done.get_future().wait();
  EXPECT_EQ(runs_during_chain, 0);
  const auto wait_for_runs = [&](int64_t n) {
    const auto deadline = clock_type::now() + 20s;
    while (ct.idle_runs() < n && clock_type::now() < deadline) std::this_thread::sleep_for(5ms);
    return ct.idle_runs();
  };
  EXPECT_EQ(wait_for_runs(1), 1);
  EXPECT_GE(clock_type::now() - t0, pause);
  EXPECT_EQ(hook_thread, job_thread);  // on the compute thread itself (read after idle_runs' lock)
  std::this_thread::sleep_for(2 * pause + 200ms);
  EXPECT_EQ(ct.idle_runs(), 1);  // once per idle spell
  ASSERT_TRUE(ct.submit([] {}, ComputeThread::Priority::Background));
  EXPECT_EQ(wait_for_runs(2), 2);  // and again after the next job
  ct.stop();
}

}  // namespace
}  // namespace bs
