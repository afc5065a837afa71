#include "actors/cluster/holdings.h"

#include <algorithm>
#include <iterator>
#include <random>

namespace bs {

bool chunk_key_less(const ChunkKey& a, const ChunkKey& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; }

namespace {

bool sorted_unique(const std::vector<ChunkKey>& v) {
  for (size_t i = 1; i < v.size(); ++i)
    if (!chunk_key_less(v[i - 1], v[i])) return false;
  return true;
}

uint64_t random_epoch() {
  std::random_device rd;
  const uint64_t e = (uint64_t{rd()} << 32) | rd();
  return e == 0 ? 1 : e;  // 0: what a frontend that has nothing asks with
}

}  // namespace

HeldKeys::HeldKeys(uint64_t epoch, uint64_t version, std::vector<ChunkKey> sorted)
    : epoch_(epoch), version_(version), keys_(std::move(sorted)) {}

bool HeldKeys::contains(const ChunkKey& k) const { return std::binary_search(keys_.begin(), keys_.end(), k, chunk_key_less); }

std::optional<HeldKeys> HeldKeys::apply(const HoldingsDelta& d) const {
  if (!sorted_unique(d.added) || !sorted_unique(d.removed)) return std::nullopt;
  if (d.full) return HeldKeys(d.epoch, d.version, d.added);
  if (d.epoch != epoch_ || d.base != version_) return std::nullopt;
  std::vector<ChunkKey> kept;
  kept.reserve(keys_.size());
  std::set_difference(keys_.begin(), keys_.end(), d.removed.begin(), d.removed.end(), std::back_inserter(kept),
                      chunk_key_less);
  std::vector<ChunkKey> out;
  out.reserve(kept.size() + d.added.size());
  std::set_union(kept.begin(), kept.end(), d.added.begin(), d.added.end(), std::back_inserter(out), chunk_key_less);
  return HeldKeys(d.epoch, d.version, std::move(out));
}

HoldingsLog::HoldingsLog(std::function<std::vector<ChunkKey>()> list_keys, std::function<uint64_t()> change_mark,
                         size_t keep_versions)
    : list_keys_(std::move(list_keys)),
      change_mark_(std::move(change_mark)),
      keep_(std::max<size_t>(keep_versions, 1)),
      epoch_(random_epoch()) {}

size_t HoldingsLog::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshots_.empty() ? 0 : snapshots_.back().keys->size();
}

HoldingsDelta HoldingsLog::since(uint64_t epoch, uint64_t base) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t mark = change_mark_();
  if (!mark_ || *mark_ != mark || snapshots_.empty()) {
    auto keys = list_keys_();
    std::sort(keys.begin(), keys.end(), chunk_key_less);
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    // A new version only when the set changed (a put over a key already held, or an
    // eviction and a put of the same key, leaves it as it was).
    if (snapshots_.empty() || *snapshots_.back().keys != keys) {
      const uint64_t v = snapshots_.empty() ? 1 : snapshots_.back().version + 1;
      snapshots_.push_back({v, std::make_shared<const std::vector<ChunkKey>>(std::move(keys))});
      while (snapshots_.size() > keep_) snapshots_.pop_front();
    }
    mark_ = mark;
  }
  const Snapshot& now = snapshots_.back();
  HoldingsDelta d;
  d.epoch = epoch_;
  d.version = now.version;
  const Snapshot* from = nullptr;
  if (epoch == epoch_)
    for (const auto& s : snapshots_)
      if (s.version == base) from = &s;
  if (!from) {
    d.full = true;
    d.added = *now.keys;
    return d;
  }
  d.full = false;
  d.base = base;
  std::set_difference(now.keys->begin(), now.keys->end(), from->keys->begin(), from->keys->end(),
                      std::back_inserter(d.added), chunk_key_less);
  std::set_difference(from->keys->begin(), from->keys->end(), now.keys->begin(), now.keys->end(),
                      std::back_inserter(d.removed), chunk_key_less);
  return d;
}

}  // namespace bs
