// RAII owners of the CUDA objects the backend uses: device memory, streams, events.
// Each is created on the device current at construction, released in its destructor
// (errors there are ignored: a destructor must not throw, and the context may already
// be gone at exit), movable and not copyable. Every call is checked (cuda_check.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

namespace bs::kernels::cuda {

// Bytes of device memory from cudaMalloc.
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  explicit DeviceAllocation(size_t bytes);
  ~DeviceAllocation();
  DeviceAllocation(DeviceAllocation&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceAllocation& operator=(DeviceAllocation&& o) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream (it does not synchronise with the legacy default stream).
class CudaStream {
 public:
  CudaStream();
  ~CudaStream();
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&&) = delete;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// An event without timing (cheaper; ordering only), or with timing when asked.
class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false);
  ~CudaEvent();
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&&) = delete;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream) const;
  // Makes `stream` wait for the work recorded before this event.
  void wait_on(cudaStream_t stream) const;
  void synchronize() const;

 private:
  cudaEvent_t e_ = nullptr;
};

// Whether host memory at p is page-locked (registered with cudaHostRegister or
// allocated pinned): a DMA can read it in place. False for pageable memory and on any
// error (cleared).
bool is_page_locked(const void* p);

}  // namespace bs::kernels::cuda
