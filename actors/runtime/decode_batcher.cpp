#include "actors/runtime/decode_batcher.h"

#include <iterator>
#include <utility>

namespace bs {

bool DecodeBatcher::add(DecodeSlotPtr slot, int32_t token, const kernels::SampleRow& next) {
  bool submit = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out_.erase(slot->id);
    const auto stepped = stepped_.find(slot->id);
    const clock::time_point since = stepped == stepped_.end() ? clock::now() : stepped->second;
    pending_.push_back({std::move(slot), token, next, since});
    if (!job_queued_) submit = job_queued_ = true;
  }
  arrived_.notify_all();
  return submit;
}

std::vector<DecodeBatcher::Entry> DecodeBatcher::take(int max_batch, clock::duration gather, bool& more) {
  std::unique_lock<std::mutex> lock(mu_);
  const size_t full = static_cast<size_t>(max_batch < 1 ? 1 : max_batch);
  arrived_.wait_for(lock, gather, [&] { return out_.empty() || pending_.size() >= full; });
  auto got = pop(max_batch);
  more = !pending_.empty();
  job_queued_ = more;
  return got;
}

std::vector<DecodeBatcher::Entry> DecodeBatcher::take_now(int max_batch) {
  std::lock_guard<std::mutex> lock(mu_);
  return pop(max_batch);
}

std::vector<DecodeBatcher::Entry> DecodeBatcher::take_all() {
  std::lock_guard<std::mutex> lock(mu_);
  job_queued_ = false;
  std::vector<Entry> got(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
  pending_.clear();
  for (const auto& e : got) out_.insert(e.slot->id);
  return got;
}

std::vector<DecodeBatcher::Entry> DecodeBatcher::pop(int max_batch) {
  std::vector<Entry> got;
  while (!pending_.empty() && static_cast<int>(got.size()) < (max_batch < 1 ? 1 : max_batch)) {
    out_.insert(pending_.front().slot->id);
    got.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }
  return got;
}

bool DecodeBatcher::due(clock::duration interval) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = clock::now();
  for (const auto& e : pending_)
    if (now - e.since >= interval) return true;
  return false;
}

void DecodeBatcher::expect(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  out_.insert(id);
}

void DecodeBatcher::forget(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    out_.erase(id);
    stepped_.erase(id);
  }
  arrived_.notify_all();
}

void DecodeBatcher::step_began(const std::vector<uint64_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = clock::now();
  for (uint64_t id : ids) stepped_[id] = now;
}

size_t DecodeBatcher::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

}  // namespace bs
