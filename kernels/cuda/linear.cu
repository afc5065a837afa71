#include "kernels/cuda/linear.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_grid.cuh"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <TensorType T>
__global__ void dequant_to_bf16(const uint8_t* __restrict__ stored, __nv_bfloat16* __restrict__ out,
                                int64_t rows, int64_t cols, int64_t row_bytes) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < rows * cols;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    const uint8_t* row = stored + r * row_bytes;
    float v;
    if constexpr (T == TensorType::F32) v = reinterpret_cast<const float*>(row)[c];
    else if constexpr (T == TensorType::F16) v = op_math::half_bits_to_float(op_math::load_u16_le(row + 2 * c));
    else if constexpr (T == TensorType::BF16) v = op_math::bf16_bits_to_float(op_math::load_u16_le(row + 2 * c));
    else if constexpr (T == TensorType::Q8_0) v = op_math::q8_0_element(row + (c / 32) * 34, static_cast<int>(c % 32));
    else if constexpr (T == TensorType::Q4_0) v = op_math::q4_0_element(row + (c / 32) * 18, static_cast<int>(c % 32));
    else v = op_math::q4_1_element(row + (c / 32) * 20, static_cast<int>(c % 32));
    out[e] = __float2bfloat16_rn(v);
  }
}

__global__ void to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ out, int64_t count) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[e] = __float2bfloat16_rn(x[e]);
}

__global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * out;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[e] += bias[e % out];
}

template <TensorType T>
void launch_dequant(const void* stored, void* out, int64_t rows, int64_t cols, int64_t row_bytes,
                    cudaStream_t stream) {
  dequant_to_bf16<T><<<grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(stored), static_cast<__nv_bfloat16*>(out), rows, cols, row_bytes);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

CublasHandle::CublasHandle(cudaStream_t stream) : workspace_(size_t{32} << 20), stream_(stream) {
  BS_CUBLAS_CHECK(cublasCreate(&h_));
  BS_CUBLAS_CHECK(cublasSetStream(h_, stream));
  BS_CUBLAS_CHECK(cublasSetWorkspace(h_, workspace_.get(), workspace_.bytes()));
}

void CublasHandle::use_stream(cudaStream_t stream) const {
  if (stream == stream_) return;
  BS_CUBLAS_CHECK(cublasSetStream(h_, stream));
  stream_ = stream;
}

CublasHandle::~CublasHandle() {
  if (h_) cublasDestroy(h_);
}

Bf16Weights weights_to_bf16(TensorType type, const void* stored, int64_t out_features, int64_t in_features,
                            cudaStream_t stream) {
  const bool blocks = type == TensorType::Q8_0 || type == TensorType::Q4_0 || type == TensorType::Q4_1;
  if (blocks && in_features % 32 != 0)
    throw std::invalid_argument("cuda weights_to_bf16: in_features " + std::to_string(in_features) +
                                " is not a multiple of 32");
  Bf16Weights w{DeviceAllocation(static_cast<size_t>(out_features * in_features) * 2), out_features, in_features};
  const int64_t rows = out_features, cols = in_features;
  switch (type) {
    case TensorType::F32: launch_dequant<TensorType::F32>(stored, w.data.get(), rows, cols, cols * 4, stream); break;
    case TensorType::F16: launch_dequant<TensorType::F16>(stored, w.data.get(), rows, cols, cols * 2, stream); break;
    case TensorType::BF16: launch_dequant<TensorType::BF16>(stored, w.data.get(), rows, cols, cols * 2, stream); break;
    case TensorType::Q8_0:
      launch_dequant<TensorType::Q8_0>(stored, w.data.get(), rows, cols, cols / 32 * 34, stream);
      break;
    case TensorType::Q4_0:
      launch_dequant<TensorType::Q4_0>(stored, w.data.get(), rows, cols, cols / 32 * 18, stream);
      break;
    case TensorType::Q4_1:
      launch_dequant<TensorType::Q4_1>(stored, w.data.get(), rows, cols, cols / 32 * 20, stream);
      break;
    default:
      throw std::invalid_argument("cuda weights_to_bf16: no device decoder for tensor type " +
                                  std::to_string(static_cast<int>(type)));
  }
  return w;
}

