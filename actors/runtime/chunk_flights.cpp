#include "actors/runtime/chunk_flights.h"

namespace bs {

bool ChunkFlights::claim(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (claimed_.insert(key).second) return true;
  ++joined_;
  return false;
}

void ChunkFlights::release(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  claimed_.erase(key);
}

void ChunkFlights::mark_provisional(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (provisional_.size() >= kMaxProvisional) provisional_.clear();
  if (provisional_.insert(key).second) ++provisional_stored_;
}

void ChunkFlights::unmark_provisional(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (provisional_.erase(key) > 0) --provisional_stored_;
}

bool ChunkFlights::provisional(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return provisional_.count(key) > 0;
}

void ChunkFlights::computed(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  provisional_.erase(key);
  ++computed_;
}

ChunkFlights::Stats ChunkFlights::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Stats{computed_, joined_, provisional_stored_, static_cast<int64_t>(claimed_.size())};
}

}  // namespace bs
