// The in-process communicator: ranks are threads of one process sharing memory. A
// collective is a round in three steps under one mutex and condition variable:
//   1. every rank posts its op, count and buffer pointers (arrive);
//   2. once all have arrived (and agree on op and count), each rank computes its own
//      result from the posted buffers into private scratch, reading the inputs in rank
//      order (the same order on every rank: bit-identical sums);
//   3. once all have read (depart), each rank writes its result into its own buffer.
// Nobody writes a posted buffer before every rank has read it, and a new round cannot
// start before the previous one has been read by all. Any wait past its deadline
// fails the group: every rank's pending and later collectives throw CommError.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/communicator.h"

namespace bs::kernels {
namespace {

enum class Op { AllReduceF32, AllReduceF64, AllGather, AllGatherBytes, Broadcast, Barrier };

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduceF32: return "all_reduce_sum(f32)";
    case Op::AllReduceF64: return "all_reduce_sum(f64)";
    case Op::AllGather: return "all_gather";
    case Op::AllGatherBytes: return "all_gather_bytes";
    case Op::Broadcast: return "broadcast";
    case Op::Barrier: return "barrier";
  }
  return "?";
}

struct Posted {
  Op op = Op::Barrier;
  int64_t count = 0;
  int root = 0;
  const void* in = nullptr;
};

struct Group {
  explicit Group(int n) : size(n), posted(static_cast<size_t>(n)), arrived_in(static_cast<size_t>(n), false) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Posted> posted;
  std::vector<bool> arrived_in;  // which ranks have posted in the current round
  int arrived = 0;               // ranks posted in the current round
  int departed = 0;              // ranks done reading in the current round
  uint64_t round = 0;            // completed rounds
  bool reading = false;          // all arrived: ranks are reading the posted buffers
  std::string failure;           // non-empty: the group failed

  [[noreturn]] void fail(std::unique_lock<std::mutex>&, const std::string& why) {
    if (failure.empty()) failure = why;
    cv.notify_all();
    throw CommError(failure);
  }
  void check(std::unique_lock<std::mutex>& lock) {
    if (!failure.empty()) fail(lock, failure);
  }
  std::string missing() const {
    std::string out;
    for (int r = 0; r < size; ++r)
      if (!arrived_in[static_cast<size_t>(r)]) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
  }
};

class InprocessCommunicator final : public Communicator {
 public:
  InprocessCommunicator(std::shared_ptr<Group> group, int rank) : g_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  void all_reduce_sum(float* buf, int64_t count, Timeout timeout) override {
    reduce(Op::AllReduceF32, buf, count, timeout);
  }
  void all_reduce_sum(double* buf, int64_t count, Timeout timeout) override {
    reduce(Op::AllReduceF64, buf, count, timeout);
  }

  void all_gather(const float* in, float* out, int64_t count, Timeout timeout) override {
    std::vector<float> result(static_cast<size_t>(count * g_->size));
    collective({Op::AllGather, count, 0, in}, timeout, [&](const std::vector<Posted>& p) {
      for (int r = 0; r < g_->size; ++r)
        std::memcpy(&result[static_cast<size_t>(r * count)], p[static_cast<size_t>(r)].in,
                    static_cast<size_t>(count) * sizeof(float));
    });
    std::copy(result.begin(), result.end(), out);
  }

