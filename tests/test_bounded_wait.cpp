// kernels/bounded_wait.h: the poll behind every host wait of a device backend (the
// CUDA backend's copies, steps and stream drains) — it returns as soon as the work is
// done, gives up at its limit instead of hanging, and does not burn a core meanwhile.
#include "kernels/bounded_wait.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>

namespace {

using bs::kernels::wait_bounded;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

TEST(BoundedWait, ReturnsWhenTheWorkIsDoneAndAsksNoMore) {
  int asked = 0;
  EXPECT_TRUE(wait_bounded([&] { return ++asked == 1000; }, 60s));
  EXPECT_EQ(asked, 1000);
  // Done before the first look: one question.
  asked = 0;
  EXPECT_TRUE(wait_bounded([&] { return ++asked >= 1; }, 60s));
  EXPECT_EQ(asked, 1);
}

TEST(BoundedWait, GivesUpAtItsLimitInsteadOfHanging) {
  int asked = 0;
  const auto t0 = clock_type::now();
  EXPECT_FALSE(wait_bounded([&] { return ++asked < 0; }, 30ms));
  const auto waited = clock_type::now() - t0;
  EXPECT_GE(waited, 30ms);
  EXPECT_LT(waited, 10s);  // not a speed bound: "it came back at all"
  EXPECT_GE(asked, 2);
}

TEST(BoundedWait, WorkThatEndsAtTheLimitStillCounts) {
  // The last question is asked after the deadline passed.
  const auto t0 = clock_type::now();
  EXPECT_TRUE(wait_bounded([&] { return clock_type::now() - t0 >= 20ms; }, 20ms, 0ns));
  // A zero limit asks exactly once.
  int asked = 0;
  EXPECT_FALSE(wait_bounded([&] { return ++asked < 0; }, 0ns));
  EXPECT_EQ(asked, 1);
}

TEST(BoundedWait, ALongWaitSleepsRatherThanSpins) {
  // No spin phase, 200 ms: naps from 50 us growing to 1 ms ask a few hundred times at
  // most; a busy loop would ask millions of times.
  int asked = 0;
  EXPECT_FALSE(wait_bounded([&] { return ++asked < 0; }, 200ms, 0ns));
  EXPECT_LT(asked, 1000);
  EXPECT_GE(asked, 2);
}

TEST(BoundedWait, ADeviceErrorWhileWaitingIsThrownToTheWaiter) {
  int asked = 0;
  EXPECT_THROW(wait_bounded(
                   [&]() -> bool {
                     if (++asked == 3) throw std::runtime_error("cuda: illegal address");
                     return false;
                   },
                   60s),
               std::runtime_error);
  EXPECT_EQ(asked, 3);
}

}  // namespace
