#include "actors/runtime/stream_delivery.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

namespace bs {

// One queued callback: a piece of text, or the end.
struct StreamDelivery::Item {
  bool done = false;
  std::string text;
  RequestResult result;
};

struct StreamDelivery::Stream {
  RequestCallbacks caller;
  std::deque<Item> items;     // State::mu
  size_t pending_bytes = 0;   // State::mu: text queued and not yet delivered
  bool scheduled = false;     // State::mu: in `ready` or being run by a thread
  bool overflowed = false;    // State::mu
  std::atomic<bool> cancel{false};  // the caller answered false, or fell behind
};

// Shared with the threads, so a thread left behind in a stuck callback at shutdown
// never touches freed memory when the callback finally returns.
struct StreamDelivery::State {
  explicit State(size_t max_pending) : max_pending_bytes(max_pending) {}
  const size_t max_pending_bytes;
  std::mutex mu;
  std::condition_variable ready_cv, idle_cv;
  std::deque<std::shared_ptr<Stream>> ready;  // streams with queued items and no thread on them
  int running = 0;                            // streams a thread is on now
  int64_t overflowed = 0;
  bool stopping = false;

  void schedule(const std::shared_ptr<Stream>& s) {  // mu held
    if (s->scheduled) return;
    s->scheduled = true;
    ready.push_back(s);
    ready_cv.notify_one();
  }
};

namespace {

void run_streams(const std::shared_ptr<StreamDelivery::State>& st, const std::shared_ptr<std::atomic<bool>>& exited);

}  // namespace

StreamDelivery::StreamDelivery(int threads, size_t max_pending_bytes)
    : state_(std::make_shared<State>(max_pending_bytes)) {
  for (int i = 0; i < std::max(threads, 1); ++i) {
    auto exited = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({std::thread([st = state_, exited] { run_streams(st, exited); }), exited});
  }
}

StreamDelivery::~StreamDelivery() { shutdown(std::chrono::seconds(0)); }

RequestCallbacks StreamDelivery::wrap(RequestCallbacks caller) {
  auto s = std::make_shared<Stream>();
  const bool has_text = static_cast<bool>(caller.on_text), has_done = static_cast<bool>(caller.on_done);
  s->caller = std::move(caller);
  RequestCallbacks w;
  if (has_text)
    w.on_text = [st = state_, s](std::string_view text) {
      if (s->cancel.load()) return false;
      std::lock_guard<std::mutex> lock(st->mu);
      if (s->pending_bytes + text.size() > st->max_pending_bytes) {
        s->overflowed = true;
        s->cancel = true;
        ++st->overflowed;
        return false;
      }
      s->items.push_back({false, std::string(text), {}});
      s->pending_bytes += text.size();
      st->schedule(s);
      return true;
    };
  if (has_done)
    w.on_done = [st = state_, s](const RequestResult& r) {
      std::lock_guard<std::mutex> lock(st->mu);
      Item item{true, {}, r};
      if (s->overflowed && item.result.finish_reason == "cancelled") {
        item.result.finish_reason = "error";
        item.result.error = "the caller fell behind the stream by more than " + std::to_string(st->max_pending_bytes) +
                            " bytes of text; the request was cancelled";
      }
      s->items.push_back(std::move(item));
      st->schedule(s);
    };
  return w;
}

size_t StreamDelivery::shutdown(std::chrono::steady_clock::duration deadline) {
  size_t left = 0;
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (threads_.empty()) return 0;
    state_->stopping = true;
    state_->ready_cv.notify_all();
    state_->idle_cv.wait_for(lock, deadline, [&] { return state_->ready.empty() && state_->running == 0; });
    left = state_->ready.size() + static_cast<size_t>(state_->running);
  }
  state_->ready_cv.notify_all();
  for (auto& t : threads_) {
    // A thread still in a caller's callback is left behind (it holds the shared state).
    if (left == 0 || t.exited->load()) t.thread.join();
    else t.thread.detach();
  }
  threads_.clear();
  if (left > 0)
    std::fprintf(stderr, "blendserve: shutdown: %zu streams' callbacks had not returned; left behind\n", left);
  return left;
}

int64_t StreamDelivery::overflowed() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->overflowed;
}

namespace {

void run_streams(const std::shared_ptr<StreamDelivery::State>& st, const std::shared_ptr<std::atomic<bool>>& exited) {
  using Item = StreamDelivery::Item;
  while (true) {
    std::shared_ptr<StreamDelivery::Stream> s;
    {
      std::unique_lock<std::mutex> lock(st->mu);
      st->ready_cv.wait(lock, [&] { return st->stopping || !st->ready.empty(); });
      if (st->ready.empty()) break;  // stopping, nothing left to run
      s = std::move(st->ready.front());
      st->ready.pop_front();
      ++st->running;
    }
    // This stream's items in order, until none is left (then it is free to be
    // scheduled again by its next item).
    while (true) {
      Item item;
      {
        std::lock_guard<std::mutex> lock(st->mu);
        if (s->items.empty()) {
          s->scheduled = false;
          --st->running;
          st->idle_cv.notify_all();
          break;
        }
        item = std::move(s->items.front());
        s->items.pop_front();
        if (!item.done) s->pending_bytes -= item.text.size();
      }
      if (item.done) {
        if (s->caller.on_done) s->caller.on_done(item.result);
      } else if (!s->cancel.load() && s->caller.on_text && !s->caller.on_text(item.text)) {
        s->cancel = true;  // the decoder learns it at this stream's next piece of text
      }
    }
  }
  exited->store(true);
}

}  // namespace

}  // namespace bs
