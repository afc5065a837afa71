// A member's holdings as the frontend learns them (actors/cluster/holdings.h): the whole set
// first, then only what was added and removed; the keys listed again only when the
// tiers' counters moved; a frontend that has an old version, another epoch (the
// member restarted) or nothing gets the whole set; a delta from a base the frontend
// does not have is refused, never applied to the wrong set.
#include <gtest/gtest.h>

#include <vector>

#include "actors/cluster/holdings.h"

namespace bs {
namespace {

struct Member {
  std::vector<ChunkKey> keys;
  uint64_t mark = 0;
  int listed = 0;
  HoldingsLog log{[this] {
                    ++listed;
                    return keys;
                  },
                  [this] { return mark; }, /*keep_versions=*/3};
  void set(std::vector<ChunkKey> k) {
    keys = std::move(k);
    ++mark;
  }
};

TEST(Holdings, WholeSetFirstThenDeltas) {
  Member m;
  m.set({{3, 0}, {1, 0}, {2, 0}, {1, 0}});  // any order, duplicates: sorted, once each
  HeldKeys front;
  HoldingsDelta d = m.log.since(front.epoch(), front.version());
  EXPECT_TRUE(d.full);
  ASSERT_EQ(d.added.size(), 3u);
  auto next = front.apply(d);
  ASSERT_TRUE(next);
  front = *next;
  EXPECT_EQ(front.size(), 3u);
  EXPECT_TRUE(front.contains({2, 0}));
  EXPECT_EQ(m.log.held(), 3u);

  // Nothing changed (the mark did not move): an empty delta, the keys not listed again.
  d = m.log.since(front.epoch(), front.version());
  EXPECT_FALSE(d.full);
  EXPECT_TRUE(d.added.empty());
  EXPECT_TRUE(d.removed.empty());
  EXPECT_EQ(d.version, front.version());
  EXPECT_EQ(m.listed, 1);

  // The mark moved but the set is the same (a put over a held key): same version.
  ++m.mark;
  d = m.log.since(front.epoch(), front.version());
  EXPECT_EQ(d.version, front.version());
  EXPECT_EQ(m.listed, 2);

  m.set({{1, 0}, {3, 0}, {4, 0}});
  d = m.log.since(front.epoch(), front.version());
  EXPECT_FALSE(d.full);
  EXPECT_EQ(d.added, (std::vector<ChunkKey>{{4, 0}}));
  EXPECT_EQ(d.removed, (std::vector<ChunkKey>{{2, 0}}));
  front = *front.apply(d);
  EXPECT_TRUE(front.contains({4, 0}));
  EXPECT_FALSE(front.contains({2, 0}));
  EXPECT_EQ(front.size(), 3u);
}

TEST(Holdings, AFrontendTooFarBehindOrFromAnotherEpochGetsTheWholeSet) {
  Member m;
  m.set({{1, 0}});
  const HeldKeys old = *HeldKeys().apply(m.log.since(0, 0));
  for (int i = 2; i < 7; ++i) {  // five more versions; the log keeps three
    m.set({{static_cast<uint64_t>(i), 0}});
    m.log.since(old.epoch(), old.version());
  }
  HoldingsDelta d = m.log.since(old.epoch(), old.version());
  EXPECT_TRUE(d.full);
  EXPECT_EQ(d.added, (std::vector<ChunkKey>{{6, 0}}));
  // Another epoch (the member restarted; its versions start again at 1).
  Member restarted;
  restarted.set({{9, 0}});
  EXPECT_NE(restarted.log.epoch(), m.log.epoch());
  d = restarted.log.since(old.epoch(), 1);
  EXPECT_TRUE(d.full);
}

TEST(Holdings, ADeltaFromAnotherBaseIsRefused) {
  Member m;
  m.set({{1, 0}});
  const HeldKeys v1 = *HeldKeys().apply(m.log.since(0, 0));
  m.set({{1, 0}, {2, 0}});
  const HeldKeys v2 = *v1.apply(m.log.since(v1.epoch(), v1.version()));
  m.set({{2, 0}});
  const HoldingsDelta from_v2 = m.log.since(v2.epoch(), v2.version());
  EXPECT_FALSE(v1.apply(from_v2)) << "a delta from v2 applied to v1 would keep key 1";
  EXPECT_TRUE(v2.apply(from_v2));
  // Unsorted lists (a broken or lying member): refused.
  HoldingsDelta bad = from_v2;
  bad.added = {{5, 0}, {3, 0}};
  EXPECT_FALSE(v2.apply(bad));
}

}  // namespace
}  // namespace bs
