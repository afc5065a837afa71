#include "actors/runtime/compute_thread.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>

#include <omp.h>

namespace bs {

ComputeThread::ComputeThread(int threads, std::chrono::steady_clock::duration background_max_wait,
                             CountersPtr counters, size_t max_background, IdleHook idle)
    : background_max_wait_(background_max_wait),
      max_background_(max_background),
      idle_(std::move(idle)),
      counters_(std::move(counters)),
      thread_([this, threads] { loop(threads); }) {}

ComputeThread::~ComputeThread() { stop(false); }

bool ComputeThread::submit(std::function<void()> job, Priority p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    if (p == Priority::Urgent) {
      urgent_.push_back(std::move(job));
    } else if (background_.size() >= max_background_) {
      ++background_refused_;
      return false;
    } else {
      background_.push_back({std::move(job), std::chrono::steady_clock::now()});
    }
  }
  cv_.notify_one();
  return true;
}

void ComputeThread::stop(bool finish_background) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    if (!finish_background) background_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

int64_t ComputeThread::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(urgent_.size() + background_.size());
}

int64_t ComputeThread::background_refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return background_refused_;
}

double ComputeThread::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

int64_t ComputeThread::idle_runs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_runs_;
}

int64_t ComputeThread::jobs_done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void ComputeThread::run_idle_hook() {
  try {
    idle_.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blendserve: the compute thread's idle hook failed: %s\n", e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++idle_runs_;
}

void ComputeThread::loop(int threads) {
  // The OpenMP thread count is a per-thread setting: this one sizes the team of
  // every parallel region this thread starts (oneDNN's and ours).
  if (threads > 0) omp_set_num_threads(threads);
  bool idle_due = false;  // a job ran since the idle hook last did
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto ready = [&] { return stopping_ || !urgent_.empty() || !background_.empty(); };
      if (idle_due && idle_.run && !cv_.wait_for(lock, idle_.after, ready)) {
        idle_due = false;
        lock.unlock();
        run_idle_hook();
        continue;
      }
      cv_.wait(lock, ready);
      const bool overdue = !background_.empty() &&
                           std::chrono::steady_clock::now() - background_.front().queued >= background_max_wait_;
      if (!urgent_.empty() && !overdue) {
        job = std::move(urgent_.front());
        urgent_.pop_front();
      } else if (!background_.empty()) {
        job = std::move(background_.front().job);
        background_.pop_front();
      } else {
        return;  // stopping and nothing urgent left
      }
      if (counters_) counters_->mailbox.store(static_cast<int64_t>(urgent_.size() + background_.size()));
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<BusyScope> busy;
    if (counters_) busy = std::make_unique<BusyScope>(*counters_, static_cast<size_t>(counters_->mailbox.load()));
    try {
      job();
    } catch (const std::exception& e) {
      // Jobs report their own errors by message; this is a last resort.
      std::fprintf(stderr, "blendserve: compute job failed: %s\n", e.what());
      if (counters_) counters_->set_error(std::string("a compute job failed: ") + e.what());
    }
    busy.reset();
    idle_due = true;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    busy_ += dt;
    ++done_;
  }
}

}  // namespace bs
