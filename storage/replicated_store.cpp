#include "storage/replicated_store.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <stdexcept>

namespace bs {

namespace {
constexpr size_t kMaxQueuedRepairs = 256;
constexpr size_t kMaxVerified = 65536;  // keys remembered as on all their nodes
}  // namespace

ReplicatedKvStore::ReplicatedKvStore(std::vector<ReplicaNode> nodes, int replication) : replication_(replication) {
  if (nodes.empty()) throw std::invalid_argument("remote tier: no storage node");
  if (replication < 1 || replication > static_cast<int>(nodes.size()))
    throw std::invalid_argument("remote tier: replication " + std::to_string(replication) + " with " +
                                std::to_string(nodes.size()) + " storage node(s)");
  std::set<std::string> names;
  for (auto& n : nodes) {
    if (!names.insert(n.name).second) throw std::invalid_argument("remote tier: two storage nodes named " + n.name);
    nodes_.push_back({n.name, std::make_unique<RemoteKvStore>(std::move(n.options))});
  }
  repairer_ = std::thread([this] { repair_loop(); });
}

ReplicatedKvStore::~ReplicatedKvStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  repairer_.join();
}

std::vector<size_t> ReplicatedKvStore::replicas(const ChunkKey& key) const {
  std::vector<std::pair<uint64_t, size_t>> scored;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const std::string& n = nodes_[i].name;
    // The key's 128 bits seed the node name's hash: a score per (key, node).
    const uint64_t score = XXH3_64bits_withSeed(n.data(), n.size(), key.hi ^ (key.lo * 0x9e3779b97f4a7c15ULL));
    scored.emplace_back(score, i);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<size_t> out;
  for (int r = 0; r < replication_; ++r) out.push_back(scored[static_cast<size_t>(r)].second);
  return out;
}

std::unique_ptr<LayerReader> ReplicatedKvStore::open_layers(const ChunkKey& key) {
  for (size_t i : replicas(key)) {
    RemoteKvStore& n = *nodes_[i].store;
    if (n.is_down()) continue;
    if (auto reader = n.open_layers(key)) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      after_read(key, i);
      return reader;
    }
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

std::shared_ptr<const ChunkKv> ReplicatedKvStore::get(const ChunkKey& key) {
  for (size_t i : replicas(key)) {
    RemoteKvStore& n = *nodes_[i].store;
    if (n.is_down()) continue;
    if (auto kv = n.get(key)) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      after_read(key, i);
      return kv;
    }
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

bool ReplicatedKvStore::contains(const ChunkKey& key) const {
  for (size_t i : replicas(key)) {
    const RemoteKvStore& n = *nodes_[i].store;
    if (!n.is_down() && n.contains(key)) return true;
  }
  return false;
}

bool ReplicatedKvStore::put(const ChunkKey& key, std::shared_ptr<const ChunkKv> kv) {
  if (!kv) return false;
  int stored = 0;
  for (size_t i : replicas(key)) stored += nodes_[i].store->put(key, kv) ? 1 : 0;
  if (stored == 0) return false;
  if (stored < replication_) under_replicated_.fetch_add(1, std::memory_order_relaxed);
  puts_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool ReplicatedKvStore::erase(const ChunkKey& key) {
  bool any = false;
  for (size_t i : replicas(key)) any = nodes_[i].store->erase(key) || any;
  return any;
}

StoreStats ReplicatedKvStore::stats() const {
  StoreStats st;
  for (const auto& n : nodes_) {
    const StoreStats s = n.store->stats();
    st.bytes += s.bytes;
    st.entries += s.entries;
    st.evictions += s.evictions;
    st.corrupt += s.corrupt;
    st.write_errors += s.write_errors;
  }
  st.hits = hits_.load(std::memory_order_relaxed);
  st.misses = misses_.load(std::memory_order_relaxed);
  st.puts = puts_.load(std::memory_order_relaxed);
  return st;
}

int64_t ReplicatedKvStore::budget() const {
  int64_t total = 0;
  for (const auto& n : nodes_) total += n.store->budget();
  return total / replication_;
}

bool ReplicatedKvStore::reachable() {
  bool any = false;
  for (auto& n : nodes_) any = n.store->reachable() || any;
  return any;
}

std::string ReplicatedKvStore::last_error() const {
  std::string out;
  for (const auto& n : nodes_)
    if (const std::string e = n.store->last_error(); !e.empty()) out += (out.empty() ? "" : "; ") + n.name + ": " + e;
  return out;
}

ReplicatedKvStore::ReplicationStats ReplicatedKvStore::replication_stats() const {
  return {under_replicated_.load(), repairs_.load(), repairs_failed_.load(), repairs_dropped_.load()};
}

void ReplicatedKvStore::after_read(const ChunkKey& key, size_t from) {
  std::vector<size_t> others;
  bool any_down = false;
  for (size_t i : replicas(key)) {
    if (i == from) continue;
    if (nodes_[i].store->is_down()) any_down = true;
    else others.push_back(i);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    // A node seen down may come back without what it had; one that restarted
    // between two reads is caught within a minute.
    const auto now = std::chrono::steady_clock::now();
    if (any_down || now - verified_since_ > std::chrono::seconds(60)) {
      verified_.clear();
      verified_since_ = now;
    }
    if (others.empty() || verified_.count(key)) return;
    if (queue_.size() >= kMaxQueuedRepairs) {
      repairs_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back({key, from, std::move(others)});
  }
  cv_.notify_all();
}

void ReplicatedKvStore::repair_loop() {
  for (;;) {
    Repair r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      r = std::move(queue_.front());
      queue_.pop_front();
      repairing_ = true;
    }
    // The nodes that lack it get a copy: read whole from the node that served it
    // (checked slice by slice against its checksums), then written.
    std::vector<size_t> lacking;
    bool all_there = true;
    for (size_t to : r.to) {
      RemoteKvStore& n = *nodes_[to].store;
      if (n.is_down()) all_there = false;
      else if (!n.contains(r.key)) lacking.push_back(to);
    }
    std::shared_ptr<const ChunkKv> kv;
    if (!lacking.empty()) kv = nodes_[r.from].store->get(r.key);
    for (size_t to : lacking) {
      if (kv && nodes_[to].store->put(r.key, kv)) {
        repairs_.fetch_add(1, std::memory_order_relaxed);
      } else {
        repairs_failed_.fetch_add(1, std::memory_order_relaxed);
        all_there = false;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      repairing_ = false;
      if (all_there) {
        if (verified_.size() >= kMaxVerified) verified_.clear();
        verified_.insert(r.key);
      }
    }
    cv_.notify_all();
  }
}

bool ReplicatedKvStore::wait_repairs_idle(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return queue_.empty() && !repairing_; });
}

}  // namespace bs
