#include "actors/runtime/trace.h"

#include "actors/runtime/inspection_cost.h"

namespace bs {

void RequestTrace::add_event(TraceEvent e) {
  InspectionCostScope cost;
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= kMaxEvents) {
    ++events_dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

std::vector<TraceEvent> RequestTrace::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void RequestTrace::set(const std::string& key, nlohmann::json value) {
  InspectionCostScope cost;
  std::lock_guard<std::mutex> lock(mu_);
  fields_[key] = std::move(value);
}

nlohmann::json RequestTrace::fields() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j = fields_;
  j["id"] = id_;
  return j;
}

std::string RequestTrace::json() const {
  InspectionCostScope cost;
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j = fields_;
  j["id"] = id_;
  if (events_dropped_ > 0) j["events_dropped"] = events_dropped_;
  auto ev = nlohmann::json::array();
  for (const auto& e : events_) {
    nlohmann::json x = {{"actor", e.actor}, {"what", e.what}, {"begin_s", e.begin}, {"end_s", e.end}};
    if (e.layer >= 0) x["layer"] = e.layer;
    if (e.bytes > 0) x["bytes"] = e.bytes;
    ev.push_back(std::move(x));
  }
  j["events"] = std::move(ev);
  return j.dump();
}

TracePtr TraceBook::open(uint64_t id, RequestTrace::clock::time_point submitted) {
  auto t = std::make_shared<RequestTrace>(id, submitted);
  std::lock_guard<std::mutex> lock(mu_);
  open_[id] = t;
  return t;
}

TracePtr TraceBook::find(uint64_t id) const {
  InspectionCostScope cost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(id);
    if (it != open_.end()) return it->second;
  }
  return std::make_shared<RequestTrace>(id, RequestTrace::clock::now());
}

TracePtr TraceBook::close(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(id);
  if (it == open_.end()) return nullptr;
  TracePtr t = std::move(it->second);
  open_.erase(it);
  return t;
}

}  // namespace bs
