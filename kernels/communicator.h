// Collectives between the ranks of a tensor-parallel group (issue 20): each rank holds
// a shard of every layer, and the partial results of the row-split projections are
// summed across ranks after each layer's attention output and MLP down projection.
//
// Implementations: in-process for CPU ranks (one thread per rank, shared memory:
// make_inprocess_group) and NCCL for GPU ranks (kernels/cuda/nccl_communicator.*); the
// runtime picks one by device.communicator (kernels/communicator_choice.h). Buffers of the
// all-reduces and gathers are the ranks' backend memory (host memory on CPU ranks);
// broadcast takes host memory (the leader's decisions are host values). Every rank
// must issue the same collectives in the same order (the leader decides each step and
// broadcasts it, so followers never choose an order of their own); a mismatch (another
// op or another count) is detected and fails every rank, never a hang or a mixed
// result. Every call has a timeout: a rank that does not arrive fails the others with
// an error naming the op and the missing ranks, and the group stays failed (as
// ncclCommAbort), so no later collective can pair with a stale one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace bs::kernels {

// A failed collective: a timeout, a mismatch between ranks, or a group failed before.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  using Timeout = std::chrono::milliseconds;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // buf[i] = the sum over ranks 0, 1, ..., size-1 of their buf[i], added in that order
  // on every rank, so every rank gets bit-identical results.
  virtual void all_reduce_sum(float* buf,  // [count] on every rank
                              int64_t count, Timeout timeout) = 0;
  virtual void all_reduce_sum(double* buf,  // [count] on every rank
                              int64_t count, Timeout timeout) = 0;
  // out[r * count + i] = rank r's in[i].
  virtual void all_gather(const float* in,  // [count]
                          float* out,       // [size * count]
                          int64_t count, Timeout timeout) = 0;
  // out[r * bytes ... (r + 1) * bytes) = rank r's in: raw bytes (a rank's shard of a
  // chunk's half-precision KV heads, assembled for the store).
  virtual void all_gather_bytes(const void* in,  // [bytes]
                                void* out,       // [size * bytes]
                                int64_t bytes, Timeout timeout) = 0;
  // Every rank's buf = root's buf (bytes: the leader's step decisions travel this way).
  virtual void broadcast(void* buf,  // [bytes]
                         int64_t bytes, int root, Timeout timeout) = 0;
  // Returns once every rank has called it.
  virtual void barrier(Timeout timeout) = 0;

  // Fails the group now (ncclCommAbort): every rank's pending and later collectives
  // throw CommError carrying `why`. A rank whose own work failed calls it so the
  // others stop at once instead of waiting out their timeouts. Idempotent; the first
  // reason wins.
  virtual void abort(const std::string& why) = 0;
  // Whether the group failed (a timeout, a mismatch, an abort): it must be rebuilt.
  virtual bool failed() const = 0;
};

// `size` communicators of one in-process group, rank r at index r; each is used by one
// thread (its rank's). Throws std::invalid_argument for size < 1.
std::vector<std::unique_ptr<Communicator>> make_inprocess_group(int size);

}  // namespace bs::kernels
