// Tensor parallelism in the runtime: rank 0 leads, the other ranks follow.
//
// Rank 0 is the runtime's own model shard, Transformer, KV page pool, blend engine
// and compute thread (RuntimeContext), driven by the layer worker, which alone
// decides what runs: which prefill steps, which decode batch, a cancel, a decode
// step between two layers. Every other rank is a RankFollower: its own shard of the
// model on a backend of its own, its own Transformer (joined to the others by a
// communicator), KV page pool, blend engine and compute thread (device.threads / tp
// OpenMP threads each), and the requests it holds (their caches, their prefills'
// state), touched only by its compute thread. Its rank worker actor (rank_worker.cpp)
// takes RankJobs and runs them there.
//
// The order: when a job starts on rank 0's compute thread, dispatch() sends it to
// every follower's worker (one sender, so every mailbox keeps rank 0's order) and
// each follower's compute thread runs its jobs in that order. Inside a job, each
// choice rank 0 makes is broadcast first (announce) and the followers execute what
// they receive (await): the ranks always issue the same collectives in the same
// order, so none can wait on a collective another never starts.
//
// Failure: a rank whose job throws aborts the communicator, so the others fail at
// once rather than at their collectives' timeout; rank 0 fails the requests the
// job was for with that error. Before the next job that needs the communicator,
// dispatch() waits (bounded) until every follower has finished what it was sent,
// then rebuilds the communicators of every rank, of the kind the group was made of
// (in-process on CPU ranks, NCCL on GPU ranks: device.communicator). The next
// request succeeds.
//
// KV: each rank's caches hold its KV heads. A prefill's cache on a follower is
// opened by rank 0's worker at the follower's rank worker, from the follower's own
// pool, before the loaders are told; the loaders send the rank its heads of each
// layer as values and the rank worker writes them (RankTarget, actors/runtime/load_target.h).
// A prefill job is handed that target; the follower takes its cache over when the
// prefill finishes and frees it at the request's End. No follower reads rank 0's
// tables: what it needs comes in its jobs and decisions.
// Plain C++ (no CAF).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/runtime/compute_thread.h"
#include "actors/runtime/load_target.h"
#include "actors/runtime/rank_job.h"
#include "actors/runtime/trace.h"
#include "blend/blend_engine.h"
#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/transformer.h"

namespace bs {

class TpRanks;

class RankFollower {
 public:
  struct Parts {
    std::unique_ptr<kernels::Backend> backend;
    std::unique_ptr<LlamaModel> model;  // the rank's shard, on `backend`
    std::unique_ptr<Transformer> tf;    // joined to the group's communicator of this rank
    std::shared_ptr<KvPagePool> kv_pool;
    std::unique_ptr<BlendEngine> engine;
    std::unique_ptr<ComputeThread> compute;
  };
  RankFollower(int rank, Parts parts, TpRanks& group, const TraceBook& traces);
  ~RankFollower();  // stops its compute thread first (queued jobs are dropped)

  int rank() const { return rank_; }
  ComputeThread& compute() { return *parts_.compute; }
  KvPagePool& kv_pool() { return *parts_.kv_pool; }
  kernels::Backend& backend() { return *parts_.backend; }
  const LlamaModel& model() const { return *parts_.model; }
  Transformer& transformer() { return *parts_.tf; }
  // Requests holding a cache or a prefill on this rank (for tests and the actor table).
  int64_t requests() const { return requests_held_.load(); }

  // Runs one job; on its compute thread only. `target`: a prefill's load target on
  // this rank (the rank worker's; null for other jobs or when it has none). An error
  // aborts the communicator (rank 0 fails the job's requests) and is counted; it
  // never escapes.
  void execute(const RankJob& job, const RankTargetPtr& target = nullptr);

  // Tests: called before each job; may throw (a rank that fails).
  std::function<void(int rank, const RankJob& job)> fault;

 private:
  struct Request {
    RankTargetPtr target;  // while prefilling: the rank worker writes the loaded rows in it
    PrefillRun run;
    bool begun = false;
    KvCache cache;  // once prefilled: the request's cache on this rank
    bool decoding = false;
    double collective_s = 0;  // the prefill's waits in collectives
  };
  void prefill(const RankJob& job, const RankTargetPtr& target);
  // Throws for per-request state this rank lacks: a CommError (not counted as a rank
  // failure) when the group already failed — a job sent before the failure, for a
  // request rank 0 has dropped since — else a runtime_error.
  [[noreturn]] void missing(const std::string& what) const;
  void decode(const std::vector<uint64_t>& ids, const std::vector<int32_t>& tokens);
  void chunk(const RankJob& job);

  const int rank_;
  Parts parts_;
  TpRanks& group_;
  const TraceBook& traces_;
  std::unordered_map<uint64_t, Request> requests_;  // only the compute thread
  std::atomic<int64_t> requests_held_{0};
};

class TpRanks {
 public:
  using Send = std::function<void(int rank, RankJob job)>;
  using Comms = std::vector<std::unique_ptr<kernels::Communicator>>;
  // A new group of the same kind on the same devices (kernels/communicator_choice.h).
  using MakeComms = std::function<Comms()>;
  // comms: one per rank, comms[0] rank 0's (already given to `leader`); make: how a
  // failed group is replaced.
  TpRanks(Comms comms, MakeComms make, Transformer& leader, std::chrono::milliseconds timeout);
  ~TpRanks();
  TpRanks(const TpRanks&) = delete;
  TpRanks& operator=(const TpRanks&) = delete;

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Rank r's communicator now (it changes at a rebuild, while every follower is idle).
  kernels::Communicator& comm(int rank) const;
  void add_follower(std::unique_ptr<RankFollower> f);  // ranks 1.. in order, before any job
  RankFollower& follower(int rank) const;              // 1 <= rank < size
  // How a job reaches rank r's worker actor (set by the runtime before any job).
  void set_send(Send send);

  // Rank 0's compute thread, at the start of a job: rebuilds the communicators
  // first if the group failed (throws CommError if a follower did not finish its
  // jobs within twice the collective timeout), then sends the job to every follower.
  // An End needs no communicator: it is sent whatever the group's state.
  void dispatch(const RankJob& job);
  // Rank 0, inside a job: the decision, to every follower, before acting on it.
  void announce(const RankDecision& d);
  // A follower, inside a job: rank 0's next decision.
  RankDecision await(int rank);
  // Rank 0: a job failed here; the followers stop at once. Counted as a failure
  // unless the group had failed already (a follower's failure, counted there).
  void fail(const std::string& why);
  // A follower finished a job (the rebuild waits for every job sent).
  void job_done(int rank);
  // A rank worker died with jobs in its mailbox: they will never run.
  void forget_jobs(int rank);

  int64_t rebuilds() const { return rebuilds_.load(); }
  int64_t failures() const { return failures_.load(); }
  void count_failure() { failures_.fetch_add(1); }

 private:
  void rebuild();  // rank 0's compute thread

  const int size_;
  const std::chrono::milliseconds timeout_;
  Transformer& leader_;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  Comms comms_;  // by rank; mu_
  const MakeComms make_comms_;
  std::vector<std::unique_ptr<RankFollower>> followers_;       // [rank - 1]
  std::vector<int64_t> sent_, done_;                           // jobs per follower rank; mu_
  Send send_;
  std::atomic<int64_t> rebuilds_{0}, failures_{0};
};

}  // namespace bs
