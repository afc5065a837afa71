// The RAM tier: LRU order under a byte budget, the eviction (demotion) listener,
// and consistent stats under concurrent use.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "storage/memory_store.h"

namespace bs {
namespace {

// An entry of exactly `floats` K floats, as many V floats and one token: its bytes()
// is 8 * floats + 4. `tag` makes the token (and so the key) distinct.
std::shared_ptr<ChunkKv> make_kv(int32_t tag, int floats = 256) {
  auto kv = std::make_shared<ChunkKv>();
  kv->n_layers = 1, kv->kv_heads = 1, kv->head_dim = floats;
  kv->tokens = {tag};
  const std::vector<float> k(static_cast<size_t>(floats), static_cast<float>(tag)), v(k.size(), -static_cast<float>(tag));
  kv->set_fp32(k, v);
  return kv;
}

ChunkKey key_of(int32_t tag) {
  const int32_t t = tag;
  return make_chunk_key(3, KvKind::Chunk, std::span<const int32_t>(&t, 1));
}

constexpr int64_t kEntry = 8 * 256 + 4;  // bytes() of make_kv(tag)

// Records what the listener saw.
struct Recorder {
  std::mutex mu;
  std::vector<ChunkKey> keys;
  std::vector<std::shared_ptr<const ChunkKv>> kvs;
  MemoryKvStore::EvictionListener listener() {
    return [this](const ChunkKey& k, std::shared_ptr<const ChunkKv> kv) {
      std::lock_guard<std::mutex> lock(mu);
      keys.push_back(k);
      kvs.push_back(std::move(kv));
    };
  }
};

// A pinner (a device backend's pin_host) page-locks each entry's K and V once when it
// is stored — both or neither — and the lock goes with the last reference to the entry
// (a reader's, after eviction), not with the eviction; a pinner that declines leaves the
// entry stored and unpinned.
TEST(MemoryStore, APinnerLocksEachEntryOnceUntilItsLastReaderLetsGo) {
  struct Pins {
    std::mutex mu;
    std::vector<const void*> pinned, released;
    bool decline_v = false;
  } pins;
  MemoryKvStore::Pinner pinner = [&pins](const void* p, int64_t bytes) -> std::shared_ptr<void> {
    EXPECT_GT(bytes, 0);
    std::lock_guard<std::mutex> lock(pins.mu);
    if (pins.decline_v && pins.pinned.size() % 2 == 1) return nullptr;
    pins.pinned.push_back(p);
    return std::shared_ptr<void>(const_cast<void*>(p), [&pins](void* q) {
      std::lock_guard<std::mutex> l(pins.mu);
      pins.released.push_back(q);
    });
  };
  MemoryKvStore store(2 * kEntry, pinner);
  auto a = make_kv(1);
  const void* ak = a->k.data();
  const void* av = a->v.data();
  ASSERT_TRUE(store.put(key_of(1), a));
  ASSERT_TRUE(store.put(key_of(1), a));  // put again: pinned once
  EXPECT_EQ(pins.pinned, (std::vector<const void*>{ak, av}));
  EXPECT_NE(a->host_pin, nullptr);
  std::shared_ptr<const ChunkKv> reader = store.get(key_of(1));
  a.reset();
  ASSERT_TRUE(store.put(key_of(2), make_kv(2)));
  ASSERT_TRUE(store.put(key_of(3), make_kv(3)));  // evicts 1
  EXPECT_FALSE(store.contains(key_of(1)));
  EXPECT_TRUE(pins.released.empty()) << "the reader still holds entry 1";
  reader.reset();
  EXPECT_EQ(pins.released.size(), 2u);
  EXPECT_TRUE(std::find(pins.released.begin(), pins.released.end(), ak) != pins.released.end());
  EXPECT_TRUE(std::find(pins.released.begin(), pins.released.end(), av) != pins.released.end());

  // Erased entries nobody reads: unlocked at once.
  ASSERT_TRUE(store.erase(key_of(2)));
  ASSERT_TRUE(store.erase(key_of(3)));
  EXPECT_EQ(pins.released.size(), 6u);

  // V declined: K's lock is let go at once, the entry is stored unpinned.
  pins.decline_v = true;
  auto d = make_kv(4);
  ASSERT_TRUE(store.put(key_of(4), d));
  EXPECT_EQ(d->host_pin, nullptr);
  EXPECT_EQ(pins.released.size(), 7u);
  EXPECT_TRUE(store.contains(key_of(4)));
}

TEST(MemoryStore, EvictsLeastRecentlyUsedAndGetRefreshes) {
  MemoryKvStore store(3 * kEntry);
  ASSERT_EQ(static_cast<int64_t>(make_kv(0)->bytes()), kEntry);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.put(key_of(i), make_kv(i)));
  EXPECT_EQ(store.stats().bytes, 3 * kEntry);
  ASSERT_NE(store.get(key_of(0)), nullptr);  // order now (most recent first): 0 2 1
  ASSERT_TRUE(store.put(key_of(3), make_kv(3)));
  EXPECT_FALSE(store.contains(key_of(1)));
  for (int i : {0, 2, 3}) EXPECT_TRUE(store.contains(key_of(i))) << i;
  ASSERT_TRUE(store.put(key_of(4), make_kv(4)));  // 0 3 2 -> evicts 2
  EXPECT_FALSE(store.contains(key_of(2)));
  // contains() does not refresh: 0 is now the least recent.
  ASSERT_TRUE(store.put(key_of(5), make_kv(5)));
  EXPECT_FALSE(store.contains(key_of(0)));
  const StoreStats s = store.stats();
  EXPECT_EQ(s.evictions, 3);
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.bytes, 3 * kEntry);
  EXPECT_LE(s.bytes, store.budget());
  EXPECT_EQ(s.puts, 6);
  EXPECT_EQ(s.hits, 1);
}

