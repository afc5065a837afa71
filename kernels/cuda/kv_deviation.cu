#include "kernels/cuda/kv_deviation.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;  // elements of a head row per lane
constexpr int kWarps = 4;                   // tokens per block (a warp each)

// A warp per token. The sum must be bit-identical to the reference's
// (op_math::add_row_deviation over the heads in order): a double sum rounds at every
// add, so it cannot be split across lanes or reassociated (a tree sum or a partial
// sum per lane gives other doubles, and the blend could select other tokens). What
// the order does not constrain is every term: (double)(fresh - cached) squared does
// not depend on `dev`. So, per KV head:
//   1. the 32 lanes load the head's row across head_dim: fresh K/V fp32 and the
//      cached row through load_kv (coalesced: consecutive lanes, consecutive
//      elements of one row), into registers (kPerLane per lane, unrolled: no local
//      memory);
//   2. each lane computes its elements' terms exactly as add_row_deviation does on the
//      device (__fsub_rn, widen, __dmul_rn) and writes them to shared memory in the
//      reference's summation order (element i: K's term, then V's);
//   3. lane 0 adds them to `dev` one by one with __dadd_rn, in that order: the
//      reference's serial chain, each add reading one shared double.
// The next head's loads are issued before lane 0's chain, so their latency hides
// behind it. Against one thread per token this removes the strided loads (a thread
// walked its own rows, 32 rows per warp load) and the two 1 KB local arrays, and keeps
// only the unavoidable part serial: one dependent double add per term, many tokens'
// chains interleaved on each SM. The cache's dtype is a template argument (load_kv's
// branch folds); 7 blocks of 4 warps per SM keep it at 72 registers with no spill
// (16 KB of shared memory a block: 112 KB an SM).
template <TensorType kDtype>
__global__ void __launch_bounds__(kWarps * 32, 7)
    deviation_warp_per_token(DevicePagedKv kv, const int32_t* __restrict__ pos, const float* __restrict__ k,
                             const float* __restrict__ v, int64_t n, bool with_k, bool with_v,
                             double* __restrict__ out) {
  __shared__ double terms_all[kWarps][2 * kMaxHeadDim];
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int64_t t = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  if (t >= n) return;  // the whole warp: t is uniform across it
  const int64_t p = pos[t];
  if (p < 0 || p >= kv.capacity) {
    if (lane == 0) out[t] = __longlong_as_double(0x7ff8000000000000LL);  // NaN
    return;
  }
  double* terms = terms_all[warp];
  const int d = static_cast<int>(kv.head_dim);
  const int per_elem = (with_k ? 1 : 0) + (with_v ? 1 : 0);  // terms per element
  const int v_at = with_k ? 1 : 0;                            // V's term after K's
  const int count = per_elem * d;

  float fk[kPerLane], ck[kPerLane], fv[kPerLane], cv[kPerLane];
  auto load_head = [&](int64_t h) {
    const int64_t row = kv.row_offset(h, p);
    const float* kf = k + (t * kv.kv_heads + h) * d;
    const float* vf = v + (t * kv.kv_heads + h) * d;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < d) {
        if (with_k) {
          fk[j] = kf[i];
          ck[j] = load_kv(kDtype, kv.k, row + i);
        }
        if (with_v) {
          fv[j] = vf[i];
          cv[j] = load_kv(kDtype, kv.v, row + i);
        }
      }
    }
  };

  double dev = 0.0;  // lane 0's
  load_head(0);
  for (int64_t h = 0; h < kv.kv_heads; ++h) {
    __syncwarp();  // lane 0 has read the previous head's terms
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < d) {
        // add_row_deviation's terms on the device: no fused multiply-add.
        if (with_k) {
          const double e = static_cast<double>(__fsub_rn(fk[j], ck[j]));
          terms[per_elem * i] = __dmul_rn(e, e);
        }
        if (with_v) {
          const double e = static_cast<double>(__fsub_rn(fv[j], cv[j]));
          terms[per_elem * i + v_at] = __dmul_rn(e, e);
        }
      }
    }
    __syncwarp();  // the terms are in shared memory
    if (h + 1 < kv.kv_heads) load_head(h + 1);
    if (lane == 0)
      for (int m = 0; m < count; ++m) dev = __dadd_rn(dev, terms[m]);
  }
  if (lane == 0) out[t] = dev;
}

}  // namespace

void kv_deviation(const DevicePagedKv& kv, const int32_t* pos, const float* k, const float* v, int64_t n, bool with_k,
                  bool with_v, double* out, cudaStream_t stream) {
  if (kv.head_dim > kMaxHeadDim)
    throw std::invalid_argument("cuda kv_deviation: head_dim " + std::to_string(kv.head_dim) + " > 256");
  if (n <= 0) return;
  const dim3 grid(static_cast<unsigned>((n + kWarps - 1) / kWarps)), block(kWarps * 32);
  // load_kv's cases: F32, F16, and every other dtype read as BF16.
  if (kv.dtype == TensorType::F32)
    deviation_warp_per_token<TensorType::F32><<<grid, block, 0, stream>>>(kv, pos, k, v, n, with_k, with_v, out);
  else if (kv.dtype == TensorType::F16)
    deviation_warp_per_token<TensorType::F16><<<grid, block, 0, stream>>>(kv, pos, k, v, n, with_k, with_v, out);
  else
    deviation_warp_per_token<TensorType::BF16><<<grid, block, 0, stream>>>(kv, pos, k, v, n, with_k, with_v, out);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
