#include "actors/load_target.h"

#include <algorithm>

namespace bs {

void LayerEvents::add(int layer, std::shared_ptr<kernels::Event> event) {
  std::lock_guard<std::mutex> lock(mu_);
  by_layer_[layer].push_back(std::move(event));
}

std::vector<std::shared_ptr<kernels::Event>> LayerEvents::take(int layer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_layer_.find(layer);
  if (it == by_layer_.end()) return {};
  auto out = std::move(it->second);
  by_layer_.erase(it);
  return out;
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

void LoadTargets::put(uint64_t id, LoadTargetPtr t) {
  std::lock_guard<std::mutex> lock(mu_);
  targets_[id] = std::move(t);
}

LoadTargetPtr LoadTargets::find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = targets_.find(id);
  return it == targets_.end() ? nullptr : it->second;
}

void LoadTargets::erase(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  targets_.erase(id);
}

void LoadTargets::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  targets_.clear();
}

void LoadTargets::for_each(const std::function<void(uint64_t, LoadTarget&)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, t] : targets_) f(id, *t);
}

size_t LoadTargets::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return targets_.size();
}

}  // namespace bs
