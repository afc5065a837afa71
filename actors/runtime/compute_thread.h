// The thread that owns the cores. Every heavy job of one device rank (prefill,
// decode steps, write-back chunk computes) runs here, never on CAF's scheduler
// threads: libgomp's worker threads busy-wait between parallel regions, and on a
// 2-core machine anything else computing at the same time collapses both. Jobs
// are plain closures; results go back to actors by message from inside the job.
// Two priorities: latency-critical work (prefill, decode) runs before background
// work (write-back), one job at a time — except that a background job that has
// waited `background_max_wait` runs next even when urgent work is queued, so steady
// urgent work (many streams decoding) cannot starve the write-back for ever.
// Both queues are bounded: the background queue by `max_background` jobs (a submit
// beyond it is refused and counted: background work is write-back, a cache that is
// recomputed on the next miss), the urgent one by what submits to it — each admitted
// request has at most one prefill step or document compute queued, and the decoding
// streams one step between them (limits.max_requests bounds it).
// When it has run out of jobs for `IdleHook::after`, it runs the idle hook once, on
// itself (the runtime frees the thread's scratch there: Backend::release_scratch), so
// a server between requests does not hold the activations of its longest prompt; the
// short gaps between one stream's decode steps never reach it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "actors/runtime/actor_counters.h"

namespace bs {

// What a compute thread runs, on itself, once it has had no job for `after` (again only
// after another job). No `run`: nothing.
struct ComputeIdleHook {
  std::chrono::steady_clock::duration after{};
  std::function<void()> run;
};

class ComputeThread {
 public:
  enum class Priority { Urgent, Background };
  using IdleHook = ComputeIdleHook;
  // threads: OpenMP threads for the jobs (0 = all cores). counters: where it
  // reports to the inspector as an actor would (jobs as messages, the queue as
  // its mailbox); may be null.
  // max_background: background jobs queued at most.
  explicit ComputeThread(int threads,
                         std::chrono::steady_clock::duration background_max_wait = std::chrono::seconds(2),
                         CountersPtr counters = nullptr, size_t max_background = kDefaultMaxBackground,
                         IdleHook idle = {});
  static constexpr size_t kDefaultMaxBackground = 256;
  ~ComputeThread();  // stop(false)
  ComputeThread(const ComputeThread&) = delete;
  ComputeThread& operator=(const ComputeThread&) = delete;

  // False after stop(), and for a background job when max_background are queued
  // (counted in background_refused()). Urgent jobs queued before stop() still run.
  bool submit(std::function<void()> job, Priority p = Priority::Urgent);
  int64_t background_refused() const;
  // Joins the thread after the queued urgent jobs; queued background jobs run
  // too with finish_background, else they are dropped.
  void stop(bool finish_background = false);
  int64_t queued() const;
  double busy_seconds() const;
  int64_t jobs_done() const;
  // How many times the idle hook ran.
  int64_t idle_runs() const;
  const CountersPtr& counters() const { return counters_; }

 private:
  void loop(int threads);
  void run_idle_hook();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Background {
    std::function<void()> job;
    std::chrono::steady_clock::time_point queued;
  };
  std::deque<std::function<void()>> urgent_;
  std::deque<Background> background_;
  std::chrono::steady_clock::duration background_max_wait_;
  size_t max_background_;
  int64_t background_refused_ = 0;
  bool stopping_ = false;
  int64_t done_ = 0;
  IdleHook idle_;
  int64_t idle_runs_ = 0;
  double busy_ = 0;
  CountersPtr counters_;
  std::thread thread_;
};

}  // namespace bs
