#include "actors/runtime/load_target.h"

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

void LayerGate::reset(int n_layers, std::vector<uint64_t> loaders, int ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  arrived_.assign(static_cast<size_t>(n_layers), 0);
  loaders_ = static_cast<int>(loaders.size());
  ranks_ = std::max(ranks, 1);
  expected_ = loaders_ * ranks_;
  pending_.clear();
  for (uint64_t l : loaders)
    for (int r = 0; r < ranks_; ++r) pending_.push_back({l, r});
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

void LayerGate::loader_done(uint64_t loader, int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase(pending_, Pending{loader, rank});
  }
  cv_.notify_all();
}

void LayerGate::loader_gone(uint64_t loader) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(pending_, [&](const Pending& p) { return p.loader == loader; });
  }
  cv_.notify_all();
}

void LayerGate::rank_gone(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(pending_, [&](const Pending& p) { return p.rank == rank; });
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
  return pending_.empty();
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
  return cv_.wait_for(lock, timeout, [&] { return pending_.empty(); });
}

bool LayerGate::holds(uint64_t loader) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.loader == loader; });
}

int LayerGate::loaders() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaders_;
}

int LayerGate::ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_;
}

}  // namespace bs
