// blendctl bench serve: the serving benchmark of the OpenAI-compatible server.
//
// Workload: a pool of synthetic documents (whole passages of the QA dataset, cut to
// about --doc-tokens tokens, deterministic from the seed); every request retrieves
// --retrieve distinct documents, Zipf-skewed, plus one of the dataset's questions.
// Every document is POSTed to /v1/documents first (so `blend` finds its KV stored),
// then each mode gets a short unmeasured warm-up. Then, for the same requests at the
// same offered load, each mode in turn:
//   closed loop: N clients, each sending its next request when the last one ended,
//                until --requests requests have been sent;
//   open loop:   --requests requests with Poisson arrivals at a given rate (req/s),
//                each on its own connection whatever the server's state.
// One JSON line per (mode, load point) and a summary line: per mode the highest load
// at which p99 TTFT stays within the SLO with every request served and the server
// keeping up, and blend/full. A 429 counts as rejected and is never retried inside a
// measurement. The default SLO is 2x full's median TTFT at its lowest load.
// Beside it: the workload (serve_workload.h), the client side and the API checks
// (serve_client.h), the --spawn server (spawned_server.h).
#include "tools/bench/bench_serve.h"
#include "tools/cli/interrupt.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tools/bench/serve_client.h"
#include "tools/bench/serve_workload.h"
#include "tools/bench/spawned_server.h"
#include "tools/cli/progress.h"

namespace bs::tools {

namespace {

using namespace serve;
using json = nlohmann::json;
namespace fs = std::filesystem;

// ------------------------------------------------------------ statistics

double percentile(std::vector<double> v, double p) {  // linear interpolation (numpy's default)
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return std::nan("");
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

json num(double x, int digits = 4) {  // NaN -> null; rounded for readable lines
  if (!std::isfinite(x)) return nullptr;
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(' ', c + 1));
    }
  }
  return "unknown";
}

// ------------------------------------------------------------ progress

class PointProgress {
 public:
  PointProgress(std::string label, int total) : label_(std::move(label)), total_(total), t0_(Clock::now()) {}
  void tick() {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    const double elapsed = seconds_since(t0_);
    const double eta = elapsed / done_ * (total_ - done_);
    std::fprintf(stderr, "%s: %d/%d, %.0f s elapsed, ETA %.0f s\n", label_.c_str(), done_, total_, elapsed, eta);
  }

 private:
  std::mutex mu_;
  std::string label_;
  int total_, done_ = 0;
  Clock::time_point t0_;
};

// ------------------------------------------------------------ load points

struct PointResult {
  json line;
  std::string mode;
  bool closed = true;
  double load = 0;  // clients or offered rate
  double p99_ttft = std::nan("");
  double achieved_rps = 0;
  double decode_tok_s_total = std::nan("");
  bool all_ok = false;
  double p50_ttft = std::nan(""), p50_latency = std::nan("");
  bool kept_up = true;  // open loop: no backlog left when the arrivals ended
  int rejected = 0, errors = 0;
};

// The load is sustained within the SLO: every request served, p99 TTFT <= slo, and
// (open loop) completions kept pace with arrivals, so a short run cannot pass on a
// backlog that had no time to grow.
bool meets_slo(const PointResult& p, double slo) { return p.all_ok && p.kept_up && p.p99_ttft <= slo; }

