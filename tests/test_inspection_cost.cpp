// actors/runtime/inspection_cost.h: the collection of the inspection data times itself only
// while asked to (blendctl bench decode --inspection-cost), and then counts every
// collecting call — an actor's per-message counters, a trace's events and fields, the
// finished trace's JSON.
#include "actors/runtime/inspection_cost.h"

#include <gtest/gtest.h>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/trace.h"

namespace bs {
namespace {

struct Measuring {
  explicit Measuring(bool on) {
    InspectionCost::reset();
    InspectionCost::measuring = on;
  }
  ~Measuring() {
    InspectionCost::measuring = false;
    InspectionCost::reset();
  }
};

void collect_once(ActorCounters& c, RequestTrace& t) {
  { BusyScope busy(c, 3); }                        // two calls: taking the message, finishing it
  t.add_event({"loader-ram-0", "load", 1, 0.0, 0.5, 4096});
  t.set("tokens_out", 7);
  (void)t.json();
}

TEST(InspectionCost, OffItCountsNothing) {
  Measuring m(false);
  ActorCounters c;
  RequestTrace t(1, RequestTrace::clock::now());
  for (int i = 0; i < 100; ++i) collect_once(c, t);
  EXPECT_EQ(InspectionCost::calls.load(), 0);
  EXPECT_EQ(InspectionCost::ns.load(), 0);
  EXPECT_EQ(c.messages.load(), 100);  // the counters themselves work either way
}

TEST(InspectionCost, OnEveryCollectingCallIsTimed) {
  Measuring m(true);
  ActorCounters c;
  RequestTrace t(1, RequestTrace::clock::now());
  TraceBook book;
  book.open(1, RequestTrace::clock::now());
  for (int i = 0; i < 100; ++i) {
    collect_once(c, t);
    (void)book.find(1);
  }
  EXPECT_EQ(InspectionCost::calls.load(), 100 * 6);
  EXPECT_GT(InspectionCost::ns.load(), 0);
  EXPECT_EQ(c.messages.load(), 100);
  EXPECT_EQ(t.events().size(), 100u);
}

}  // namespace
}  // namespace bs