const void* activations_to_bf16(const float* x, int64_t count, DeviceAllocation& scratch, cudaStream_t stream) {
  const size_t need = static_cast<size_t>(count) * 2;
  if (scratch.bytes() < need) scratch = DeviceAllocation(need);
  if (count > 0) {
    to_bf16<<<grid_for(count, kThreads), kThreads, 0, stream>>>(x, scratch.as<__nv_bfloat16>(), count);
    BS_CUDA_CHECK(cudaGetLastError());
  }
  return scratch.get();
}

void linear_padded(const CublasHandle& cublas, const Bf16Weights& w, const float* x, float* y, int64_t n,
                   const float* bias, PaddedScratch& scratch, cudaStream_t stream) {
  if (n < 1 || n > kPaddedRows)
    throw std::invalid_argument("cuda linear_padded: " + std::to_string(n) + " rows (1.." +
                                std::to_string(kPaddedRows) + ")");
  const size_t x_bytes = static_cast<size_t>(kPaddedRows * w.in_features) * 2;
  const size_t y_bytes = static_cast<size_t>(kPaddedRows * w.out_features) * 4;
  if (scratch.x.bytes() < x_bytes) {
    scratch.x = DeviceAllocation(x_bytes);
    BS_CUDA_CHECK(cudaMemsetAsync(scratch.x.get(), 0, x_bytes, stream));  // padding rows: zero from now on
  }
  if (scratch.y.bytes() < y_bytes) scratch.y = DeviceAllocation(y_bytes);
  auto* xb = scratch.x.as<__nv_bfloat16>();
  const int64_t count = n * w.in_features;
  to_bf16<<<grid_for(count, kThreads), kThreads, 0, stream>>>(x, xb, count);
  BS_CUDA_CHECK(cudaGetLastError());
  // Rows past n: zero. Rows n..63 may hold an earlier call's values (a larger n, or
  // another product's wider rows), and a row's result does not depend on them anyway;
  // zeroing keeps the padding finite.
  const size_t tail = static_cast<size_t>((kPaddedRows - n) * w.in_features) * 2;
  if (tail > 0) BS_CUDA_CHECK(cudaMemsetAsync(xb + count, 0, tail, stream));
  cublas.use_stream(stream);
  const float alpha = 1.0f, beta = 0.0f;
  BS_CUBLAS_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.out_features),
                               static_cast<int>(kPaddedRows), static_cast<int>(w.in_features), &alpha, w.data.get(),
                               CUDA_R_16BF, static_cast<int>(w.in_features), xb, CUDA_R_16BF,
                               static_cast<int>(w.in_features), &beta, scratch.y.get(), CUDA_R_32F,
                               static_cast<int>(w.out_features), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  BS_CUDA_CHECK(cudaMemcpyAsync(y, scratch.y.get(), static_cast<size_t>(n * w.out_features) * 4,
                                cudaMemcpyDeviceToDevice, stream));
  if (bias) {
    add_bias<<<grid_for(n * w.out_features, kThreads), kThreads, 0, stream>>>(y, bias, n, w.out_features);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

void linear(const CublasHandle& cublas, const Bf16Weights& w, const float* x, float* y, int64_t n, const float* bias,
            DeviceAllocation& scratch, cudaStream_t stream) {
  if (n <= 0) return;
  cublas.use_stream(stream);
  activations_to_bf16(x, n * w.in_features, scratch, stream);
  // Row-major y [n, out] = x [n, in] W^T, i.e. column-major y^T [out, n] = W [out, in] (as
  // the column-major [in, out] W^T transposed) times x^T [in, n].
  const float alpha = 1.0f, beta = 0.0f;
  BS_CUBLAS_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.out_features),
                               static_cast<int>(n), static_cast<int>(w.in_features), &alpha, w.data.get(), CUDA_R_16BF,
                               static_cast<int>(w.in_features), scratch.get(), CUDA_R_16BF,
                               static_cast<int>(w.in_features), &beta, y, CUDA_R_32F,
                               static_cast<int>(w.out_features), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias) {
    add_bias<<<grid_for(n * w.out_features, kThreads), kThreads, 0, stream>>>(y, bias, n, w.out_features);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace bs::kernels::cuda
