// The ranks of a tensor-parallel model on CPU cores in one process (model/
// tensor_parallel.h): one shard of the model per rank on a backend of its own, one
// thread per rank with its own OpenMP team (the cores split between the ranks), and
// an in-process communicator joining them. Tools, benchmarks and tests drive it with
// run(): the caller decides each step and hands the same job to every rank, so the
// ranks always issue the same collectives in the same order.
//
// Failure: a rank whose job throws aborts the group (Communicator::abort), so the
// others fail at once instead of waiting out their collectives' timeouts; the
// group's communicators are then rebuilt for the next run, and run() throws the
// failing rank's error.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "model/llama_model.h"
#include "model/transformer.h"

namespace bs {

class TpGroup {
 public:
  using BackendFactory = std::function<std::unique_ptr<kernels::Backend>()>;
  // Loads `size` shards of the model at `gguf_path`, each on a backend from
  // make_backend. threads_per_rank: the OpenMP team of each rank's thread (0: the
  // machine's threads / size, at least 1). std::invalid_argument when `size` does
  // not divide the model (naming the counts).
  TpGroup(const std::string& gguf_path, int size, const BackendFactory& make_backend, kernels::Precision precision,
          kernels::TensorType kv_dtype, int threads_per_rank = 0,
          std::chrono::milliseconds collective_timeout = Transformer::kDefaultCollectiveTimeout);
  ~TpGroup();
  TpGroup(const TpGroup&) = delete;
  TpGroup& operator=(const TpGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  int threads_per_rank() const { return threads_per_rank_; }
  const LlamaModel& model(int rank) const;
  const Transformer& transformer(int rank) const;
  kernels::Backend& backend(int rank) const;

  // Runs job(rank) on every rank's thread at once and returns when all returned. If
  // any threw: the group was aborted, is rebuilt, and the first rank's own error (not
  // a CommError the abort caused in the others, unless that is all there is) is
  // rethrown. The wait is bounded by the jobs: a rank blocked on a peer that failed or
  // never came fails its collective within the timeout (or at once, by the abort).
  void run(const std::function<void(int rank)>& job);
  // Times the communicators were rebuilt after a failed run.
  int64_t rebuilds() const { return rebuilds_; }

 private:
  struct Rank;
  void loop(int rank);  // rank's thread
  void rebuild_communicators();

  int threads_per_rank_ = 1;
  std::vector<std::unique_ptr<kernels::Communicator>> comms_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  int64_t rebuilds_ = 0;
};

}  // namespace bs