TEST(MemoryStore, ListenerSeesExactlyTheEvictedEntriesInOrder) {
  MemoryKvStore store(4 * kEntry);
  Recorder rec;
  store.set_eviction_listener(rec.listener());
  std::vector<std::shared_ptr<ChunkKv>> kvs;
  for (int i = 0; i < 8; ++i) kvs.push_back(make_kv(i));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.put(key_of(i), kvs[i]));
  EXPECT_TRUE(rec.keys.empty());
  store.get(key_of(0));
  store.get(key_of(2));  // recency, most recent first: 2 0 3 1
  ASSERT_TRUE(store.put(key_of(4), kvs[4]));
  ASSERT_EQ(rec.keys.size(), 1u);
  EXPECT_EQ(rec.keys[0], key_of(1));
  EXPECT_EQ(rec.kvs[0], kvs[1]);  // the very entry, not a copy

  // One big entry evicts several at once, least recent first: 3, then 0, then 2.
  auto big = make_kv(100, 3 * 256);  // 3 * kEntry - 8 bytes
  ASSERT_TRUE(store.put(key_of(100), big));
  ASSERT_EQ(rec.keys.size(), 4u);
  EXPECT_EQ(rec.keys[1], key_of(3));
  EXPECT_EQ(rec.keys[2], key_of(0));
  EXPECT_EQ(rec.keys[3], key_of(2));
  EXPECT_EQ(rec.kvs[1], kvs[3]);
  EXPECT_EQ(rec.kvs[2], kvs[0]);
  EXPECT_EQ(rec.kvs[3], kvs[2]);
  for (int i : {0, 1, 2, 3}) EXPECT_FALSE(store.contains(key_of(i))) << i;
  EXPECT_TRUE(store.contains(key_of(4)));
  EXPECT_TRUE(store.contains(key_of(100)));
  EXPECT_EQ(store.stats().evictions, 4);
  EXPECT_LE(store.stats().bytes, store.budget());

  // Every eviction was reported, and nothing else.
  EXPECT_EQ(static_cast<int64_t>(rec.keys.size()), store.stats().evictions);
}

