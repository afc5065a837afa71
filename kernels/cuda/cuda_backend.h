// The CUDA backend: kernels/backend.h's interface over the device ops of kernels/cuda/
// (one op per .cu/.cuh pair) and cuBLAS, on one GPU.
//
// Why a backend and not a second engine: the model, the transformer, the blend and
// the runtime hold DeviceBuffers and call ops through Backend, so the GPU runs the
// same code the CPU does and tests compare the two op by op (tests/cuda_test_ops.cpp,
// tests/cuda_test_model.cpp).
//
// What it decides (the interface leaves room):
// - Memory is device memory (cudaMalloc): host_accessible() is false. An allocation
//   the GPU cannot give throws std::bad_alloc, as the interface asks.
// - Ops run in issue order on one compute stream of the backend and return before the
//   GPU finished; copy_to_host without a stream, sample_rows, synchronize() and
//   synchronize(event) are where the host waits — each wait bounded by
//   device.wait_timeout (cuda/device_waits.h: polled, never the driver's blocking
//   call; a copy back goes through pinned memory for it).
// - Products are bf16 x bf16 -> fp32 (weights dequantized to bf16 once, at prepare):
//   cuBLAS for prefill-size row counts; up to linear_exact_rows() (64) rows cuBLAS at a
//   fixed 64 rows, padded (linear.cuh's linear_padded; BLENDSERVE_CUDA_DECODE_GEMM=gemv:
//   our GEMV, gemv_bf16.cuh, instead), either way every row bit-identical whatever the
//   row count (a batched decode step equals one-token forwards). Precision::F32 is not supported:
//   choose_precision names bf16 as the alternative.
// - Attention: decode rows (attention_rows.cuh: flash-decoding, split by each row's
//   length) and prompts of under 64 rows (attention.cuh: a warp per query and head)
//   in fp32 over K/V widened from the cache dtype; from 64 rows the fused flash kernel
//   on the tensor cores (attention_flash.cuh, head_dim 64 and 128: bf16 products, fp32
//   softmax and accumulation, the Backend's BF16 precision), other head dims through
//   cuBLAS (attention_gemm.cuh).
// - A decode step (decode_step) uploads every layer's views once and runs as a CUDA
//   graph per (rows, capacity bucket), captured on its second sight and replayed after;
//   BLENDSERVE_CUDA_GRAPHS=0 runs it op by op (the same results).
// - Token ids and KV positions live in device memory, so they cannot be checked on the
//   host before the op runs without waiting for the GPU. The kernels never touch memory
//   for an id or position out of range (embed writes a NaN row, store_kv skips the row,
//   kv_deviation gives NaN), a check kernel flags the first such op, and the next host
//   wait (copy_to_host, synchronize) throws std::out_of_range naming it. The reference
//   and CPU backends throw at the call; callers validate before they upload anyway.
// - copy_to_backend on a stream of make_stream() goes through pinned staging buffers
//   of that stream (host memcpy into pinned memory, then an asynchronous DMA), so a
//   loader thread's copies of layer l+1 overlap the compute of layer l; an event per
//   layer (record / wait) is the gate. Without a stream the copy is issued on the
//   compute stream and the host bytes are consumed before the call returns: small ones
//   (ids, positions, page tables; up to 256 KiB) through the compute stream's own pinned
//   ring, so a decode step's few uploads are asynchronous DMAs, not the driver's
//   synchronous staging of pageable memory.
// - A batched decode step stores its rows' K/V in one launch (store_kv_rows) and its
//   layer's views and page tables go up once for that store and the attention after it.
#pragma once

#include <chrono>
#include <memory>

#include "kernels/backend.h"

namespace bs::kernels {

// The CUDA backend on device `device` (0-based, as CUDA_VISIBLE_DEVICES shows them).
// Every host wait (a copy back, sampled ids, an upload, a loader's staging buffer and
// drain) gives up after `wait_limit` (device.wait_timeout) and marks the device lost
// (cuda/device_waits.h). Throws std::runtime_error naming the device count when there
// is no such device or no driver, and for any CUDA/cuBLAS failure while setting up;
// std::invalid_argument for a limit <= 0.
std::unique_ptr<Backend> make_cuda_backend(int device,
                                           std::chrono::nanoseconds wait_limit = std::chrono::seconds(60));

}  // namespace bs::kernels
