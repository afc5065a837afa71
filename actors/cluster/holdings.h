// What chunk KV a member holds, as the cluster's frontend routes by it: reported
// as deltas, not the whole set on every heartbeat. The member keeps the last few
// snapshots of its key set (HoldingsLog), each with a version; the frontend asks
// with the version it has and gets the keys added and removed since, or the whole
// set when it has none of those versions (its first ask, the member restarted, it
// fell too far behind). The member lists its keys only when its tiers' counters
// say something changed.
//
// Exact keys, not a filter: a routing choice never counts a chunk the member does
// not hold, and a delta can remove a key (a Bloom filter cannot).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "storage/chunk_kv.h"

namespace bs {

// A change of holdings from version `base` to `version` of the member's log
// `epoch` (random per process start: a restarted member's versions never match
// the frontend's old ones). full: `added` is the whole set, `base` means nothing.
struct HoldingsDelta {
  uint64_t epoch = 0, base = 0, version = 0;
  bool full = true;
  std::vector<ChunkKey> added, removed;  // each sorted (hi, lo), no duplicates
};

bool chunk_key_less(const ChunkKey& a, const ChunkKey& b);

// An immutable set of keys (the frontend's copy of one member's holdings).
class HeldKeys {
 public:
  HeldKeys() = default;
  // `sorted`: sorted by chunk_key_less, no duplicates.
  HeldKeys(uint64_t epoch, uint64_t version, std::vector<ChunkKey> sorted);
  bool contains(const ChunkKey& k) const;
  size_t size() const { return keys_.size(); }
  uint64_t epoch() const { return epoch_; }
  uint64_t version() const { return version_; }
  // The set after `d`: nullopt when `d` is a delta from another base (then ask for
  // the whole set again) or its lists are not sorted.
  std::optional<HeldKeys> apply(const HoldingsDelta& d) const;

 private:
  uint64_t epoch_ = 0, version_ = 0;
  std::vector<ChunkKey> keys_;
};

// The member's side. Thread-safe.
class HoldingsLog {
 public:
  // list_keys: the member's keys now (any order, duplicates allowed); change_mark:
  // a value that changes whenever the key set may have (its tiers' put, eviction
  // and entry counters): while it stays the same, the keys are not listed again.
  HoldingsLog(std::function<std::vector<ChunkKey>()> list_keys, std::function<uint64_t()> change_mark,
              size_t keep_versions = 4);
  // What a frontend holding (epoch, base) needs to be current.
  HoldingsDelta since(uint64_t epoch, uint64_t base);
  uint64_t epoch() const { return epoch_; }
  size_t held() const;  // keys in the newest snapshot

 private:
  struct Snapshot {
    uint64_t version = 0;
    std::shared_ptr<const std::vector<ChunkKey>> keys;  // sorted, unique
  };
  std::function<std::vector<ChunkKey>()> list_keys_;
  std::function<uint64_t()> change_mark_;
  const size_t keep_;
  const uint64_t epoch_;
  mutable std::mutex mu_;
  std::deque<Snapshot> snapshots_;  // oldest first; never empty after the first since()
  std::optional<uint64_t> mark_;
};

}  // namespace bs
