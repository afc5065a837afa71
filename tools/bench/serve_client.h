// The HTTP side of `blendctl bench serve` (tools/bench/bench_serve.cpp): clients of
// the server under test, whole calls, and one streamed chat completion read as a
// strict client would, its timings (TTFT, latency) and every deviation from the API
// contract counted (Violations).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace bs::tools::serve {

using Clock = std::chrono::steady_clock;

// Deviations from the API contract, counted once per message (reported in the summary).
class Violations {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (counts_[what]++ == 0) std::fprintf(stderr, "bench serve: server deviates from the API: %s\n", what.c_str());
  }
  nlohmann::json to_json() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, int> counts_;
};

struct Endpoint {
  std::string url;
  std::string api_key;
  double read_timeout_s = 600;
};

// A client of the server at ep.url (its bearer key, 5 s to connect, `read_timeout_s` per read).
std::unique_ptr<httplib::Client> make_client(const Endpoint& ep, double read_timeout_s);

// A transport error in words a user acts on.
std::string describe(httplib::Error e);

// The message of an OpenAI error body, else its first 300 bytes.
std::string error_message(const std::string& body);

struct HttpReply {
  int status = 0;
  std::string body;
  std::string retry_after;
};

// A request that fails to reach the server throws, naming the URL and the cause.
HttpReply call(const Endpoint& ep, const std::string& method, const std::string& path, const std::string& body = "",
               double timeout_s = 600);

enum class Kind { Ok, Rejected, Error };

struct Outcome {
  Kind kind = Kind::Error;
  int status = 0;
  std::string error;
  double send_s = 0;                  // since the load point started
  double ttft = std::nan(""), latency = std::nan("");
  double first_s = std::nan(""), end_s = std::nan("");  // first content / end, since the point started
  bool usage = false;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  int content_deltas = 0;
  std::string finish_reason;
};

// One streamed chat completion of `body`, timed from `epoch`; deviations go to `v`.
Outcome stream_request(const Endpoint& ep, const std::string& body, Clock::time_point epoch, Violations& v);

}  // namespace bs::tools::serve