PointResult summarize(const std::string& mode, bool closed, double load, const std::vector<Outcome>& out,
                      double wall_s, double arrival_span_s, double base_latency_s) {
  PointResult p;
  p.mode = mode;
  p.closed = closed;
  p.load = load;
  std::vector<double> ttft, lat, prompt, cached, completion, stream_rate;
  std::vector<std::pair<double, double>> decode;  // intervals with some stream decoding
  double decode_tokens = 0, output_tokens = 0, last_end = 0;
  int ok = 0, no_content = 0;
  std::map<std::string, int> errors;
  for (const auto& o : out) {
    if (o.kind == Kind::Rejected) ++p.rejected;
    if (o.kind == Kind::Error) {
      ++p.errors;
      ++errors[o.error];
    }
    if (o.kind != Kind::Ok) continue;
    ++ok;
    ttft.push_back(o.ttft);
    lat.push_back(o.latency);
    last_end = std::max(last_end, o.end_s);
    if (o.content_deltas == 0) ++no_content;
    if (o.usage) {
      prompt.push_back(static_cast<double>(o.prompt_tokens));
      cached.push_back(static_cast<double>(o.cached_tokens));
      completion.push_back(static_cast<double>(o.completion_tokens));
      output_tokens += static_cast<double>(o.completion_tokens);
    }
    const double tail = static_cast<double>(o.usage ? o.completion_tokens : o.content_deltas) - 1;
    if (tail > 0 && o.end_s > o.first_s) {
      stream_rate.push_back(tail / (o.end_s - o.first_s));
      decode.emplace_back(o.first_s, o.end_s);
      decode_tokens += tail;
    }
  }
  std::sort(decode.begin(), decode.end());
  double busy = 0, cur_a = 0, cur_b = -1;
  for (const auto& [a, b] : decode) {
    if (a > cur_b) {
      if (cur_b > cur_a) busy += cur_b - cur_a;
      cur_a = a;
      cur_b = b;
    } else {
      cur_b = std::max(cur_b, b);
    }
  }
  if (cur_b > cur_a) busy += cur_b - cur_a;
  const double span = closed ? wall_s : last_end;
  p.achieved_rps = span > 0 ? ok / span : 0;
  p.p99_ttft = percentile(ttft, 99);
  p.p50_ttft = percentile(ttft, 50);
  p.p50_latency = percentile(lat, 50);
  p.decode_tok_s_total = busy > 0 ? decode_tokens / busy : std::nan("");
  p.all_ok = ok == static_cast<int>(out.size()) && ok > 0;

  json j = {{"bench", "serve"}, {"mode", mode}, {"loop", closed ? "closed" : "open"}};
  if (closed) j["clients"] = static_cast<int>(load);
  else {
    j["rate"] = load;
    // Kept up: the throughput was at least 80% of a server's that never queues, which
    // finishes the last request base_latency_s (this mode's median latency at its
    // lowest load) after it arrived: last_end <= (arrivals span + base) / 0.8. A short
    // run at a rate the server cannot sustain ends with a backlog that this catches
    // even when a prefill-first scheduler keeps TTFT low by slowing every decode.
    const double ideal = arrival_span_s + (base_latency_s > 0 ? base_latency_s : 0);
    p.kept_up = !(base_latency_s > 0) || last_end <= ideal / 0.8;
    j["arrival_rps"] = num(arrival_span_s > 0 ? (static_cast<double>(out.size()) - 1) / arrival_span_s : 0, 3);
    j["drain_s"] = num(last_end - arrival_span_s, 3);  // last completion after the last arrival
    if (base_latency_s > 0) j["throughput_vs_ideal"] = num(last_end > 0 ? ideal / last_end : 0, 3);
    j["kept_up"] = p.kept_up;
  }
  j["requests"] = out.size();
  j["ok"] = ok;
  j["rejected"] = p.rejected;
  j["errors"] = p.errors;
  j["wall_s"] = num(span, 3);
  j["requests_per_s"] = num(p.achieved_rps, 4);
  j["ttft_p50_s"] = num(percentile(ttft, 50));
  j["ttft_p90_s"] = num(percentile(ttft, 90));
  j["ttft_p99_s"] = num(p.p99_ttft);
  j["latency_p50_s"] = num(percentile(lat, 50));
  j["latency_p99_s"] = num(percentile(lat, 99));
  j["prompt_tokens_mean"] = num(mean(prompt), 1);
  j["cached_tokens_mean"] = num(mean(cached), 1);
  j["completion_tokens_mean"] = num(mean(completion), 2);
  j["decode_tok_s_stream"] = num(mean(stream_rate), 2);     // per stream: (tokens-1)/(end-first token)
  j["decode_tok_s_total"] = num(p.decode_tok_s_total, 2);   // all streams, over the time any was decoding
  j["output_tok_s"] = num(span > 0 ? output_tokens / span : 0, 2);
  if (no_content) j["no_content"] = no_content;
  if (!errors.empty()) {
    json e = json::object();
    for (const auto& [msg, n] : errors) e[msg] = n;
    j["error_messages"] = e;
  }
  p.line = std::move(j);
  return p;
}

