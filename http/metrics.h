// GET /metrics: the server's counters in the Prometheus text format (0.0.4).
// Hand-written (a few counters and fixed-bucket histograms; no Prometheus client
// library is packaged in Debian 12's set we build from). Thread-safe: handlers
// record from many threads, one mutex (a handful of additions per request).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/runtime/request.h"

namespace bs::http {

// `v` as a Prometheus label value's text: backslash, double quote and newline escaped.
std::string label_escape(const std::string& v);

// Cumulative histogram with fixed upper bounds (the +Inf bucket is implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void observe(double v);
  // Appends the _bucket/_sum/_count lines of `name`.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative
  int64_t count_ = 0;
  double sum_ = 0;
};

// A value the server reads at scrape time (queue depth, tier bytes), or a counter
// kept elsewhere (an actor's messages) that the server reads the same way.
struct Gauge {
  std::string name, help, labels;  // labels: `tier="ram"` or empty
  double value = 0;
  std::string type = "gauge";  // or "counter" (monotonic; name ends in _total)
};

class ServerMetrics {
 public:
  ServerMetrics();
  // Every HTTP answer, by route and status.
  void count_response(const std::string& route, int status);
  // A chat completion that ran (whatever its end): time to first token, latency,
  // tokens in and out, where its chunks came from, the ratio it recomputed.
  // The stored tiers' names: their chunk counters show from the start (at 0).
  void declare_tiers(const std::vector<std::string>& tiers);
  void observe_completion(const RequestResult& r);
  // A request the client left before it finished.
  void count_disconnect();
  std::string render(const std::vector<Gauge>& gauges) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> responses_;
  Histogram ttft_, latency_, ratio_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0, recomputed_tokens_ = 0;
  std::map<std::string, int64_t> chunks_;  // by tier ("ram", "ssd", ..., "miss")
  int64_t disconnects_ = 0;
};

}  // namespace bs::http
