#include "actors/request.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace bs {

const char* errc_name(RequestErrc c) {
  switch (c) {
    case RequestErrc::invalid: return "invalid_request";
    case RequestErrc::too_long: return "context_length_exceeded";
    case RequestErrc::overloaded: return "overloaded";
    case RequestErrc::shutting_down: return "shutting_down";
    case RequestErrc::internal: return "internal_error";
  }
  return "?";
}

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::Ram: return "ram";
    case Tier::Ssd: return "ssd";
    case Tier::Miss: return "miss";
  }
  return "?";
}

void LayerGate::reset(int n_layers, std::vector<uint64_t> loaders) {
  std::lock_guard<std::mutex> lock(mu_);
  arrived_.assign(static_cast<size_t>(n_layers), 0);
  expected_ = static_cast<int>(loaders.size());
  loaders_ = std::move(loaders);
  failure_.clear();
  recoverable_ = false;
}

void LayerGate::arrive(int layer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (layer >= 0 && layer < static_cast<int>(arrived_.size())) ++arrived_[layer];
  }
  cv_.notify_all();
}

void LayerGate::loader_done(uint64_t loader) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase(loaders_, loader);
  }
  cv_.notify_all();
}

void LayerGate::fail(const std::string& why, bool recoverable) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) {
      failure_ = why.empty() ? "load failed" : why;
      recoverable_ = recoverable;
    }
  }
  cv_.notify_all();
}

bool LayerGate::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !failure_.empty();
}

bool LayerGate::failure(std::string& why, bool& recoverable) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) return false;
  why = failure_;
  recoverable = recoverable_;
  return true;
}

bool LayerGate::delivered(int layer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return layer >= 0 && layer < static_cast<int>(arrived_.size()) && arrived_[layer] >= expected_;
}

bool LayerGate::loaders_done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaders_.empty();
}

bool LayerGate::wait_for(int layer, std::chrono::steady_clock::duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready =
      cv_.wait_for(lock, timeout, [&] { return !failure_.empty() || arrived_.at(layer) >= expected_; });
  if (!failure_.empty()) throw LoadFailed(failure_, recoverable_);
  return ready;
}

bool LayerGate::wait_loaders_done_for(std::chrono::steady_clock::duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return loaders_.empty(); });
}

bool LayerGate::holds(uint64_t loader) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::find(loaders_.begin(), loaders_.end(), loader) != loaders_.end();
}

int LayerGate::loaders() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expected_;
}

void RequestState::add_event(TraceEvent e) {
  std::lock_guard<std::mutex> lock(trace_mu_);
  events_.push_back(std::move(e));
}

std::vector<TraceEvent> RequestState::events() const {
  std::lock_guard<std::mutex> lock(trace_mu_);
  return events_;
}

std::string RequestState::trace_json() const {
  using json = nlohmann::json;
  json j;
  j["id"] = id;
  j["prompt_tokens"] = prompt.size();
  j["chunks"] = prompt.chunks.size();
  json tiers = json::array();
  for (Tier t : chunk_tier) tiers.push_back(tier_name(t));
  j["chunk_tiers"] = tiers;
  j["mode"] = mode_name(options.mode);
  j["ratio"] = options.ratio;
  if (!controller_json.empty()) j["controller"] = json::parse(controller_json);
  json ev = json::array();
  double load_begin = -1, load_end = -1;
  int64_t load_bytes = 0;
  for (const auto& e : events()) {
    json x = {{"actor", e.actor}, {"what", e.what}, {"begin_s", e.begin}, {"end_s", e.end}};
    if (e.layer >= 0) x["layer"] = e.layer;
    if (e.bytes > 0) x["bytes"] = e.bytes;
    ev.push_back(std::move(x));
    if (e.what == "load") {
      load_begin = load_begin < 0 ? e.begin : std::min(load_begin, e.begin);
      load_end = std::max(load_end, e.end);
      load_bytes += e.bytes;
    }
  }
  // The worker's per-layer waits and computes come from the prefill's own timings.
  const auto& st = prefill.stats;
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const auto& lt = st.layers[l];
    if (lt.wait_begin >= 0)
      ev.push_back({{"actor", "worker"}, {"what", "wait+repair"}, {"layer", l}, {"begin_s", lt.wait_begin},
                    {"end_s", lt.ready}});
    if (lt.compute_begin >= 0)
      ev.push_back({{"actor", "worker"}, {"what", "compute"}, {"layer", l}, {"begin_s", lt.compute_begin},
                    {"end_s", lt.compute_end}});
  }
  j["events"] = std::move(ev);
  j["fallback"] = fallback;
  j["wait_s"] = st.wait_seconds;
  j["select_s"] = st.select_seconds;
  j["recomputed_tokens"] = st.recomputed_tokens;
  j["computed_tokens"] = st.computed_tokens;
  if (load_begin >= 0) {
    const double span = load_end - load_begin;
    j["load_span_s"] = span;
    j["load_bytes"] = load_bytes;
    // Load time the worker did not spend waiting was hidden behind compute.
    j["load_hidden_fraction"] = span > 0 ? std::clamp(1.0 - st.wait_seconds / span, 0.0, 1.0) : 1.0;
  }
  if (prefill_pauses > 0) {
    // Decode steps of other requests ran between this prefill's layers (counted in wait_s).
    j["prefill_pauses"] = prefill_pauses;
    j["prefill_pause_s"] = prefill_pause_seconds;
  }
  if (decode_steps > 0)
    j["decode"] = {{"steps", decode_steps},
                   {"mean_batch", static_cast<double>(decode_batch_sum) / static_cast<double>(decode_steps)},
                   {"interleaved_steps", decode_interleaved}};
  if (has_first_token) j["first_token_s"] = seconds_since_submit(first_token);
  j["finish_reason"] = result.finish_reason;
  j["total_s"] = result.total_seconds;
  return j.dump();
}

}  // namespace bs