struct Bench {
  const ServeBenchOptions& opt;
  Endpoint ep;
  std::string model;
  std::vector<std::string> docs;
  Corpus corpus;
  Violations violations;

  std::string body(const RagRequest& r, const std::string& mode) const {
    json d = json::array();
    for (int i : r.docs) d.push_back(docs[i]);
    json j = {{"model", model},
              {"messages", json::array({{{"role", "user"}, {"content", corpus.questions[r.question]}}})},
              {"documents", std::move(d)},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"max_tokens", opt.max_tokens},
              {"temperature", 0},
              {"mode", mode}};
    return j.dump();
  }

  std::vector<Outcome> closed_loop(const std::vector<RagRequest>& reqs, const std::string& mode, int clients,
                                   PointProgress& prog, double& wall_s) {
    std::vector<std::string> bodies;
    for (const auto& r : reqs) bodies.push_back(body(r, mode));
    std::vector<Outcome> out(reqs.size());
    std::atomic<size_t> next{0};
    const auto epoch = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&] {
        while (!stop_requested()) {
          const size_t i = next.fetch_add(1);
          if (i >= bodies.size()) break;
          out[i] = stream_request(ep, bodies[i], epoch, violations);
          prog.tick();
        }
      });
    }
    for (auto& t : threads) t.join();
    wall_s = seconds_since(epoch);
    throw_if_stop_requested();
    return out;
  }

  std::vector<Outcome> open_loop(const std::vector<RagRequest>& reqs, const std::vector<double>& arrivals,
                                 const std::string& mode, PointProgress& prog, double& wall_s) {
    std::vector<std::string> bodies;
    for (const auto& r : reqs) bodies.push_back(body(r, mode));
    std::vector<Outcome> out(reqs.size());
    const auto epoch = Clock::now();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < bodies.size() && !stop_requested(); ++i) {
      const auto due = epoch + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i]));
      while (Clock::now() < due && !stop_requested())
        std::this_thread::sleep_until(std::min(due, Clock::now() + std::chrono::milliseconds(100)));
      if (stop_requested()) break;
      threads.emplace_back([&, i] {
        out[i] = stream_request(ep, bodies[i], epoch, violations);
        prog.tick();
      });
    }
    for (auto& t : threads) t.join();
    wall_s = seconds_since(epoch);
    throw_if_stop_requested();
    return out;
  }
};

std::string rate_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", r);
  return buf;
}

double round_sig(double x, int digits) {
  if (x <= 0) return x;
  const double scale = std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(x))));
  return std::round(x * scale) / scale;
}

