// The in-process communicator (kernels/communicator.h): real threads, one per rank.
// Sums are bit-identical on every rank and equal the sum in rank order; gathers and
// broadcasts put every rank's bytes where they belong; a rank that never arrives, or
// ranks that issue different collectives, fail every rank with an error that names
// what happened, within the timeout, and the group stays failed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/communicator.h"

namespace bs::kernels {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Runs body(rank) on one thread per rank; returns each rank's error message ("" if none).
std::vector<std::string> on_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
                                  const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<float> rank_values(int rank, int64_t count) {
  std::mt19937 rng(static_cast<uint32_t>(100 + rank));
  std::normal_distribution<float> d(0.0f, 1e3f);  // large and mixed: the order of additions shows
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(InprocessCommunicator, AllReduceIsTheRankOrderSumBitIdenticalOnEveryRank) {
  for (int size : {1, 2, 3, 4}) {
    auto comms = make_inprocess_group(size);
    const int64_t count = 1001;
    std::vector<float> want = rank_values(0, count);
    for (int r = 1; r < size; ++r) {
      const auto x = rank_values(r, count);
      for (int64_t i = 0; i < count; ++i) want[static_cast<size_t>(i)] += x[static_cast<size_t>(i)];
    }
    std::vector<std::vector<float>> got(static_cast<size_t>(size));
    std::vector<std::vector<double>> got64(static_cast<size_t>(size));
    const auto errors = on_ranks(comms, [&](Communicator& c) {
      for (int repeat = 0; repeat < 20; ++repeat) {  // rounds back to back
        auto buf = rank_values(c.rank(), count);
        c.all_reduce_sum(buf.data(), count, 5s);
        got[static_cast<size_t>(c.rank())] = buf;
        std::vector<double> d(3, static_cast<double>(c.rank()) + 0.5);
        c.all_reduce_sum(d.data(), 3, 5s);
        got64[static_cast<size_t>(c.rank())] = d;
      }
    });
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "");
      EXPECT_EQ(std::memcmp(got[static_cast<size_t>(r)].data(), want.data(), want.size() * sizeof(float)), 0)
          << "rank " << r << " of " << size;
      EXPECT_EQ(got64[static_cast<size_t>(r)], std::vector<double>(3, size * size / 2.0)) << "rank " << r;
    }
  }
}

TEST(InprocessCommunicator, AllGatherBroadcastAndBarrier) {
  const int size = 3;
  auto comms = make_inprocess_group(size);
  std::vector<std::vector<float>> gathered(size);
  std::vector<std::string> decisions(size);
  const auto errors = on_ranks(comms, [&](Communicator& c) {
    const std::vector<float> mine = {static_cast<float>(c.rank()), static_cast<float>(10 * c.rank())};
    std::vector<float> all(static_cast<size_t>(2 * size));
    c.all_gather(mine.data(), all.data(), 2, 5s);
    gathered[static_cast<size_t>(c.rank())] = all;
    for (int root = 0; root < size; ++root) {  // the leader's decision, as bytes
      char decision[32] = {};
      if (c.rank() == root) std::snprintf(decision, sizeof decision, "step %d: layer 7", root);
      c.broadcast(decision, sizeof decision, root, 5s);
      decisions[static_cast<size_t>(c.rank())] += std::string(decision) + ";";
    }
    c.barrier(5s);
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(gathered[static_cast<size_t>(r)], (std::vector<float>{0, 0, 1, 10, 2, 20})) << "rank " << r;
    EXPECT_EQ(decisions[static_cast<size_t>(r)], "step 0: layer 7;step 1: layer 7;step 2: layer 7;") << "rank " << r;
  }
  EXPECT_THROW(comms[0]->broadcast(nullptr, 0, 3, 1s), std::invalid_argument);
  EXPECT_THROW(make_inprocess_group(0), std::invalid_argument);
}

// Rank 2 never calls: ranks 0 and 1 fail after the timeout, naming the op and rank 2;
// the group stays failed, so rank 2's late call fails at once instead of pairing with
// a stale round.
TEST(InprocessCommunicator, AMissingRankFailsTheOthersWithinTheTimeoutAndTheGroupStaysFailed) {
  auto comms = make_inprocess_group(3);
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 2) return;
    float x = 1.0f;
    c.all_reduce_sum(&x, 1, 300ms);
  });
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 5s);
  for (int r : {0, 1}) {
    EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("all_reduce_sum(f32)"));
    EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("never arrived"));
  }
  EXPECT_THAT(errors[0] + errors[1], HasSubstr("ranks 2 never arrived"));
  float late = 1.0f;
  try {
    comms[2]->all_reduce_sum(&late, 1, 5s);
    FAIL() << "a failed group accepted a collective";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("never arrived"));
  }
}

