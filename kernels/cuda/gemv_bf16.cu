#include "kernels/cuda/gemv_bf16.cuh"

#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

// The order every row's sum is computed in (gemv_bf16.cuh says why it matters): lane l
// of the warp that owns output feature o keeps one partial sum per row, adding the
// products of elements in groups of 8 (vector path: group g is elements 8g..8g+7, one
// 16-byte load) at groups l, l + 32, l + 64, ... in that order, e = 0..7 within a group,
// each product by one fmaf into the partial sum; then the 32 partial sums are added by
// the xor-shuffle tree (offsets 16, 8, 4, 2, 1) and lane 0 adds the bias. The element
// path (in_features % 8 != 0) is the same with single elements l, l + 32, ... Nothing
// below (the row bucket R, the features per warp F, the loads in flight U, staging x in
// shared memory) changes which fmaf feeds which partial sum or in what order: it only
// changes when the loads are issued and which registers hold which sums.

// The 8 bf16 values of one 16-byte load as floats.
__device__ __forceinline__ void unpack8(const uint4& packed, float (&out)[8]) {
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&packed);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = __bfloat162float(v[e]);
}

// One group g of F weight rows (wv[f] = W[o0 + f] group g) times rows t < n of x (group
// g of row t at xg[t * x_stride]): acc[t][f] += W x, e = 0..7 in order.
template <int R, int F>
__device__ __forceinline__ void accumulate_group(float (&acc)[R][F], const uint4 (&wv)[F], const uint4* xg,
                                                 int64_t x_stride, int n) {
  float wf[F][8];
#pragma unroll
  for (int f = 0; f < F; ++f) unpack8(wv[f], wf[f]);
#pragma unroll
  for (int t = 0; t < R; ++t) {
    if (t >= n) break;
    float xf[8];
    unpack8(xg[t * x_stride], xf);
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[t][f] = fmaf(wf[f][e], xf[e], acc[t][f]);
  }
}

// The xor tree over the warp's lanes for rows t < n of features o0 .. o0 + F - 1 (those
// < out_features); lane 0 writes y[t, o] (+ bias[o]).
template <int R, int F>
__device__ __forceinline__ void reduce_and_store(float (&acc)[R][F], float* __restrict__ y,
                                                 const float* __restrict__ bias, int n, int64_t out_features,
                                                 int64_t o0, int lane) {
#pragma unroll
  for (int t = 0; t < R; ++t) {
    if (t >= n) break;
#pragma unroll
    for (int f = 0; f < F; ++f) {
      float s = acc[t][f];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
      const int64_t o = o0 + f;
      if (lane == 0 && o < out_features) y[t * out_features + o] = bias ? s + bias[o] : s;
    }
  }
}

