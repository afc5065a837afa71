// Products with the model's matrices on the device: weights dequantized once to bf16
// at load (from any stored type, by the device decoders of kernels/op_math.h), then
// y = x W^T through cuBLAS in bf16 with fp32 accumulation (activations rounded to bf16
// per call). Decode-size products (up to kGemvMaxRows rows) go through our own GEMV
// instead (gemv_bf16.cuh: rows exact whatever the batch).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_resources.h"
#include "kernels/tensor_types.h"

namespace bs::kernels::cuda {

// A cuBLAS handle bound to one stream (RAII; every call checked).
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// W [out_features, in_features] as bf16 on the device.
struct Bf16Weights {
  DeviceAllocation data;  // [out_features, in_features] bf16
  int64_t out_features = 0, in_features = 0;
};

// Dequantizes `stored` (device memory: out_features rows of `type`) to bf16, rounded to
// nearest even. Throws std::invalid_argument for a type without a device decoder or
// in_features not a multiple of its block size.
Bf16Weights weights_to_bf16(TensorType type, const void* stored, int64_t out_features, int64_t in_features,
                            cudaStream_t stream);

// x [count] rounded to bf16 (nearest even) into `scratch` (grown as needed): the
// activations every product multiplies, rounded once per call rather than once per
// output feature. Returns scratch's memory as [count] bf16 (`__nv_bfloat16` in .cu files).
const void* activations_to_bf16(const float* x,  // device [count]
                                int64_t count, DeviceAllocation& scratch, cudaStream_t stream);

// y[t, o] = sum_i W[o, i] x[t, i] (+ bias[o]); x rounded to bf16 into `scratch` first
// (grown as needed), fp32 accumulation and output.
void linear(const CublasHandle& cublas, const Bf16Weights& w,
            const float* x,            // device [n, in_features]
            float* y,                  // device [n, out_features]
            int64_t n,
            const float* bias,         // device [out_features] or nullptr
            DeviceAllocation& scratch, cudaStream_t stream);

}  // namespace bs::kernels::cuda
