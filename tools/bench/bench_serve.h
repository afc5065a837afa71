// blendctl bench serve: a bounded RAG workload against a running `blendserve serve`
// (or one it spawns) over loopback HTTP, `blend` against `full` at the same offered
// load, closed loop (N clients) and open loop (Poisson arrivals). JSON lines on stdout.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace bs::tools {

struct ServeBenchOptions {
  std::string url = "http://127.0.0.1:8000";
  bool spawn = false;          // start build/blendserve (next to blendctl) on a free port, stop it at the end
  std::string server_config;   // --config passed to the spawned server
  double spawn_timeout_s = 180;
  std::string api_key;         // Authorization: Bearer (empty: none)
  std::string model_path;      // tokenizer only: sizes the synthetic documents in tokens
  std::string dataset;         // JSON lines whose "documents" and "question" provide the text
  int documents = 100;
  int doc_tokens = 512;
  int retrieve = 6;
  double zipf = 1.0;
  int requests = 16;           // per (mode, load point)
  std::vector<int> clients{1, 2, 4, 8};
  std::vector<double> rates;   // req/s; empty: derived from the closed-loop throughputs
  std::vector<std::string> modes{"blend", "full"};
  int max_tokens = 16;
  double slo_p99 = 0;          // seconds; 0: 2x the reference mode's median TTFT at its lowest load
  uint64_t seed = 1;
  int warmup = 2;              // unmeasured requests per mode before measuring
  bool all_points = false;     // open loop: keep raising the rate after a mode missed the SLO
  int extend = 2;              // open loop: extra rates per mode (halving/doubling) to bracket its SLO rate
  bool keep_documents = false; // do not DELETE the uploaded documents at the end
  double request_timeout_s = 600;
};
int bench_serve(const ServeBenchOptions& opt);

// Server-sent events from a byte stream that arrives in arbitrary pieces: calls
// `on_data` with each event's data (several data lines joined by '\n') when the
// blank line that ends it arrives. Comments and other fields are ignored; CRLF and
// LF line ends both work.
class SseParser {
 public:
  explicit SseParser(std::function<void(std::string_view)> on_data) : on_data_(std::move(on_data)) {}
  void feed(std::string_view bytes);
  void finish();  // the stream ended: an event missing its blank line still counts
 private:
  void line(std::string_view l);
  std::function<void(std::string_view)> on_data_;
  std::string pending_;  // an incomplete line
  std::string data_;     // the current event's data
  bool has_data_ = false;
};

// `count` distinct indices out of [0, n) drawn without replacement with
// P(rank k) proportional to 1/(k+1)^s (index 0 the most popular).
class ZipfSampler {
 public:
  ZipfSampler(int n, double s);
  std::vector<int> draw(int count, std::mt19937_64& rng) const;
  double probability(int k) const { return weights_[k] / total_; }

 private:
  std::vector<double> weights_;
  double total_ = 0;
};

}  // namespace bs::tools
