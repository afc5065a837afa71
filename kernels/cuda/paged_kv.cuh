// A layer's paged K/V as the device kernels see it: kernels/kv_view.h's KvView with its
// page table in device memory (the backend uploads the host table with the call, as
// vLLM's block tables), and the element conversions of the KV dtypes. Device code reads
// and writes rows through row_offset exactly as the CPU kernels do.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/kv_view.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {

struct DevicePagedKv {
  void* k = nullptr;               // device: the pool's K of this layer
  void* v = nullptr;               // device: the pool's V of this layer
  TensorType dtype = TensorType::F32;
  const int32_t* pages = nullptr;  // device [page_count]
  int64_t capacity = 0;
  int page_shift = 0;
  int64_t page_stride = 0, head_stride = 0, kv_heads = 0, head_dim = 0;

  __host__ __device__ int64_t row_offset(int64_t h, int64_t j) const {
    return pages[j >> page_shift] * page_stride + h * head_stride + (j & ((int64_t{1} << page_shift) - 1)) * head_dim;
  }
};

// The view of `host` (its k/v already device memory) with the page table at
// device_pages (a device copy of host.pages[0, host.page_count)).
inline DevicePagedKv device_view(const KvView& host, const int32_t* device_pages) {
  DevicePagedKv d;
  d.k = host.k;
  d.v = host.v;
  d.dtype = host.dtype;
  d.pages = device_pages;
  d.capacity = host.capacity;
  d.page_shift = host.page_shift;
  d.page_stride = host.page_stride;
  d.head_stride = host.head_stride;
  d.kv_heads = host.kv_heads;
  d.head_dim = host.head_dim;
  return d;
}

// Element `at` of a K or V pool of `dtype`, as its exact fp32 value.
__device__ inline float load_kv(TensorType dtype, const void* base, int64_t at) {
  if (dtype == TensorType::F32) return static_cast<const float*>(base)[at];
  const uint16_t bits = static_cast<const uint16_t*>(base)[at];
  return dtype == TensorType::F16 ? op_math::half_bits_to_float(bits) : op_math::bf16_bits_to_float(bits);
}

// x rounded to nearest even into `dtype` at element `at` (finite values: as the CPU's
// fp32_to_fp16 / fp32_to_bf16; a NaN may get another payload).
__device__ inline void store_kv_element(TensorType dtype, void* base, int64_t at, float x) {
  if (dtype == TensorType::F32) static_cast<float*>(base)[at] = x;
  else if (dtype == TensorType::F16) static_cast<__half*>(base)[at] = __float2half_rn(x);
  else static_cast<__nv_bfloat16*>(base)[at] = __float2bfloat16_rn(x);
}

}  // namespace bs::kernels::cuda
