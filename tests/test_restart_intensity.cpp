// The supervisor's restart intensity (actors/runtime/restart_intensity.h) on its own: how
// many deaths a sliding window allows, the backoff each asks for, and that deaths
// older than the window stop counting.
#include <gtest/gtest.h>

#include "actors/runtime/restart_intensity.h"

namespace bs {
namespace {

TEST(RestartIntensity, RestartsUpToTheLimitWithinTheWindowWithADoublingBackoff) {
  RestartIntensity r(RestartLimits{3, 60, 0.5, 1.5});
  const RestartDecision first = r.on_death(100);
  EXPECT_TRUE(first.restart);
  EXPECT_EQ(first.deaths_in_window, 1);
  EXPECT_EQ(first.backoff_s, 0);  // one death: restarted at once, nothing paused
  const RestartDecision second = r.on_death(101);
  EXPECT_TRUE(second.restart);
  EXPECT_EQ(second.deaths_in_window, 2);
  EXPECT_DOUBLE_EQ(second.backoff_s, 0.5);
  const RestartDecision third = r.on_death(102);
  EXPECT_TRUE(third.restart);
  EXPECT_DOUBLE_EQ(third.backoff_s, 1.0);
  const RestartDecision fourth = r.on_death(103);  // max_restarts 3: the fourth death fails the role
  EXPECT_FALSE(fourth.restart);
  EXPECT_EQ(fourth.deaths_in_window, 4);
  EXPECT_DOUBLE_EQ(fourth.backoff_s, 1.5);  // doubled to 2, capped at 1.5
}

TEST(RestartIntensity, DeathsOlderThanTheWindowStopCounting) {
  RestartIntensity r(RestartLimits{2, 10, 0.1, 5});
  EXPECT_TRUE(r.on_death(0).restart);
  EXPECT_TRUE(r.on_death(5).restart);
  // 20 s later both have left the window: a first death again, no backoff.
  const RestartDecision later = r.on_death(25);
  EXPECT_TRUE(later.restart);
  EXPECT_EQ(later.deaths_in_window, 1);
  EXPECT_EQ(later.backoff_s, 0);
  // Exactly one window after a death, that death no longer counts.
  EXPECT_EQ(r.on_death(30).deaths_in_window, 2);
  EXPECT_EQ(r.on_death(35).deaths_in_window, 2);  // 25 left at 35 (= 25 + 10)
  EXPECT_FALSE(r.on_death(36).restart);            // 30, 35, 36: three within 10 s
}

TEST(RestartIntensity, ZeroRestartsFailsTheRoleAtItsFirstDeath) {
  RestartIntensity r(RestartLimits{0, 60, 0.1, 5});
  const RestartDecision d = r.on_death(1);
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.deaths_in_window, 1);
}

TEST(RestartIntensity, ABackoffNeverOverflowsAfterManyDeaths) {
  RestartIntensity r(RestartLimits{1000000, 1e9, 0.1, 7});
  RestartDecision d;
  for (int i = 0; i < 5000; ++i) d = r.on_death(i);
  EXPECT_TRUE(d.restart);
  EXPECT_DOUBLE_EQ(d.backoff_s, 7);
}

}  // namespace
}  // namespace bs
