// A completion or a small request forwarded by the frontend (http/frontend.cpp) to a
// worker: the Upstream a forward-pool thread reads the worker's answer into while the
// HTTP thread waits on it and relays it, the pool of those threads, and the read itself.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "http/frontend.h"

namespace bs::http {

// One request forwarded to a worker, read by a thread of the forward pool: the HTTP
// thread waits on it (for the first token, or the whole answer) and then relays
// what it holds. The fields below `mu` are the reader's to write, under mu.
struct Upstream {
  std::mutex mu;
  std::condition_variable cv;
  // A duplicate of the reader's socket while its request runs: abort() shuts the
  // socket down through it (a shutdown acts on the socket, whichever descriptor
  // names it, and this one cannot be reused for another socket while held), which
  // ends a blocked connect, TLS handshake or read at once. (httplib's
  // Client::stop() would wait for a TLS handshake to finish.)
  int socket_dup = -1;
  std::string pending;  // bytes received and not yet relayed
  std::string scan;     // streamed bytes not yet split into SSE events (first-token detection)
  bool got_status = false;
  int status = 0;
  std::string content_type;
  bool first_token = false, done = false, failed = false;
  bool refused = false;  // never sent: the forward pool was full
  std::string error;  // transport failure (refused, reset, timeout)
  std::atomic<bool> cancel{false};

  // Ends the forward now: the reader's socket is shut down (a frozen worker holds
  // no thread past this), and the worker sees its caller gone and cancels the
  // request. Safe from any thread, before, during or after the request.
  void abort() {
    cancel = true;
    std::lock_guard<std::mutex> lock(mu);
    if (socket_dup >= 0) ::shutdown(socket_dup, SHUT_RDWR);
  }
};

// The threads that run forwards: a fixed number, started once, with a queue as long
// as there are threads (a forward waits only while every thread is busy). Full: the
// forward is refused at once (the caller answers 503). No thread per request, none
// detached: the destructor aborts nothing itself (the server aborts its upstreams
// first) and joins.
class ForwardPool {
 public:
  explicit ForwardPool(size_t threads) : bound_(threads) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~ForwardPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // False when `bound` forwards wait already, or after shutdown.
  bool submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || queue_.size() >= bound_) return false;
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
  }
  size_t size() const { return threads_.size(); }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }
  const size_t bound_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Whether one SSE event ("data: {...}") carries generated text.
bool event_has_token(std::string_view event);

// Sends the request to worker `w` (HTTPS in a TLS cluster, with `key` as its bearer
// token) and reads the answer into `u` as it arrives: the status, the bytes, for a
// stream whether an event with a token came (first-token detection). Ends with u->done
// (and u->failed with the transport's error). connect_s bounds the connect, idle_s
// every read. Runs on a forward-pool thread; u->abort() ends it from any thread.
void run_upstream(std::shared_ptr<Upstream> u, FrontendWorker w, const tls::Files& tls, std::string key,
                  std::string method, std::string path, std::string body, double connect_s, double idle_s,
                  bool stream);

}  // namespace bs::http
