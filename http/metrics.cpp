#include "http/metrics.h"

#include <cstdio>

namespace bs::http {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  // Appended piece by piece (GCC 12 reports a false -Wrestrict on "{" + labels).
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += num(v);
  out += '\n';
}

}  // namespace

std::string label_escape(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  ++count_;
  sum_ += v;
}

void Histogram::render(std::string& out, const std::string& name) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    sample(out, name + "_bucket", "le=\"" + num(bounds_[i]) + "\"", static_cast<double>(cumulative));
  }
  sample(out, name + "_bucket", "le=\"+Inf\"", static_cast<double>(count_));
  sample(out, name + "_sum", "", sum_);
  sample(out, name + "_count", "", static_cast<double>(count_));
}

ServerMetrics::ServerMetrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      latency_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
      ratio_({0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1}) {}

void ServerMetrics::count_response(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[{route, status}];
}

void ServerMetrics::declare_tiers(const std::vector<std::string>& tiers) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& t : tiers) chunks_[t] += 0;
  chunks_["miss"] += 0;
}

void ServerMetrics::observe_completion(const RequestResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r.ttft_seconds > 0) ttft_.observe(r.ttft_seconds);
  latency_.observe(r.total_seconds);
  if (r.chunks > 0) ratio_.observe(r.ratio);
  prompt_tokens_ += r.prompt_tokens;
  completion_tokens_ += static_cast<int64_t>(r.tokens.size());
  cached_tokens_ += r.cached_tokens;
  recomputed_tokens_ += r.recomputed_tokens;
  for (const auto& [tier, n] : r.chunks_by_tier) chunks_[tier] += n;
  chunks_["miss"] += r.chunks_missed;
}

void ServerMetrics::count_disconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  ++disconnects_;
}

std::string ServerMetrics::render(const std::vector<Gauge>& gauges) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  header(out, "blendserve_http_responses_total", "counter", "HTTP responses by route and status code.");
  for (const auto& [key, n] : responses_)
    sample(out, "blendserve_http_responses_total",
           "route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"", static_cast<double>(n));
  header(out, "blendserve_time_to_first_token_seconds", "histogram",
         "Chat completions: from admission to the first token sampled.");
  ttft_.render(out, "blendserve_time_to_first_token_seconds");
  header(out, "blendserve_request_latency_seconds", "histogram", "Chat completions: from admission to the last token.");
  latency_.render(out, "blendserve_request_latency_seconds");
  header(out, "blendserve_recompute_ratio", "histogram",
         "Fraction of the cached chunk tokens recomputed, per request with documents.");
  ratio_.render(out, "blendserve_recompute_ratio");
  header(out, "blendserve_prompt_tokens_total", "counter", "Prompt tokens of chat completions.");
  sample(out, "blendserve_prompt_tokens_total", "", static_cast<double>(prompt_tokens_));
  header(out, "blendserve_completion_tokens_total", "counter", "Generated tokens.");
  sample(out, "blendserve_completion_tokens_total", "", static_cast<double>(completion_tokens_));
  header(out, "blendserve_cached_prompt_tokens_total", "counter", "Prompt tokens served from stored KV.");
  sample(out, "blendserve_cached_prompt_tokens_total", "", static_cast<double>(cached_tokens_));
  header(out, "blendserve_recomputed_prompt_tokens_total", "counter",
         "Cached prompt tokens recomputed by the blend (the selected ones).");
  sample(out, "blendserve_recomputed_prompt_tokens_total", "", static_cast<double>(recomputed_tokens_));
  header(out, "blendserve_chunks_total", "counter", "Document chunks of requests, by where their KV came from.");
  for (const auto& [tier, n] : chunks_)
    sample(out, "blendserve_chunks_total", "tier=\"" + tier + "\"", static_cast<double>(n));
  header(out, "blendserve_client_disconnects_total", "counter", "Requests cancelled because the client left.");
  sample(out, "blendserve_client_disconnects_total", "", static_cast<double>(disconnects_));
  std::string last;
  for (const auto& g : gauges) {
    if (g.name != last) header(out, g.name, g.type.c_str(), g.help);
    last = g.name;
    sample(out, g.name, g.labels, g.value);
  }
  return out;
}

}  // namespace bs::http
