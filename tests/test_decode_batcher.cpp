// DecodeBatcher's clock (actors/runtime/decode_batcher.h): when a step is due is measured per
// waiting request, from when its last step began, or from when it was added before its
// first step — not from the batcher's last step, which for a stream that has just had
// its first token says nothing of how long it waited. The layer worker holds the
// streams' step behind prefills until one is due, and runs one inline between a
// prefill's layers when one is; the joins and takes are what a drain job does.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "actors/runtime/decode_batcher.h"

namespace bs {
namespace {

using namespace std::chrono_literals;

DecodeSlotPtr slot(uint64_t id) {
  auto s = std::make_shared<DecodeSlot>();
  s->id = id;
  return s;
}

TEST(DecodeBatcher, AFirstStepIsDueOnceTheRequestWaitedTheIntervalNotBefore) {
  DecodeBatcher b;
  EXPECT_FALSE(b.due(0s));  // nothing waits
  EXPECT_TRUE(b.add(slot(1), 7));  // the first add asks for a drain job
  EXPECT_FALSE(b.add(slot(2), 8));  // one is counted as queued already
  EXPECT_TRUE(b.due(0s));
  EXPECT_FALSE(b.due(10s));  // no step ever ran: the wait counts from the add
  std::this_thread::sleep_for(60ms);
  EXPECT_TRUE(b.due(50ms));
}

TEST(DecodeBatcher, ALaterStepIsDueIntervalAfterTheRequestsLastStepBegan) {
  DecodeBatcher b;
  b.add(slot(1), 7);
  bool more = true;
  auto taken = b.take(4, 0ms, more);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_FALSE(more);
  b.step_began({1});
  std::this_thread::sleep_for(1050ms);  // the step, then the decoder, took this long
  EXPECT_TRUE(b.add(taken[0].slot, 9));
  EXPECT_TRUE(b.due(1s));  // it has waited since its step began, not since it came back
  // A request added at the same moment has not waited: only the first is due at 1 s.
  DecodeBatcher fresh;
  fresh.add(slot(2), 9);
  EXPECT_FALSE(fresh.due(1s));
  // Taken inline, then finished: forgotten, its clock too (an id is never reused, but
  // the map must not grow with every request served).
  auto now = b.take_now(4);
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].token, 9);
  EXPECT_FALSE(b.due(0s));
  b.forget(1);
  b.add(slot(1), 3);  // as if new: counts from now
  EXPECT_FALSE(b.due(1s));
}

}  // namespace
}  // namespace bs