TEST(MemoryStore, ListenerNotCalledForEraseReplaceOrRefusal) {
  MemoryKvStore store(2 * kEntry);
  Recorder rec;
  store.set_eviction_listener(rec.listener());
  ASSERT_TRUE(store.put(key_of(1), make_kv(1)));
  ASSERT_TRUE(store.put(key_of(2), make_kv(2)));
  // Replacing a key: the old value is not an eviction.
  auto newer = make_kv(2);
  newer->k[0] = std::byte{42};
  ASSERT_TRUE(store.put(key_of(2), newer));
  EXPECT_EQ(store.get(key_of(2)), newer);
  EXPECT_TRUE(rec.keys.empty());
  EXPECT_EQ(store.stats().bytes, 2 * kEntry);
  EXPECT_EQ(store.stats().entries, 2);
  // erase is not an eviction either.
  EXPECT_TRUE(store.erase(key_of(1)));
  EXPECT_FALSE(store.erase(key_of(1)));
  EXPECT_TRUE(rec.keys.empty());
  EXPECT_EQ(store.stats().bytes, kEntry);
  EXPECT_EQ(store.stats().evictions, 0);

  // Larger than the whole budget: refused, nothing evicted or reported.
  auto huge = make_kv(9, 1024);
  EXPECT_FALSE(store.put(key_of(9), huge));
  EXPECT_FALSE(store.contains(key_of(9)));
  EXPECT_TRUE(store.contains(key_of(2)));
  EXPECT_TRUE(rec.keys.empty());
  EXPECT_EQ(store.stats().evictions, 0);
  EXPECT_EQ(store.stats().puts, 3);
  EXPECT_FALSE(store.put(key_of(10), nullptr));

  // Exactly the budget fits, evicting the rest.
  auto exact = make_kv(11, 2 * 256);  // 2 * kEntry - 4 bytes
  ASSERT_TRUE(store.put(key_of(11), exact));
  ASSERT_EQ(rec.keys.size(), 1u);
  EXPECT_EQ(rec.keys[0], key_of(2));
  EXPECT_LE(store.stats().bytes, store.budget());

  // Removing the listener: later evictions are not reported.
  store.set_eviction_listener(nullptr);
  ASSERT_TRUE(store.put(key_of(12), make_kv(12)));
  EXPECT_EQ(rec.keys.size(), 1u);
  EXPECT_EQ(store.stats().evictions, 2);
}

// The listener runs outside the store's lock: it may call back into the store
// (the runtime's demotion does put() on another tier, and may look here first).
TEST(MemoryStore, ListenerMayUseTheStore) {
  MemoryKvStore store(2 * kEntry);
  MemoryKvStore lower(100 * kEntry);
  int calls = 0;
  store.set_eviction_listener([&](const ChunkKey& k, std::shared_ptr<const ChunkKv> kv) {
    ++calls;
    EXPECT_FALSE(store.contains(k));  // already gone from this tier
    EXPECT_GE(store.stats().entries, 1);
    lower.put(k, std::move(kv));
  });
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store.put(key_of(i), make_kv(i)));
  EXPECT_EQ(calls, 3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(lower.contains(key_of(i))) << i;
  EXPECT_EQ(lower.stats().entries, 3);
}

TEST(MemoryStore, ConcurrentPutGetKeepsStatsConsistent) {
  constexpr int kKeys = 64, kThreads = 4, kOps = 5000;
  MemoryKvStore store(16 * kEntry);
  std::atomic<int64_t> listened{0}, wrong{0}, gets{0}, puts_ok{0};
  store.set_eviction_listener([&](const ChunkKey&, std::shared_ptr<const ChunkKv> kv) {
    if (!kv) ++wrong;
    ++listened;
  });
  std::vector<std::shared_ptr<ChunkKv>> kvs;
  for (int i = 0; i < kKeys; ++i) kvs.push_back(make_kv(i));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      for (int op = 0; op < kOps; ++op) {
        const int i = static_cast<int>(rng() % kKeys);
        if (rng() % 2) {
          if (store.put(key_of(i), kvs[i])) ++puts_ok;
        } else {
          ++gets;
          if (auto got = store.get(key_of(i)); got && got != kvs[i]) ++wrong;
        }
        if (op % 97 == 0) {
          const StoreStats s = store.stats();
          if (s.bytes > store.budget() || s.bytes != s.entries * kEntry) ++wrong;
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  const StoreStats s = store.stats();
  EXPECT_EQ(s.hits + s.misses, gets.load());
  EXPECT_EQ(s.puts, puts_ok.load());
  EXPECT_EQ(s.puts, int64_t{kThreads} * kOps - gets.load());
  EXPECT_EQ(s.evictions, listened.load());
  EXPECT_EQ(s.bytes, s.entries * kEntry);
  EXPECT_LE(s.bytes, store.budget());
  EXPECT_LE(s.entries, 16);
  int present = 0;
  for (int i = 0; i < kKeys; ++i) present += store.contains(key_of(i)) ? 1 : 0;
  EXPECT_EQ(present, s.entries);
}

}  // namespace
}  // namespace bs
