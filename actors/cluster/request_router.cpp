#include "actors/cluster/request_router.h"

#include <algorithm>
#include <stdexcept>

#include "storage/chunk_kv.h"

namespace bs {

RoutingPolicy parse_routing_policy(const std::string& name) {
  if (name == "kv_aware") return RoutingPolicy::kv_aware;
  if (name == "round_robin") return RoutingPolicy::round_robin;
  throw std::invalid_argument("routing: unknown policy \"" + name + "\" (kv_aware | round_robin)");
}

RequestRouter::RequestRouter(RoutingPolicy policy, double recent_keys_s) : policy_(policy), recent_for_(recent_keys_s) {}

namespace {

std::vector<ChunkKey> keys_for(const NodeReport& r, const std::vector<std::vector<int32_t>>& chunks) {
  std::vector<ChunkKey> keys;
  keys.reserve(chunks.size());
  for (const auto& c : chunks) keys.push_back(make_chunk_key(r.fingerprint, KvKind::Chunk, c, r.prelude));
  return keys;
}

}  // namespace

std::optional<RouteChoice> RequestRouter::choose(const ClusterView& view,
                                                 const std::vector<std::vector<int32_t>>& chunks,
                                                 const std::set<std::string>& exclude) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = clock_type::now();
  struct Candidate {
    RouteChoice c;
    bool full = false;
    size_t index = 0;  // among the candidates, in the view's order
  };
  std::vector<Candidate> cands;
  for (size_t i = 0; i < view.members.size(); ++i) {
    const MemberView& m = view.members[i];
    if (m.member.role != "worker" || !m.up || exclude.count(m.member.name)) continue;
    Candidate cand;
    cand.c.worker = m.member.name;
    const int64_t here = in_flight_.count(m.member.name) ? in_flight_.at(m.member.name) : 0;
    cand.c.load = std::max(here, m.report.in_flight + m.report.queued);
    cand.full = m.report.max_requests > 0 && cand.c.load >= m.report.max_requests + m.report.max_queue;
    if (policy_ == RoutingPolicy::kv_aware && !chunks.empty()) {
      const auto keys = keys_for(m.report, chunks);
      const auto rit = recent_.find(m.member.name);
      for (size_t k = 0; k < keys.size(); ++k) {
        bool held = m.held->contains(keys[k]);
        if (!held && rit != recent_.end()) {
          const auto kit = rit->second.keys.find({keys[k].hi, keys[k].lo});
          held = kit != rit->second.keys.end() && kit->second > now;
        }
        const auto tokens = static_cast<int64_t>(chunks[k].size());
        if (held) {
          cand.c.held_tokens += tokens;
        } else if (m.report.uses_storage) {
          // On a storage node that is up: this worker loads it instead of computing it.
          for (const MemberView& s : view.members)
            if (s.member.role == "storage" && s.up && s.held->contains(keys[k])) {
              cand.c.storage_tokens += tokens;
              break;
            }
        }
      }
    }
    cands.push_back(std::move(cand));
  }
  if (cands.empty()) return std::nullopt;
  const bool all_full = std::all_of(cands.begin(), cands.end(), [](const Candidate& c) { return c.full; });
  // In turn: the rotation decides among equals, starting after the last choice. It
  // runs over the candidates, not the view's members: a frontend or storage node
  // listed between the workers must not give one worker two turns in a row.
  const uint64_t turn = turn_++;
  for (size_t i = 0; i < cands.size(); ++i) cands[i].index = i;
  auto rotation = [&](const Candidate& c) { return (c.index + cands.size() - turn % cands.size()) % cands.size(); };
  auto better = [&](const Candidate& a, const Candidate& b) {
    if (!all_full && a.full != b.full) return !a.full;
    if (policy_ == RoutingPolicy::kv_aware) {
      // Least to compute first (what it holds or loads from a storage node), then
      // most held locally (a local load is faster than a remote one), then load.
      const int64_t ra = a.c.held_tokens + a.c.storage_tokens, rb = b.c.held_tokens + b.c.storage_tokens;
      if (ra != rb) return ra > rb;
      if (a.c.held_tokens != b.c.held_tokens) return a.c.held_tokens > b.c.held_tokens;
      if (a.c.load != b.c.load) return a.c.load < b.c.load;
    }
    return rotation(a) < rotation(b);
  };
  auto best = std::min_element(cands.begin(), cands.end(), [&](const Candidate& a, const Candidate& b) { return better(a, b); });
  RouteChoice out = best->c;
  out.overloaded = all_full;
  return out;
}

void RequestRouter::started(const ClusterView& view, const std::string& worker,
                            const std::vector<std::vector<int32_t>>& chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  ++in_flight_[worker];
  const MemberView* m = view.find(worker);
  if (!m || chunks.empty()) return;
  const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(recent_for_);
  auto& recent = recent_[worker].keys;
  for (const auto& k : keys_for(m->report, chunks)) recent[{k.hi, k.lo}] = until;
  // Bounded: expired entries go whenever new ones come.
  const auto now = clock_type::now();
  for (auto it = recent.begin(); it != recent.end();) it = it->second <= now ? recent.erase(it) : std::next(it);
}

void RequestRouter::finished(const std::string& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find(worker);
  if (it != in_flight_.end() && it->second > 0) --it->second;
}

int64_t RequestRouter::in_flight(const std::string& worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find(worker);
  return it == in_flight_.end() ? 0 : it->second;
}

}  // namespace bs
