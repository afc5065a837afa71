#include "kernels/cuda/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_resources.h"

namespace bs::kernels::cuda {
namespace {

static_assert(sizeof(ncclUniqueId) == std::tuple_size<NcclId>::value, "NcclId holds an ncclUniqueId");

using clock_type = std::chrono::steady_clock;

std::string nccl_error(ncclResult_t r, const char* call, ncclComm_t comm = nullptr) {
  std::string s = std::string(call) + ": " + ncclGetErrorString(r);
  if (comm)
    if (const char* last = ncclGetLastError(comm); last && *last) s += " (" + std::string(last) + ")";
  return s;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclId& id, int rank, int size, int device, Timeout timeout,
                   std::shared_ptr<GroupFailure> group)
      : rank_(rank), size_(size), device_(device), group_(group ? std::move(group) : std::make_shared<GroupFailure>()) {
    if (size < 1 || rank < 0 || rank >= size)
      throw std::invalid_argument("NCCL communicator: rank " + std::to_string(rank) + " of " + std::to_string(size));
    BS_CUDA_CHECK(cudaSetDevice(device_));
    stream_ = std::make_unique<CudaStream>();
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // calls return at once; completion is polled with a deadline
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) throw CommError(where() + nccl_error(r, "ncclCommInitRankConfig"));
    wait("ncclCommInitRankConfig", clock_type::now() + timeout, /*stream_too=*/false);
  }

