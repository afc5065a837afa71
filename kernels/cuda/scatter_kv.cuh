// A block of stored K/V rows placed into a paged cache on the device: the loaders' path
// for a stored chunk's layer. The block [kv_heads, m, head_dim] (already in the cache's
// dtype) arrives in one DMA into device staging; this kernel moves each row to the page
// the table says. Why: copying page run by page run from the host took one DMA per
// (chunk, layer, head, page) — ~26k small copies for 6 chunks of 512 tokens of an 8B
// model, each a host memcpy into pinned staging plus an API call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

// Rows [first, first + m) of every KV head of kv.k and kv.v from block_k / block_v,
// bytes unchanged. The caller checked the rows are inside [0, kv.capacity).
void scatter_kv_block(const DevicePagedKv& kv, int64_t first, int64_t m,
                      const void* block_k,  // device [kv.kv_heads, m, kv.head_dim] of kv.dtype
                      const void* block_v,  // device, the same shape
                      cudaStream_t stream);

}  // namespace bs::kernels::cuda
