// The CUDA backend's host waits, each bounded by device.wait_timeout: a copy back, a
// step's sampled ids, a weight upload, a loader's staging buffer and its stream drain.
// The driver's blocking calls (cudaStreamSynchronize, cudaEventSynchronize, a copy into
// pageable memory) have no timeout, so a hung GPU would hold the calling thread
// forever; these poll cudaStreamQuery / cudaEventQuery (kernels/bounded_wait.h).
//
// A wait that runs out marks the device lost, and every later wait throws at once:
// the work behind it may still write into memory the host would otherwise hand to
// another request (KV pages, staging buffers), so nothing the device holds is trusted
// again. Requests then fail with the sentence below; restarting the server (or the
// worker) is the way back.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>

namespace bs::kernels::cuda {

// The device missed a wait's limit (now or earlier).
class DeviceLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DeviceWaits {
 public:
  // `device`: the CUDA index, `name`: how messages name it; `limit`: device.wait_timeout.
  DeviceWaits(int device, std::string name, std::chrono::nanoseconds limit);

  // Returns once the work issued on `stream` so far has finished / the work recorded
  // before `event` has. `what` says what was waited for ("a copy to the host").
  // Throws DeviceLost past the limit or once the device is lost; std::runtime_error for
  // a CUDA error the query reported (an illegal address in an earlier kernel, ...).
  void for_stream(cudaStream_t stream, const char* what);
  void for_event(cudaEvent_t event, const char* what);
  // Throws DeviceLost when an earlier wait ran out.
  void throw_if_lost() const;
  bool lost() const { return lost_.load(std::memory_order_acquire); }

  std::chrono::nanoseconds limit() const { return limit_; }

 private:
  template <typename Query>
  void wait(Query&& query, const char* what);

  const int device_;
  const std::string name_;
  const std::chrono::nanoseconds limit_;
  std::atomic<bool> lost_{false};
  mutable std::mutex mu_;
  std::string lost_why_;  // the first wait that ran out, said once lost_ is set
};

}  // namespace bs::kernels::cuda