// Vector path (in_features % 8 == 0; rows of W and x 16-byte aligned), `groups` =
// in_features / 8. Warp w of block b owns output features o0 = (b * kWarps + w) * F ..
// o0 + F - 1, sharing every load of x among them; rows t < n (n <= R) of x, one
// accumulator per row and feature (R * F registers).
//
// Each lane first issues U * F independent 16-byte weight loads (its next U groups of
// each of its F rows, g, g + 32, ..., g + 32 (U - 1)), then consumes them in group
// order. W is streamed (__ldcs: read once per call, evict-first), so L1/L2 keep x.
//
// kStage: x is read from shared memory, chunk c (groups 32c .. 32c + 31 of rows t < n,
// n * 512 bytes) staged by the whole block with cp.async, double-buffered (chunk c + 1
// is copied while chunk c is used): the block reads x from L2 once, instead of each warp
// reading n rows of x per F features. Otherwise each warp reads x from global memory
// (L1/L2 resident: it is at most 8 rows).
template <int R, int F, int U, bool kStage, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    gemv_vector(const uint4* __restrict__ w, const uint4* __restrict__ x, float* __restrict__ y,
                const float* __restrict__ bias, int n, int64_t out_features, int64_t groups) {
  const int lane = threadIdx.x % 32;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * F;
  if constexpr (!kStage) {
    if (o0 >= out_features) return;  // (kStage: every thread takes part in the staging)
  }
  // A feature past the end reads the last row (never stored): the loop stays branch-free.
  const uint4* rows[F];
#pragma unroll
  for (int f = 0; f < F; ++f) rows[f] = w + (o0 + f < out_features ? o0 + f : out_features - 1) * groups;
  float acc[R][F];
#pragma unroll
  for (int t = 0; t < R; ++t)
#pragma unroll
    for (int f = 0; f < F; ++f) acc[t][f] = 0.0f;

  if constexpr (!kStage) {
    for (int64_t g0 = lane; g0 < groups; g0 += 32 * U) {
      uint4 wv[U][F];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t g = g0 + 32 * u;
#pragma unroll
        for (int f = 0; f < F; ++f) wv[u][f] = g < groups ? __ldcs(rows[f] + g) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t g = g0 + 32 * u;
        if (g >= groups) break;
        accumulate_group<R, F>(acc, wv[u], x + g, groups, n);
      }
    }
  } else {
    extern __shared__ uint4 staged[];  // [2][n][32]: chunk c in buffer c % 2
    const int64_t chunks = (groups + 31) / 32;
    const auto stage = [&](int64_t c) {
      uint4* buf = staged + (c % 2) * n * 32;
      for (int i = threadIdx.x; i < n * 32; i += 32 * kWarps) {
        const int t = i / 32, j = i % 32;
        const int64_t g = c * 32 + j;
        if (g < groups) __pipeline_memcpy_async(buf + i, x + t * groups + g, sizeof(uint4));
      }
      __pipeline_commit();
    };
    // This lane's groups of chunks c0 .. c0 + U - 1 of its F rows of W.
    const auto load_w = [&](uint4(&wv)[U][F], int64_t c0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t g = (c0 + u) * 32 + lane;
#pragma unroll
        for (int f = 0; f < F; ++f) wv[u][f] = g < groups ? __ldcs(rows[f] + g) : make_uint4(0, 0, 0, 0);
      }
    };
    stage(0);
    const bool owner = o0 < out_features;
    // The barriers keep the block's warps (one block per SM at 16+ rows) in step, so a
    // weight load issued just before its use would stall them all: the next U chunks'
    // weights are loaded while these U chunks are used.
    uint4 next[U][F];
    load_w(next, 0);
    for (int64_t c0 = 0; c0 < chunks; c0 += U) {
      uint4 wv[U][F];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int f = 0; f < F; ++f) wv[u][f] = next[u][f];
      load_w(next, c0 + U);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + u;
        if (c >= chunks) break;  // the same for the whole block
        __pipeline_wait_prior(0);  // this thread's copies of chunk c have landed
        // Everyone's copies of chunk c are visible, and everyone is done with chunk c - 1,
        // whose buffer chunk c + 1 overwrites.
        __syncthreads();
        if (c + 1 < chunks) stage(c + 1);
        const int64_t g = c * 32 + lane;
        if (owner && g < groups) accumulate_group<R, F>(acc, wv[u], staged + (c % 2) * n * 32 + lane, 32, n);
      }
    }
  }
  reduce_and_store<R, F>(acc, y, bias, n, out_features, o0, lane);
}

// Element path (in_features % 8 != 0: rows not 16-byte aligned): one warp per output
// feature o, lane l adding elements l, l + 32, ... one by one; U element loads of W in
// flight per lane. x from global memory (each warp reads n rows of it).
template <int R, int U, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    gemv_elements(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x, float* __restrict__ y,
                  const float* __restrict__ bias, int n, int64_t out_features, int64_t in_features) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= out_features) return;
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* row = w + o * in_features;
  float acc[R][1];
#pragma unroll
  for (int t = 0; t < R; ++t) acc[t][0] = 0.0f;
  for (int64_t i0 = lane; i0 < in_features; i0 += 32 * U) {
    float wf[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = i0 + 32 * u;
      wf[u] = i < in_features ? __bfloat162float(row[i]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = i0 + 32 * u;
      if (i >= in_features) break;
#pragma unroll
      for (int t = 0; t < R; ++t) {
        if (t >= n) break;
        acc[t][0] = fmaf(wf[u], __bfloat162float(x[t * in_features + i]), acc[t][0]);
      }
    }
  }
  reduce_and_store<R, 1>(acc, y, bias, n, out_features, o, lane);
}

// Per row bucket R: features per warp F (x loads shared by F features, R * F
// accumulators), U loads of W in flight per lane and feature, x staged in shared memory
// or not, warps per block. A product with fewer than kMinBlocks blocks of F features
// per warp takes one feature per warp (F1 / U1) instead, so small products (k/v
// projections) still spread over the SMs.
template <int R>
struct Bucket;
template <>
struct Bucket<1> {
  static constexpr int F = 1, U = 8, F1U = 8, kWarps = 4;
  static constexpr bool kStage = false;
};
template <>
struct Bucket<2> {
  static constexpr int F = 1, U = 8, F1U = 8, kWarps = 4;
  static constexpr bool kStage = false;
};
template <>
struct Bucket<4> {
  static constexpr int F = 2, U = 4, F1U = 8, kWarps = 4;
  static constexpr bool kStage = false;
};
template <>
struct Bucket<8> {
  static constexpr int F = 2, U = 4, F1U = 8, kWarps = 4;
  static constexpr bool kStage = false;
};
template <>
struct Bucket<16> {
  static constexpr int F = 4, U = 2, F1U = 8, kWarps = 8;
  static constexpr bool kStage = true;
};
template <>
struct Bucket<32> {
  static constexpr int F = 4, U = 1, F1U = 4, kWarps = 8;
  static constexpr bool kStage = true;
};
template <>
struct Bucket<64> {
  static constexpr int F = 2, U = 2, F1U = 4, kWarps = 8;
  static constexpr bool kStage = true;
};

