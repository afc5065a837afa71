#include "kernels/cuda/scatter_kv.cuh"

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One block-stride loop over the block's rows, each row's `Unit`s (16, 4 or 2 bytes:
// the widest that divides a row) copied to its place in K and in V.
template <typename Unit>
__global__ void scatter_rows(DevicePagedKv kv, int64_t first, int64_t m, const Unit* __restrict__ bk,
                             const Unit* __restrict__ bv, int64_t units_per_row, int64_t elem_bytes) {
  const int64_t total = kv.kv_heads * m * units_per_row;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / units_per_row, u = e % units_per_row;
    const int64_t h = row / m, j = first + row % m;
    // row_offset counts elements; a row starts at a multiple of head_dim elements, so
    // its byte offset is a multiple of the row's bytes and of Unit.
    const int64_t at = kv.row_offset(h, j) * elem_bytes / static_cast<int64_t>(sizeof(Unit)) + u;
    static_cast<Unit*>(kv.k)[at] = bk[e];
    static_cast<Unit*>(kv.v)[at] = bv[e];
  }
}

template <typename Unit>
void launch(const DevicePagedKv& kv, int64_t first, int64_t m, const void* bk, const void* bv, int64_t row_bytes,
            int64_t elem_bytes, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int64_t total = kv.kv_heads * m * units;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  scatter_rows<Unit><<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(
      kv, first, m, static_cast<const Unit*>(bk), static_cast<const Unit*>(bv), units, elem_bytes);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void scatter_kv_block(const DevicePagedKv& kv, int64_t first, int64_t m, const void* block_k, const void* block_v,
                      cudaStream_t stream) {
  if (m <= 0 || kv.kv_heads <= 0) return;
  const int64_t elem_bytes = kv.dtype == TensorType::F32 ? 4 : 2;
  const int64_t row_bytes = kv.head_dim * elem_bytes;
  // The pools and the staging start 256-byte aligned, and every row starts at a multiple
  // of row_bytes: a unit that divides row_bytes is aligned everywhere.
  if (row_bytes % 16 == 0)
    launch<uint4>(kv, first, m, block_k, block_v, row_bytes, elem_bytes, stream);
  else if (row_bytes % 4 == 0)
    launch<uint32_t>(kv, first, m, block_k, block_v, row_bytes, elem_bytes, stream);
  else
    launch<uint16_t>(kv, first, m, block_k, block_v, row_bytes, elem_bytes, stream);
}

}  // namespace bs::kernels::cuda