  ~NcclCommunicator() override {
    if (!comm_) return;
    // A whole group's communicator is destroyed (ncclCommDestroy waits for pending
    // work); a failed one is aborted. Errors are ignored: a destructor must not throw.
    if (group_->failed.load()) ncclCommAbort(comm_);
    else ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* buf, int64_t count, Timeout timeout) override {
    run("ncclAllReduce", timeout, [&] { return ncclAllReduce(buf, buf, count_of(count), ncclFloat32, ncclSum, comm_, stream()); });
  }
  void all_reduce_sum(double* buf, int64_t count, Timeout timeout) override {
    run("ncclAllReduce", timeout, [&] { return ncclAllReduce(buf, buf, count_of(count), ncclFloat64, ncclSum, comm_, stream()); });
  }
  void all_gather(const float* in, float* out, int64_t count, Timeout timeout) override {
    run("ncclAllGather", timeout, [&] { return ncclAllGather(in, out, count_of(count), ncclFloat32, comm_, stream()); });
  }
  void all_gather_bytes(const void* in, void* out, int64_t bytes, Timeout timeout) override {
    run("ncclAllGather", timeout, [&] { return ncclAllGather(in, out, count_of(bytes), ncclUint8, comm_, stream()); });
  }
  void broadcast(void* buf, int64_t bytes, int root, Timeout timeout) override {
    if (root < 0 || root >= size_)
      throw std::invalid_argument("broadcast: root " + std::to_string(root) + " outside a group of " +
                                  std::to_string(size_));
    check_whole();
    BS_CUDA_CHECK(cudaSetDevice(device_));
    void* staged = scratch(static_cast<size_t>(bytes));
    if (rank_ == root) BS_CUDA_CHECK(cudaMemcpyAsync(staged, buf, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream()));
    run("ncclBroadcast", timeout,
        [&] { return ncclBroadcast(staged, staged, count_of(bytes), ncclUint8, root, comm_, stream()); });
    BS_CUDA_CHECK(cudaMemcpyAsync(buf, staged, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream()));
    BS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void barrier(Timeout timeout) override {
    check_whole();
    BS_CUDA_CHECK(cudaSetDevice(device_));
    auto* one = static_cast<float*>(scratch(sizeof(float)));
    BS_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), stream()));
    all_reduce_sum(one, 1, timeout);
  }

  // Any thread: marks the group failed. The NCCL communicator itself is aborted by its
  // own rank's thread, at once if it is polling a collective, else at its next call
  // (or its destruction): NCCL calls on one communicator stay on one thread.
  void abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      if (group_->why.empty()) group_->why = "aborted by rank " + std::to_string(rank_) + ": " + why;
    }
    group_->failed = true;
  }
  bool failed() const override { return group_->failed.load(); }

 private:
  static size_t count_of(int64_t n) {
    if (n < 0) throw std::invalid_argument("NCCL collective: negative count");
    return static_cast<size_t>(n);
  }
  cudaStream_t stream() const { return stream_->get(); }
  std::string where() const {
    return "NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " on GPU " +
           std::to_string(device_) + ": ";
  }
  void* scratch(size_t bytes) {
    if (scratch_.bytes() < bytes) scratch_ = DeviceAllocation(std::max<size_t>(bytes, 4096));
    return scratch_.get();
  }
  std::string group_why() {
    std::lock_guard<std::mutex> lock(group_->mu);
    return group_->why.empty() ? std::string("the group failed") : group_->why;
  }
  void check_whole() {
    if (group_->failed.load()) {
      abort_own();
      throw CommError(where() + group_why());
    }
  }
  // This rank's communicator aborted (once; its own thread): its pending work is dropped.
  void abort_own() {
    if (!comm_) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  // Fails the whole group with `why` and throws it.
  [[noreturn]] void fail(const std::string& why) {
    abort(why);
    abort_own();
    throw CommError(where() + group_why());
  }
  template <class Call>
  void run(const char* name, Timeout timeout, Call&& call) {
    check_whole();
    BS_CUDA_CHECK(cudaSetDevice(device_));
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) fail(nccl_error(r, name, comm_));
    wait(name, clock_type::now() + timeout, /*stream_too=*/true);
  }
  // Polls until the communicator is idle without error (and the stream's work is
  // done), a peer failed the group, or the deadline: then the group fails.
  void wait(const char* name, clock_type::time_point deadline, bool stream_too) {
    while (true) {
      if (group_->failed.load()) {
        abort_own();
        throw CommError(where() + group_why());
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) fail(nccl_error(r, "ncclCommGetAsyncError", comm_));
      if (state != ncclSuccess && state != ncclInProgress) fail(nccl_error(state, name, comm_));
      if (state == ncclSuccess) {
        if (!stream_too) return;
        const cudaError_t q = cudaStreamQuery(stream());
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) fail(std::string(name) + ": cudaStreamQuery: " + cudaGetErrorString(q));
      }
      if (clock_type::now() >= deadline) fail(std::string(name) + ": timed out (a rank did not take part)");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  const int rank_, size_, device_;
  std::shared_ptr<GroupFailure> group_;
  std::unique_ptr<CudaStream> stream_;
  DeviceAllocation scratch_;
  ncclComm_t comm_ = nullptr;  // null once aborted
};

}  // namespace

NcclId make_nccl_id() {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) throw CommError(nccl_error(r, "ncclGetUniqueId"));
  NcclId id;
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                                                     Communicator::Timeout timeout,
                                                     std::shared_ptr<GroupFailure> group) {
  return std::make_unique<NcclCommunicator>(id, rank, size, device, timeout, std::move(group));
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices,
                                                           Communicator::Timeout timeout) {
  const int size = static_cast<int>(devices.size());
  if (size < 1) throw std::invalid_argument("an NCCL group needs at least one rank");
  const NcclId id = make_nccl_id();
  auto failure = std::make_shared<GroupFailure>();
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(size));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  {
    std::vector<std::thread> joins;
    for (int r = 0; r < size; ++r)
      joins.emplace_back([&, r] {
        try {
          comms[static_cast<size_t>(r)] =
              make_nccl_communicator(id, r, size, devices[static_cast<size_t>(r)], timeout, failure);
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
          // The others stop waiting for this rank at once.
          std::lock_guard<std::mutex> lock(failure->mu);
          if (failure->why.empty()) failure->why = "rank " + std::to_string(r) + " could not join";
          failure->failed = true;
        }
      });
    for (auto& t : joins) t.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return comms;
}

int nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return v;
}

}  // namespace bs::kernels::cuda