// Highest load meeting the SLO (every request served, p99 TTFT <= slo): the highest
// achieved throughput for closed-loop points, the highest offered rate for open-loop
// ones; when a higher rate missed it on TTFT, also the rate where p99 TTFT crosses
// the SLO by linear interpolation between the two.
json best_within_slo(const std::vector<PointResult>& pts, double slo, bool by_rate) {
  json j;
  auto meets = [&](const PointResult& p) { return meets_slo(p, slo); };
  const PointResult* best = nullptr;
  for (const auto& p : pts) {
    const double key = by_rate ? p.load : p.achieved_rps;
    if (meets(p) && (!best || key > (by_rate ? best->load : best->achieved_rps))) best = &p;
  }
  j["points"] = pts.size();
  if (!best) {
    double lowest = INFINITY;
    for (const auto& p : pts) lowest = std::min(lowest, p.load);
    j["max_load"] = nullptr;
    j["achieved_rps"] = nullptr;
    j["note"] = "no load point met the SLO (lowest tried: " + rate_text(lowest) + ")";
    return j;
  }
  const PointResult* miss = nullptr;  // the lowest load above best that missed
  for (const auto& p : pts)
    if (p.load > best->load && !meets(p) && (!miss || p.load < miss->load)) miss = &p;
  j["max_load"] = best->load;
  j["achieved_rps"] = num(best->achieved_rps);
  j["p99_ttft_s"] = num(best->p99_ttft);
  bool highest = true;
  for (const auto& p : pts)
    if (p.load > best->load) highest = false;
  j["capped_by_grid"] = highest;  // the highest load tried still met it: a lower bound
  if (by_rate && miss && miss->all_ok && miss->kept_up && miss->p99_ttft > best->p99_ttft) {
    const double f = (slo - best->p99_ttft) / (miss->p99_ttft - best->p99_ttft);
    j["load_at_slo_interp"] = num(best->load + f * (miss->load - best->load));
  } else if (by_rate && miss) {
    j["load_at_slo_interp"] = num(best->load);  // missed on rejections/errors/backlog: no TTFT curve to follow
  }
  if (by_rate) j["slo_rate"] = j.contains("load_at_slo_interp") ? j["load_at_slo_interp"] : j["max_load"];
  return j;
}

json ratio_of(const json& a, const json& b, const char* key) {
  if (!a.contains(key) || !b.contains(key) || !a[key].is_number() || !b[key].is_number()) return nullptr;
  const double den = b[key].get<double>();
  return den > 0 ? num(a[key].get<double>() / den, 3) : json(nullptr);
}

}  // namespace

static int bench_serve_impl(const ServeBenchOptions& opt);

int bench_serve(const ServeBenchOptions& opt) {
  try {
    return bench_serve_impl(opt);
  } catch (const Interrupted&) {
    std::fprintf(stderr, "bench serve: interrupted\n");
    return 130;
  }
}

