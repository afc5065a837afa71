// Every CUDA runtime and cuBLAS call is checked: a failure throws std::runtime_error
// naming the call, the device and where it was made, so an error on a GPU machine is
// diagnosable from its message alone (TensorRT-LLM's habit). Host code only.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace bs::kernels::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace bs::kernels::cuda

#define BS_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    const cudaError_t bs_cuda_error_ = (call);                                               \
    if (bs_cuda_error_ != cudaSuccess)                                                       \
      ::bs::kernels::cuda::throw_cuda_error(bs_cuda_error_, #call, __FILE__, __LINE__);      \
  } while (0)

#define BS_CUBLAS_CHECK(call)                                                                \
  do {                                                                                       \
    const cublasStatus_t bs_cublas_status_ = (call);                                         \
    if (bs_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::bs::kernels::cuda::throw_cublas_error(bs_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
