#include "kernels/cuda/device_waits.h"

#include <cstdio>
#include <utility>

#include "kernels/bounded_wait.h"
#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {

DeviceWaits::DeviceWaits(int device, std::string name, std::chrono::nanoseconds limit)
    : device_(device), name_(std::move(name)), limit_(limit) {}

void DeviceWaits::throw_if_lost() const {
  if (!lost_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  throw DeviceLost(lost_why_);
}

template <typename Query>
void DeviceWaits::wait(Query&& query, const char* what) {
  throw_if_lost();
  // cudaErrorNotReady is "still running"; any other error is the device's and thrown
  // (cuda_check.h names the call and the device).
  const auto done = [&] {
    const cudaError_t e = query();
    if (e == cudaErrorNotReady) return false;
    BS_CUDA_CHECK(e);
    return true;
  };
  if (wait_bounded(done, limit_)) return;
  char limit_s[32];
  std::snprintf(limit_s, sizeof limit_s, "%g", std::chrono::duration<double>(limit_).count());
  std::string why = "cuda: device " + std::to_string(device_) + " (" + name_ + "): " + what + " did not finish within " +
                    limit_s +
                    " s (device.wait_timeout); the device is treated as lost: this and every later request on it "
                    "fails until the server is restarted";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_.load(std::memory_order_relaxed)) lost_why_ = why;
    lost_.store(true, std::memory_order_release);
  }
  std::fprintf(stderr, "%s\n", why.c_str());
  throw DeviceLost(why);
}

void DeviceWaits::for_stream(cudaStream_t stream, const char* what) {
  wait([stream] { return cudaStreamQuery(stream); }, what);
}

void DeviceWaits::for_event(cudaEvent_t event, const char* what) {
  wait([event] { return cudaEventQuery(event); }, what);
}

}  // namespace bs::kernels::cuda