// Different collectives on different ranks (the hang tensor parallelism must never
// have): every rank fails, naming the disagreement.
TEST(InprocessCommunicator, RanksIssuingDifferentCollectivesAllFail) {
  auto comms = make_inprocess_group(2);
  const auto errors = on_ranks(comms, [&](Communicator& c) {
    std::vector<float> x(c.rank() == 0 ? 4 : 5, 1.0f);
    c.all_reduce_sum(x.data(), static_cast<int64_t>(x.size()), 5s);
  });
  for (const auto& e : errors) EXPECT_THAT(e, HasSubstr("the ranks issued different collectives"));
  auto comms2 = make_inprocess_group(2);
  const auto errors2 = on_ranks(comms2, [&](Communicator& c) {
    if (c.rank() == 0) {
      c.barrier(5s);
    } else {
      float x = 0;
      c.all_reduce_sum(&x, 1, 5s);
    }
  });
  for (const auto& e : errors2) EXPECT_THAT(e, HasSubstr("different collectives"));
}

// Many collectives back to back with odd sizes, both dtypes, byte gathers and
// broadcasts mixed, in one sequence every rank follows (as the leader's steps make
// them): every result is checked against the rank-order computation.
TEST(InprocessCommunicator, StressOfMixedCollectivesOfOddSizes) {
  for (int size : {2, 3, 4}) {
    auto comms = make_inprocess_group(size);
    std::vector<int64_t> failures(static_cast<size_t>(size), 0);
    const auto errors = on_ranks(comms, [&](Communicator& c) {
      std::mt19937 sizes(7);  // the same sequence of sizes on every rank
      int64_t& bad = failures[static_cast<size_t>(c.rank())];
      for (int round = 0; round < 300; ++round) {
        const int64_t n = 1 + static_cast<int64_t>(sizes() % 777);
        switch (round % 4) {
          case 0: {
            std::vector<float> x(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(c.rank() * 1000 + i);
            c.all_reduce_sum(x.data(), n, 10s);
            for (int64_t i = 0; i < n; ++i) {
              float want = 0;
              for (int r = 0; r < size; ++r) want += static_cast<float>(r * 1000 + i);
              bad += x[static_cast<size_t>(i)] != want;
            }
            break;
          }
          case 1: {
            std::vector<double> x(static_cast<size_t>(n), 0.25 * (c.rank() + 1) + round);
            c.all_reduce_sum(x.data(), n, 10s);
            double want = 0;
            for (int r = 0; r < size; ++r) want += 0.25 * (r + 1) + round;
            for (double v : x) bad += v != want;
            break;
          }
          case 2: {
            std::vector<unsigned char> mine(static_cast<size_t>(n), static_cast<unsigned char>(c.rank() + round));
            std::vector<unsigned char> all(static_cast<size_t>(n * size));
            c.all_gather_bytes(mine.data(), all.data(), n, 10s);
            for (int r = 0; r < size; ++r)
              for (int64_t i = 0; i < n; ++i)
                bad += all[static_cast<size_t>(r * n + i)] != static_cast<unsigned char>(r + round);
            break;
          }
          default: {
            std::vector<int32_t> d(static_cast<size_t>(n), c.rank() == round % size ? round : -1);
            c.broadcast(d.data(), n * static_cast<int64_t>(sizeof(int32_t)), round % size, 10s);
            for (int32_t v : d) bad += v != round;
          }
        }
      }
    });
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r << " of " << size;
      EXPECT_EQ(failures[static_cast<size_t>(r)], 0) << "rank " << r << " of " << size;
    }
  }
}

// A rank whose own work failed aborts the group: the others, waiting in a collective
// with a long timeout, fail at once with the reason, and the group stays failed.
TEST(InprocessCommunicator, AnAbortFailsTheWaitingRanksAtOnce) {
  auto comms = make_inprocess_group(3);
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(50ms);
      c.abort("layer 4 threw: out of memory");
      return;
    }
    float x = 1.0f;
    c.all_reduce_sum(&x, 1, 60s);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int r : {0, 2}) EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("aborted by rank 1: layer 4 threw"));
  for (const auto& c : comms) EXPECT_TRUE(c->failed());
  EXPECT_THROW(comms[0]->barrier(1s), CommError);
  auto fresh = make_inprocess_group(3);
  EXPECT_FALSE(fresh[0]->failed());
}

}  // namespace
}  // namespace bs::kernels