constexpr int64_t kMinBlocks = 256;  // ~2 per SM on an H100 / H200 (132 SMs)
// (more element loads in flight at 16+ rows made ptxas spill on sm_80)
template <int R>
constexpr int kElementU = R >= 16 ? 2 : 4;
constexpr int kElementWarps = 8;

template <int R, int F, int U, bool kStage, int kWarps>
void launch_vector(const __nv_bfloat16* w, const __nv_bfloat16* x, float* y, const float* bias, int n,
                   int64_t out_features, int64_t in_features, cudaStream_t stream) {
  const auto kernel = gemv_vector<R, F, U, kStage, kWarps>;
  const size_t smem = kStage ? 2 * static_cast<size_t>(n) * 32 * sizeof(uint4) : 0;
  if (smem > 48 * 1024) {
    // Above the default dynamic shared memory limit (up to 64 KiB for 64 rows): opt in
    // once per device.
    static std::atomic<uint64_t> opted{0};
    int device = 0;
    BS_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = uint64_t{1} << (device % 64);
    if (!(opted.load(std::memory_order_acquire) & bit)) {
      BS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
      opted.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  const int64_t per_block = int64_t{kWarps} * F;
  const int64_t blocks = (out_features + per_block - 1) / per_block;
  kernel<<<static_cast<unsigned>(blocks), 32 * kWarps, smem, stream>>>(
      reinterpret_cast<const uint4*>(w), reinterpret_cast<const uint4*>(x), y, bias, n, out_features,
      in_features / 8);
}

template <int R>
void launch_bucket(const __nv_bfloat16* w, const __nv_bfloat16* x, float* y, const float* bias, int n,
                   int64_t out_features, int64_t in_features, cudaStream_t stream) {
  using B = Bucket<R>;
  static_assert(R * B::F <= 128 && R <= kGemvMaxRows, "accumulators must fit the registers");
  if (in_features % 8 != 0) {
    const int64_t blocks = (out_features + kElementWarps - 1) / kElementWarps;
    gemv_elements<R, kElementU<R>, kElementWarps><<<static_cast<unsigned>(blocks), 32 * kElementWarps, 0, stream>>>(
        w, x, y, bias, n, out_features, in_features);
  } else if (B::F > 1 && (out_features + int64_t{B::kWarps} * B::F - 1) / (int64_t{B::kWarps} * B::F) < kMinBlocks) {
    launch_vector<R, 1, B::F1U, B::kStage, B::kWarps>(w, x, y, bias, n, out_features, in_features, stream);
  } else {
    launch_vector<R, B::F, B::U, B::kStage, B::kWarps>(w, x, y, bias, n, out_features, in_features, stream);
  }
}

}  // namespace

void gemv_bf16(const Bf16Weights& w, const float* x, float* y, int64_t n, const float* bias,
               DeviceAllocation& scratch, cudaStream_t stream) {
  if (n < 1 || n > kGemvMaxRows)
    throw std::invalid_argument("cuda gemv_bf16: " + std::to_string(n) + " rows (1.." + std::to_string(kGemvMaxRows) +
                                ")");
  const auto* xb = static_cast<const __nv_bfloat16*>(activations_to_bf16(x, n * w.in_features, scratch, stream));
  // Rows of W and of x 16-byte aligned on the vector path (both allocations start
  // 256-byte aligned and in_features % 8 == 0).
  if (w.out_features == 0) return;  // (no grid of 0 blocks)
  const auto* wb = w.data.as<__nv_bfloat16>();
  const int rows = static_cast<int>(n);
  const int64_t out = w.out_features, in = w.in_features;
  if (n <= 1)
    launch_bucket<1>(wb, xb, y, bias, rows, out, in, stream);
  else if (n <= 2)
    launch_bucket<2>(wb, xb, y, bias, rows, out, in, stream);
  else if (n <= 4)
    launch_bucket<4>(wb, xb, y, bias, rows, out, in, stream);
  else if (n <= 8)
    launch_bucket<8>(wb, xb, y, bias, rows, out, in, stream);
  else if (n <= 16)
    launch_bucket<16>(wb, xb, y, bias, rows, out, in, stream);
  else if (n <= 32)
    launch_bucket<32>(wb, xb, y, bias, rows, out, in, stream);
  else
    launch_bucket<64>(wb, xb, y, bias, rows, out, in, stream);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
