#include "kernels/cuda/cuda_resources.h"

#include <cublas_v2.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"

namespace bs::kernels::cuda {
namespace {

std::string where(const char* call, const char* file, int line) {
  int device = -1;
  const std::string dev = cudaGetDevice(&device) == cudaSuccess ? "device " + std::to_string(device) : "no device";
  return std::string(call) + " on " + dev + " (" + file + ":" + std::to_string(line) + ")";
}

}  // namespace

void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line) {
  throw std::runtime_error("cuda: " + where(call, file, line) + ": " + cudaGetErrorName(error) + ": " +
                           cudaGetErrorString(error));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw std::runtime_error("cublas: " + where(call, file, line) + ": " + cublasGetStatusName(status) + ": " +
                           cublasGetStatusString(status));
}

DeviceAllocation::DeviceAllocation(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) BS_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceAllocation::~DeviceAllocation() {
  if (ptr_) cudaFree(ptr_);
}

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

CudaStream::CudaStream() { BS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
CudaStream::~CudaStream() {
  if (s_) cudaStreamDestroy(s_);
}
void CudaStream::synchronize() const { BS_CUDA_CHECK(cudaStreamSynchronize(s_)); }

CudaEvent::CudaEvent(bool timing) {
  BS_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() {
  if (e_) cudaEventDestroy(e_);
}
void CudaEvent::record(cudaStream_t stream) const { BS_CUDA_CHECK(cudaEventRecord(e_, stream)); }
void CudaEvent::wait_on(cudaStream_t stream) const { BS_CUDA_CHECK(cudaStreamWaitEvent(stream, e_, 0)); }
void CudaEvent::synchronize() const { BS_CUDA_CHECK(cudaEventSynchronize(e_)); }

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error for later calls
    return 0;
  }
  return n;
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  BS_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + mem + ")";
}

bool is_page_locked(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

}  // namespace bs::kernels::cuda
