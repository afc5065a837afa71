// The Communicator (kernels/communicator.h) of GPU ranks, over NCCL (2.28, the CUDA
// toolkit's). One communicator per rank, each on its own GPU; the group is joined by
// an NCCL unique id (make_nccl_id). Every rank is a thread of one process:
// make_nccl_group (what make_group of kernels/communicator_choice.h calls for `nccl`)
// makes the id and hands it to each rank's join as a value. NcclId is plain bytes so
// that ranks of other processes could get it in a message; none does yet. No CAF here.
//
// Buffers: all_reduce_sum, all_gather and all_gather_bytes take device memory on this
// rank's GPU (the backend's buffers); broadcast takes host memory (the leader's step
// decisions), staged through the device. NCCL adds the ranks' values in its own
// order (a ring, not rank order), but every rank gets the same bits: each element's
// sum is computed once and then copied to all.
//
// Timeouts and failure: the communicator is created non-blocking, every collective is
// polled (ncclCommGetAsyncError, cudaStreamQuery) until it completes, a peer failed
// the group or the timeout passes; then ncclCommAbort, and this and every later call
// throw CommError. Ranks in one process share a GroupFailure, so a rank that aborts
// stops the others' polls at once (NCCL itself tells no peer); across processes each
// rank finds out at its own timeout. A failed group is rebuilt with a new id.
//
// NCCL 2.28 refuses two ranks on one GPU (2.30 added NCCL_MULTI_RANK_GPU_ENABLE), so a
// one-GPU machine can run groups of size 1 only.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/communicator.h"

namespace bs::kernels::cuda {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), copyable into any message.
using NcclId = std::array<char, 128>;

// A new group's id; rank 0 calls it (it opens NCCL's bootstrap listener).
NcclId make_nccl_id();

// What the ranks of one process share: the first failure, seen by every rank's poll.
struct GroupFailure {
  std::mutex mu;
  std::string why;  // empty while the group is whole
  std::atomic<bool> failed{false};
};

// Rank `rank` of `size`, on CUDA device `device`. Blocks until every rank joined or
// `timeout` passed (CommError). group: shared by the ranks of this process (may be null).
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                                                     Communicator::Timeout timeout,
                                                     std::shared_ptr<GroupFailure> group = nullptr);

// A whole group in this process: rank r on CUDA device devices[r]. Rank 0's id is
// made here and handed to each rank's join, which runs on a thread of its own (a join
// blocks until every rank joined). The ranks share one GroupFailure. Throws the first
// rank's error when the group could not form within `timeout`.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices,
                                                           Communicator::Timeout timeout);

// The NCCL version linked (e.g. 22809 for 2.28.9), for diagnostics.
int nccl_version();

}  // namespace bs::kernels::cuda
