#include "model/tp_group.h"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace bs {

// One rank: its backend, shard and Transformer, and the thread its jobs run on. The
// thread and run() hand the job over under `mu`, so a rebuilt communicator (replaced
// between runs) is seen by the next job.
struct TpGroup::Rank {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Transformer> tf;

  std::mutex mu;
  std::condition_variable cv;
  const std::function<void(int)>* job = nullptr;  // set by run(), cleared when done
  std::exception_ptr error;
  bool stopping = false;
  std::thread thread;
};

TpGroup::TpGroup(const std::string& gguf_path, int size, const BackendFactory& make_backend,
                 kernels::Precision precision, kernels::TensorType kv_dtype, int threads_per_rank,
                 std::chrono::milliseconds collective_timeout) {
  if (size < 1) throw std::invalid_argument("TpGroup: size " + std::to_string(size) + " < 1");
  threads_per_rank_ = threads_per_rank > 0 ? threads_per_rank : std::max(1, omp_get_max_threads() / size);
  comms_ = kernels::make_inprocess_group(size);
  for (int r = 0; r < size; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->backend = make_backend();
    rank->model = std::make_unique<LlamaModel>(gguf_path, *rank->backend, precision, kv_dtype, TpShard{r, size});
    rank->tf = std::make_unique<Transformer>(*rank->model, comms_[static_cast<size_t>(r)].get(), collective_timeout);
    ranks_.push_back(std::move(rank));
  }
  for (int r = 0; r < size; ++r) ranks_[static_cast<size_t>(r)]->thread = std::thread([this, r] { loop(r); });
}

TpGroup::~TpGroup() {
  for (auto& rank : ranks_) {
    {
      std::lock_guard<std::mutex> lock(rank->mu);
      rank->stopping = true;
    }
    rank->cv.notify_all();
  }
  for (auto& rank : ranks_)
    if (rank->thread.joinable()) rank->thread.join();
}

void TpGroup::loop(int r) {
  Rank& rank = *ranks_[static_cast<size_t>(r)];
  omp_set_num_threads(threads_per_rank_);  // per thread: sizes this rank's parallel regions
  std::unique_lock<std::mutex> lock(rank.mu);
  for (;;) {
    rank.cv.wait(lock, [&] { return rank.job != nullptr || rank.stopping; });
    if (rank.stopping) return;
    const auto* job = rank.job;
    kernels::Communicator& comm = *comms_[static_cast<size_t>(r)];
    lock.unlock();
    std::exception_ptr err;
    try {
      (*job)(r);
    } catch (const std::exception& e) {
      err = std::current_exception();
      // The others stop at their current or next collective instead of timing out.
      comm.abort("rank " + std::to_string(r) + " failed: " + e.what());
    } catch (...) {
      err = std::current_exception();
      comm.abort("rank " + std::to_string(r) + " failed");
    }
    lock.lock();
    rank.error = err;
    rank.job = nullptr;
    rank.cv.notify_all();
  }
}

const LlamaModel& TpGroup::model(int rank) const { return *ranks_.at(static_cast<size_t>(rank))->model; }
const Transformer& TpGroup::transformer(int rank) const { return *ranks_.at(static_cast<size_t>(rank))->tf; }
kernels::Backend& TpGroup::backend(int rank) const { return *ranks_.at(static_cast<size_t>(rank))->backend; }

void TpGroup::run(const std::function<void(int rank)>& job) {
  for (auto& rank : ranks_) {
    std::lock_guard<std::mutex> lock(rank->mu);
    rank->error = nullptr;
    rank->job = &job;
  }
  for (auto& rank : ranks_) rank->cv.notify_all();
  std::exception_ptr own, comm_error;
  for (auto& rank : ranks_) {
    std::unique_lock<std::mutex> lock(rank->mu);
    rank->cv.wait(lock, [&] { return rank->job == nullptr; });
    if (!rank->error) continue;
    try {
      std::rethrow_exception(rank->error);
    } catch (const kernels::CommError&) {
      if (!comm_error) comm_error = rank->error;
    } catch (...) {
      if (!own) own = rank->error;
    }
  }
  if (!own && !comm_error) return;
  rebuild_communicators();
  std::rethrow_exception(own ? own : comm_error);
}

void TpGroup::rebuild_communicators() {
  comms_ = kernels::make_inprocess_group(size());
  for (int r = 0; r < size(); ++r) ranks_[static_cast<size_t>(r)]->tf->set_communicator(comms_[static_cast<size_t>(r)].get());
  ++rebuilds_;
}

}  // namespace bs
