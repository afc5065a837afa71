// Products with the model's matrices on the device: weights dequantized once to bf16
// at load (from any stored type, by the device decoders of kernels/op_math.h), then
// y = x W^T through cuBLAS in bf16 with fp32 accumulation (activations rounded to bf16
// per call). Decode-size products (up to kPaddedRows rows) go through linear_padded
// below (cuBLAS at a fixed shape: rows exact whatever the batch), or our own GEMV
// (gemv_bf16.cuh; the backend's choice, BLENDSERVE_CUDA_DECODE_GEMM).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_resources.h"
#include "kernels/tensor_types.h"

namespace bs::kernels::cuda {

// A cuBLAS handle bound to one stream (RAII; every call checked), with a 32 MiB
// workspace of its own (cublasSetWorkspace: what NVIDIA recommends on Hopper; without
// one cuBLAS leaves out the algorithms that need it, and allocates inside calls, which
// a CUDA graph capture cannot hold).
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }
  // Binds the handle to `stream` for the calls after (the caller serialises them).
  void use_stream(cudaStream_t stream) const;

 private:
  cublasHandle_t h_ = nullptr;
  DeviceAllocation workspace_;
  mutable cudaStream_t stream_ = nullptr;
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

// Rows a decode-size product is padded to by linear_padded: the most a batched decode
// step has (gemv_bf16.cuh's kGemvMaxRows).
inline constexpr int64_t kPaddedRows = 64;

// Scratch of linear_padded, grown as needed and kept by the caller.
struct PaddedScratch {
  DeviceAllocation x;  // [kPaddedRows, in_features] bf16, rows past n zero
  DeviceAllocation y;  // [kPaddedRows, out_features] fp32
};

// A decode-size product (1 <= n <= kPaddedRows rows) through cuBLAS on the tensor cores,
// padded to kPaddedRows rows with zeros: cuBLAS picks its algorithm (and with it the
// order each output's sum is taken in) by the shape, and the shape is the same whatever
// n is, so row t's result does not depend on how many rows came with it — the contract
// of Backend::linear_exact_rows, as gemv_bf16 keeps it by its own fixed order. Reads
// the weights once for up to 64 rows at the tensor cores' rate instead of n fp32 FMAs
// per weight. Throws std::invalid_argument for n outside [1, kPaddedRows].
void linear_padded(const CublasHandle& cublas, const Bf16Weights& w,
                   const float* x,        // device [n, in_features]
                   float* y,              // device [n, out_features]
                   int64_t n,
                   const float* bias,     // device [out_features] or nullptr
                   PaddedScratch& scratch, cudaStream_t stream);

// y[t, o] = sum_i W[o, i] x[t, i] (+ bias[o]); x rounded to bf16 into `scratch` first
// (grown as needed), fp32 accumulation and output.
void linear(const CublasHandle& cublas, const Bf16Weights& w,
            const float* x,            // device [n, in_features]
            float* y,                  // device [n, out_features]
            int64_t n,
            const float* bias,         // device [out_features] or nullptr
            DeviceAllocation& scratch, cudaStream_t stream);

}  // namespace bs::kernels::cuda