  void all_gather_bytes(const void* in, void* out, int64_t bytes, Timeout timeout) override {
    std::vector<unsigned char> result(static_cast<size_t>(bytes * g_->size));
    collective({Op::AllGatherBytes, bytes, 0, in}, timeout, [&](const std::vector<Posted>& p) {
      for (int r = 0; r < g_->size; ++r)
        std::memcpy(&result[static_cast<size_t>(r * bytes)], p[static_cast<size_t>(r)].in, static_cast<size_t>(bytes));
    });
    std::memcpy(out, result.data(), result.size());
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->failure.empty()) g_->failure = "aborted by rank " + std::to_string(rank_) + ": " + why;
    g_->cv.notify_all();
  }
  bool failed() const override {
    std::lock_guard<std::mutex> lock(g_->mu);
    return !g_->failure.empty();
  }

  void broadcast(void* buf, int64_t bytes, int root, Timeout timeout) override {
    if (root < 0 || root >= g_->size)
      throw std::invalid_argument("broadcast: root " + std::to_string(root) + " outside a group of " +
                                  std::to_string(g_->size));
    std::vector<unsigned char> result(static_cast<size_t>(bytes));
    collective({Op::Broadcast, bytes, root, buf}, timeout, [&](const std::vector<Posted>& p) {
      std::memcpy(result.data(), p[static_cast<size_t>(root)].in, static_cast<size_t>(bytes));
    });
    if (rank_ != root) std::memcpy(buf, result.data(), static_cast<size_t>(bytes));
  }

  void barrier(Timeout timeout) override {
    collective({Op::Barrier, 0, 0, nullptr}, timeout, [](const std::vector<Posted>&) {});
  }

 private:
  template <typename T>
  void reduce(Op op, T* buf, int64_t count, Timeout timeout) {
    std::vector<T> sum(static_cast<size_t>(count));
    collective({op, count, 0, buf}, timeout, [&](const std::vector<Posted>& p) {
      const T* first = static_cast<const T*>(p[0].in);
      std::copy(first, first + count, sum.begin());
      for (int r = 1; r < g_->size; ++r) {
        const T* x = static_cast<const T*>(p[static_cast<size_t>(r)].in);
        for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(i)] += x[i];
      }
    });
    std::copy(sum.begin(), sum.end(), buf);
  }

  // Runs one round: post, wait for all, read (into the caller's private result), wait
  // for all to have read. The caller writes its own buffer after this returns.
  template <typename Read>
  void collective(Posted mine, Timeout timeout, Read read) {
    Group& g = *g_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock<std::mutex> lock(g.mu);
    g.check(lock);
    const std::string what = std::string(op_name(mine.op)) + " on rank " + std::to_string(rank_) + " of " +
                             std::to_string(g.size);
    // A previous round may still be being read by others: wait until it is over.
    if (!g.cv.wait_until(lock, deadline, [&] { return !g.reading || !g.failure.empty(); }))
      g.fail(lock, what + ": timed out waiting for the previous collective to finish");
    g.check(lock);
    const uint64_t my_round = g.round;
    g.posted[static_cast<size_t>(rank_)] = mine;
    g.arrived_in[static_cast<size_t>(rank_)] = true;
    if (++g.arrived == g.size) {
      for (int r = 0; r < g.size; ++r) {
        const Posted& p = g.posted[static_cast<size_t>(r)];
        if (p.op != mine.op || p.count != mine.count || p.root != mine.root)
          g.fail(lock, what + ": rank " + std::to_string(r) + " called " + op_name(p.op) + " with count " +
                           std::to_string(p.count) + " and root " + std::to_string(p.root) + " (this rank: count " +
                           std::to_string(mine.count) + ", root " + std::to_string(mine.root) +
                           "): the ranks issued different collectives");
      }
      g.reading = true;
      g.cv.notify_all();
    } else if (!g.cv.wait_until(lock, deadline, [&] { return g.reading || !g.failure.empty(); })) {
      g.fail(lock, what + ": timed out after " + std::to_string(timeout.count()) + " ms; ranks " + g.missing() +
                       " never arrived");
    }
    g.check(lock);
    // Everyone has posted and nobody writes a posted buffer before the round is over.
    lock.unlock();
    read(g.posted);
    lock.lock();
    if (++g.departed == g.size) {
      g.arrived = g.departed = 0;
      std::fill(g.arrived_in.begin(), g.arrived_in.end(), false);
      g.reading = false;
      ++g.round;
      g.cv.notify_all();
    } else if (!g.cv.wait_until(lock, deadline, [&] { return g.round != my_round || !g.failure.empty(); })) {
      g.fail(lock, what + ": timed out waiting for the other ranks to finish reading");
    }
    g.check(lock);
  }

  std::shared_ptr<Group> g_;
  const int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_inprocess_group(int size) {
  if (size < 1) throw std::invalid_argument("make_inprocess_group: size " + std::to_string(size) + " < 1");
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InprocessCommunicator>(group, r));
  return out;
}

}  // namespace bs::kernels