static int bench_serve_impl(const ServeBenchOptions& opt) {
  if (opt.retrieve > opt.documents) throw std::runtime_error("--retrieve exceeds --documents");
  if (opt.modes.empty()) throw std::runtime_error("--modes is empty");
  const bool no_open = std::any_of(opt.rates.begin(), opt.rates.end(), [](double r) { return !(r > 0); });
  std::vector<int> clients;
  for (int c : opt.clients)
    if (c > 0) clients.push_back(c);
  std::sort(clients.begin(), clients.end());
  if (clients.empty() && (no_open || opt.rates.empty()))
    throw std::runtime_error("nothing to measure: --clients 0 needs explicit --rates");
  const auto t_start = Clock::now();
  clear_stop_request();
  InterruptGuard signals;

  Bench b{opt, {opt.url, opt.api_key, opt.request_timeout_s}, {}, {}, {}, {}};
  std::unique_ptr<SpawnedServer> server;
  if (opt.spawn) {
    server = std::make_unique<SpawnedServer>(opt.server_config, opt.spawn_timeout_s, opt.api_key);
    b.ep.url = server->url();
  }
  while (!b.ep.url.empty() && b.ep.url.back() == '/') b.ep.url.pop_back();

  // Server reachable, model id.
  {
    const HttpReply h = call(b.ep, "GET", "/health", "", 10);
    if (h.status != 200) throw std::runtime_error("GET /health answered " + std::to_string(h.status) + ": " + h.body);
    const HttpReply m = call(b.ep, "GET", "/v1/models", "", 10);
    if (m.status != 200)
      throw std::runtime_error("GET /v1/models answered " + std::to_string(m.status) + ": " + error_message(m.body));
    const json j = json::parse(m.body, nullptr, false);
    if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].contains("id"))
      throw std::runtime_error("GET /v1/models: no model in " + m.body.substr(0, 300));
    b.model = j["data"][0]["id"].get<std::string>();
  }

  // Workload.
  b.corpus = load_corpus(opt.dataset);
  const TokenCounter tc(opt.model_path);
  b.docs = make_documents(b.corpus, tc, opt.documents, opt.doc_tokens, opt.seed);

  // Store every document (outside any measurement; 429 waits for Retry-After).
  std::vector<std::string> ids;
  std::vector<double> doc_tokens;
  int upload_retries = 0;
  struct Cleanup {
    Bench& b;
    std::vector<std::string>& ids;
    bool keep;
    ~Cleanup() {
      if (keep || ids.empty()) return;
      int failed = 0;
      for (const auto& id : ids) {
        try {
          if (call(b.ep, "DELETE", "/v1/documents/" + id, "", 30).status / 100 != 2) ++failed;
        } catch (const std::exception&) {
          ++failed;
        }
      }
      std::fprintf(stderr, "bench serve: deleted %zu documents%s\n", ids.size() - failed,
                   failed ? (" (" + std::to_string(failed) + " DELETEs failed)").c_str() : "");
    }
  } cleanup{b, ids, opt.keep_documents || opt.spawn};
  if (opt.retrieve > 0) {  // --retrieve 0 (plain chat, e.g. decode scaling) needs no documents
    PointProgress prog("bench serve: storing documents", static_cast<int>(b.docs.size()));
    for (const auto& d : b.docs) {
      for (int attempt = 0;; ++attempt) {
        throw_if_stop_requested();
        const HttpReply r = call(b.ep, "POST", "/v1/documents", json{{"text", d}}.dump(), opt.request_timeout_s);
        if (r.status == 429 && attempt < 30) {
          ++upload_retries;
          const double wait = r.retry_after.empty() ? 1.0 : std::max(0.1, std::atof(r.retry_after.c_str()));
          std::this_thread::sleep_for(std::chrono::duration<double>(wait));
          continue;
        }
        if (r.status != 200)
          throw std::runtime_error("POST /v1/documents answered " + std::to_string(r.status) + ": " +
                                   error_message(r.body));
        const json j = json::parse(r.body, nullptr, false);
        if (j.is_discarded() || !j.contains("id") || !j["id"].is_string())
          throw std::runtime_error("POST /v1/documents: no id in " + r.body.substr(0, 300));
        ids.push_back(j["id"].get<std::string>());
        if (j.contains("tokens") && j["tokens"].is_number()) doc_tokens.push_back(j["tokens"].get<double>());
        else b.violations.add("POST /v1/documents without tokens");
        break;
      }
      prog.tick();
    }
  }

  // Warm-up: unmeasured requests per mode (GEMM primitives, code paths); a failing
  // mode stops the benchmark here with the server's message.
  if (opt.warmup > 0) {
    const auto reqs = make_requests(opt.warmup, opt.documents, opt.retrieve, opt.zipf,
                                    static_cast<int>(b.corpus.questions.size()), opt.seed + 7777);
    PointProgress prog("bench serve: warm-up", opt.warmup * static_cast<int>(opt.modes.size()));
    for (const auto& mode : opt.modes) {
      for (const auto& r : reqs) {
        throw_if_stop_requested();
        const Outcome o = stream_request(b.ep, b.body(r, mode), Clock::now(), b.violations);
        prog.tick();
        if (o.kind == Kind::Error) throw std::runtime_error("warm-up request (mode " + mode + ") failed: " + o.error);
        if (o.kind == Kind::Ok && mode == "blend" && o.usage && o.cached_tokens == 0)
          b.violations.add("blend request with stored documents reports 0 cached tokens");
      }
    }
  }

  std::map<std::string, std::vector<PointResult>> closed, open;
  const std::string ref_mode =
      std::find(opt.modes.begin(), opt.modes.end(), "full") != opt.modes.end() ? "full" : opt.modes.front();
  double slo = opt.slo_p99;
  std::string slo_source = slo > 0 ? "--slo-p99" : "";
  // The default SLO: 2x the reference mode's median TTFT at its lowest load (the
  // median: a p99 of a dozen samples is one outlier on a busy machine).
  auto derive_slo = [&](const PointResult& p, const std::string& where) {
    if (slo > 0 || p.mode != ref_mode || !std::isfinite(p.p50_ttft)) return;
    slo = 2 * p.p50_ttft;
    slo_source = "2x " + ref_mode + "'s median TTFT at its lowest load (" + where + ")";
    std::fprintf(stderr, "bench serve: SLO p99 TTFT = %.3f s (%s)\n", slo, slo_source.c_str());
  };

  std::map<std::string, double> base_latency;  // per mode: its median latency at its lowest load

  // Closed loop.
  int point = 0;
  const int closed_points = static_cast<int>(clients.size() * opt.modes.size());
  for (size_t ci = 0; ci < clients.size(); ++ci) {
    const auto reqs = make_requests(opt.requests, opt.documents, opt.retrieve, opt.zipf,
                                    static_cast<int>(b.corpus.questions.size()), opt.seed * 1000003 + ci);
    for (const auto& mode : opt.modes) {
      ++point;
      PointProgress prog("bench serve [closed " + std::to_string(point) + "/" + std::to_string(closed_points) + " " +
                             mode + " clients=" + std::to_string(clients[ci]) + "]",
                         opt.requests);
      double wall = 0;
      const auto out = b.closed_loop(reqs, mode, clients[ci], prog, wall);
      PointResult p = summarize(mode, true, clients[ci], out, wall, 0, 0);
      std::printf("%s\n", p.line.dump().c_str());
      std::fflush(stdout);
      if (ci == 0) {
        derive_slo(p, "closed loop, " + std::to_string(clients[ci]) + " client(s)");
        if (std::isfinite(p.p50_latency)) base_latency[mode] = p.p50_latency;
      }
      closed[mode].push_back(std::move(p));
    }
  }

  // Open loop: the given rates, or a doubling grid from half the slowest mode's
  // closed-loop throughput to 1.5x the fastest's.
  std::vector<double> rates = no_open ? std::vector<double>{} : opt.rates;
  std::string rates_source = no_open ? "none (--rates 0)" : "--rates";
  std::map<std::string, double> capacity;  // per mode: highest closed-loop throughput
  bool auto_rates = false;
  if (rates.empty() && !no_open && !closed.empty()) {
    double lo = INFINITY, hi = 0;
    for (const auto& [mode, pts] : closed) {
      double cap = 0;
      for (const auto& p : pts) cap = std::max(cap, p.achieved_rps);
      capacity[mode] = cap;
      if (cap > 0) {
        lo = std::min(lo, cap);
        hi = std::max(hi, cap);
      }
    }
    if (hi > 0) {
      for (double r = 0.5 * lo; rates.size() < 6 && (rates.size() < 3 || r <= 1.5 * hi * 1.0001); r *= 2)
        rates.push_back(round_sig(r, 2));
      auto_rates = true;
      rates_source =
          "auto: doubling from half the slowest mode's closed-loop throughput to 1.5x the fastest's; each mode "
          "starts at the highest of them within half its own";
    }
  }
  std::sort(rates.begin(), rates.end());
  if (!rates.empty()) {
    std::string list;
    for (double r : rates) list += " " + rate_text(r);
    std::fprintf(stderr, "bench serve: open-loop rates (req/s):%s\n", list.c_str());
  }
  // One open-loop point. Arrival gaps are exponential with one shape for every rate
  // (drawn once from the seed), scaled so the mean rate is exactly `rate`: points
  // differ in load, not in luck. The requests depend on the seed and the rate only,
  // so both modes at one rate get the same requests at the same times.
  std::vector<double> shape(std::max(opt.requests, 1));
  {
    std::mt19937_64 rng(opt.seed * 3000017 + 1);
    std::exponential_distribution<double> gap(1.0);
    for (size_t i = 1; i < shape.size(); ++i) shape[i] = shape[i - 1] + gap(rng);
    const double scale = shape.back() > 0 ? static_cast<double>(shape.size() - 1) / shape.back() : 1.0;
    for (double& t : shape) t *= scale;  // mean gap 1
  }
  auto run_open = [&](const std::string& mode, double rate, const std::string& label, bool extra) {
    const uint64_t key = opt.seed * 2000003 + static_cast<uint64_t>(std::llround(rate * 1000));
    const auto reqs = make_requests(opt.requests, opt.documents, opt.retrieve, opt.zipf,
                                    static_cast<int>(b.corpus.questions.size()), key);
    std::vector<double> arrivals(shape);
    for (double& t : arrivals) t /= rate;
    PointProgress prog("bench serve [" + label + " " + mode + " rate=" + rate_text(rate) + "/s]", opt.requests);
    double wall = 0;
    const auto out = b.open_loop(reqs, arrivals, mode, prog, wall);
    PointResult p = summarize(mode, false, rate, out, wall, arrivals.back(), base_latency[mode]);
    if (extra) p.line["extra"] = true;  // beyond the shared grid, to bracket this mode's SLO rate
    std::printf("%s\n", p.line.dump().c_str());
    std::fflush(stdout);
    open[mode].push_back(std::move(p));
    return open[mode].back();
  };
  auto meets = [&](const PointResult& p) { return meets_slo(p, slo); };

  std::map<std::string, std::vector<double>> skipped, below;
  const int open_points = static_cast<int>(rates.size() * opt.modes.size());
  point = 0;
  for (size_t ri = 0; ri < rates.size(); ++ri) {
    for (const auto& mode : opt.modes) {
      ++point;
      const auto& prev = open[mode];
      if (!opt.all_points && slo > 0 && !prev.empty() && !meets(prev.back())) {
        skipped[mode].push_back(rates[ri]);  // a lower rate already missed the SLO
        continue;
      }
      if (auto_rates && ri + 1 < rates.size() && rates[ri + 1] <= 0.5 * capacity[mode] && prev.empty()) {
        below[mode].push_back(rates[ri]);  // the next rate is still at most half its closed-loop throughput
        continue;
      }
      const auto& p = run_open(mode, rates[ri], "open " + std::to_string(point) + "/" + std::to_string(open_points),
                               false);
      if (ri == 0 && closed.empty()) derive_slo(p, "open loop, " + rate_text(rates[ri]) + " req/s");
      if (!(base_latency[mode] > 0) && std::isfinite(p.p50_latency)) base_latency[mode] = p.p50_latency;
    }
  }
  // Bracketing: a mode that missed the SLO at the lowest rate tries half of it (and
  // a quarter), one that met it at the highest tries double (and 4x), up to --extend
  // points, so each mode's SLO rate lies between two measured rates.
  for (const auto& mode : opt.modes) {
    if (rates.empty() || slo <= 0 || opt.extend <= 0) break;
    const auto& pts = open[mode];
    const bool none = std::none_of(pts.begin(), pts.end(), meets);
    const bool all = !pts.empty() && std::all_of(pts.begin(), pts.end(), meets) && skipped[mode].empty();
    double rate = none ? rates.back() : rates.front();
    for (const auto& p : pts) rate = none ? std::min(rate, p.load) : std::max(rate, p.load);
    for (int k = 0; k < opt.extend && (none || all); ++k) {
      rate = round_sig(none ? rate / 2 : rate * 2, 2);
      const auto& p = run_open(mode, rate, "open, bracketing", true);
      if (meets(p) == none) break;  // bracketed
    }
  }

  // Summary.
  json s = {{"bench", "serve_summary"},
            {"url", server ? "spawned" : b.ep.url},
            {"model", b.model},
            {"cpu", cpu_name()},
            {"documents", opt.documents},
            {"doc_tokens_target", opt.doc_tokens},
            {"doc_tokens_mean", num(mean(doc_tokens), 1)},
            {"doc_tokens_sizing", tc.exact() ? "tokenizer" : "4 characters per token"},
            {"retrieve", opt.retrieve},
            {"zipf", opt.zipf},
            {"requests_per_point", opt.requests},
            {"max_tokens", opt.max_tokens},
            {"seed", opt.seed},
            {"slo_p99_ttft_s", num(slo)},
            {"slo_source", slo_source},
            {"criterion",
             "p99 TTFT <= SLO, every request served (no 429, no error), and (open loop) kept up: throughput >= "
             "80% of a server's that never queues (last completion <= (arrival span + the mode's median latency "
             "at its lowest load) / 0.8)"},
            {"rates", rates},
            {"rates_source", rates_source}};
  if (upload_retries) s["document_upload_retries"] = upload_retries;
  json per_mode = json::object();
  for (const auto& mode : opt.modes) {
    json m;
    if (closed.count(mode)) {
      m["closed"] = best_within_slo(closed[mode], slo, false);
      const auto& pts = closed[mode];
      const auto one = std::find_if(pts.begin(), pts.end(), [](const PointResult& p) { return p.load == 1; });
      if (one != pts.end() && pts.back().load > 1 && one->decode_tok_s_total > 0)
        m["decode_scaling"] = {{"clients", static_cast<int>(pts.back().load)},
                               {"vs_1_client", num(pts.back().decode_tok_s_total / one->decode_tok_s_total, 3)}};
    }
    if (open.count(mode)) m["open"] = best_within_slo(open[mode], slo, true);
    if (skipped.count(mode) && !skipped[mode].empty()) m["open_skipped_rates"] = skipped[mode];
    if (below.count(mode) && !below[mode].empty()) m["open_rates_below_start"] = below[mode];
    if (base_latency.count(mode)) m["base_latency_s"] = num(base_latency[mode]);
    per_mode[mode] = m;
  }
  s["modes"] = per_mode;
  if (per_mode.contains("blend") && per_mode.contains("full")) {
    const json& bl = per_mode["blend"];
    const json& fu = per_mode["full"];
    json r = json::object();
    if (bl.contains("closed") && fu.contains("closed"))
      r["closed_achieved_rps"] = ratio_of(bl["closed"], fu["closed"], "achieved_rps");
    if (bl.contains("open") && fu.contains("open")) {
      r["open_max_rate"] = ratio_of(bl["open"], fu["open"], "max_load");
      r["open_achieved_rps"] = ratio_of(bl["open"], fu["open"], "achieved_rps");
      r["open_slo_rate"] = ratio_of(bl["open"], fu["open"], "slo_rate");
      if (bl["open"].value("capped_by_grid", false)) r["note"] = "blend met the SLO at every rate tried: a lower bound";
      if (fu["open"].value("capped_by_grid", false)) r["note"] = "full met the SLO at every rate tried: an upper bound";
    }
    s["blend_vs_full"] = r;
    // The headline: the open-loop SLO rates (interpolated where bracketed), else the
    // highest open-loop rates within the SLO, else the closed-loop throughputs.
    json ratio = nullptr;
    std::string basis;
    for (const char* key : {"open_slo_rate", "open_max_rate", "closed_achieved_rps"}) {
      if (r.contains(key) && r[key].is_number()) {
        ratio = r[key];
        basis = key;
        break;
      }
    }
    s["ratio"] = ratio;
    s["ratio_basis"] = basis;
    s["target_ratio"] = 3.0;
    s["meets_target"] = ratio.is_number() ? json(ratio.get<double>() >= 3.0) : json(nullptr);
  }
  s["api_deviations"] = b.violations.to_json();
  s["runtime_s"] = num(seconds_since(t_start), 1);
  std::printf("%s\n", s.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace bs::tools
