#include "kernels/cuda/attention_flash.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 16;                    // the M of one m16n8k16 product
constexpr int kBlockRows = kWarps * kRowsPerWarp;   // 64 query rows per block
constexpr int kKeys = 64;                           // keys per K/V tile
constexpr int kPad = 8;                             // bf16 padding per shared row (16 bytes): ldmatrix's
                                                    // 8 row addresses then fall in 8 different bank quads
constexpr float kLog2e = 1.4426950408889634f;

// Two floats as a bf16x2 register: lo in the low half (the operand's lower index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// Two fp16 (lo in the low half) as the bf16x2 of their exact fp32 values.
__device__ __forceinline__ uint32_t half2_to_bf16x2(uint32_t bits) {
  __half2 h;
  memcpy(&h, &bits, sizeof(h));
  const float2 f = __half22float2(h);  // .x from the low half
  return pack_bf16(f.x, f.y);
}

// Elements [at, at + 8) of a K or V pool of dtype T as raw bits, from a 16-byte aligned
// address: r[0] (F32: r[0], r[1]) in memory order.
template <TensorType T>
__device__ __forceinline__ void load_raw8(const void* base, int64_t at, uint4 (&r)[2]) {
  if constexpr (T == TensorType::F32) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(base) + at);
    r[0] = p[0];
    r[1] = p[1];
  } else {
    r[0] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + at);
    r[1] = make_uint4(0u, 0u, 0u, 0u);  // unused
  }
}

// load_raw8's bits as 8 bf16 (element i in half i % 2 of word i / 2: memory order once
// stored), each rounded to nearest even from its exact fp32 value.
template <TensorType T>
__device__ __forceinline__ uint4 raw8_to_bf16(const uint4 (&r)[2]) {
  if constexpr (T == TensorType::BF16) {
    return r[0];
  } else if constexpr (T == TensorType::F16) {
    return make_uint4(half2_to_bf16x2(r[0].x), half2_to_bf16x2(r[0].y), half2_to_bf16x2(r[0].z),
                      half2_to_bf16x2(r[0].w));
  } else {
    return make_uint4(pack_bf16(__uint_as_float(r[0].x), __uint_as_float(r[0].y)),
                      pack_bf16(__uint_as_float(r[0].z), __uint_as_float(r[0].w)),
                      pack_bf16(__uint_as_float(r[1].x), __uint_as_float(r[1].y)),
                      pack_bf16(__uint_as_float(r[1].z), __uint_as_float(r[1].w)));
  }
}

// The same from any alignment, element by element (dtype at run time).
__device__ __forceinline__ uint4 load8_bf16_scalar(TensorType dtype, const void* base, int64_t at) {
  float f[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = load_kv(dtype, base, at + i);
  return make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
}

// ldmatrix .x4: lanes 8m..8m+7 give the addresses of rows 0..7 of 8x8 matrix m (16
// bytes each); r[m] of lane l holds row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of
// matrix m (.trans: of its transpose, i.e. rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// c += A B for one m16n8k16 product, lane l (g = l / 4, i = l % 4):
//   a[0]: A[g][2i, 2i+1]   a[1]: A[g+8][2i, 2i+1]   a[2]: A[g][2i+8, 2i+9]   a[3]: A[g+8][2i+8, 2i+9]
//   b0: B[2i, 2i+1][g]     b1: B[2i+8, 2i+9][g]
//   c[0], c[1]: C[g][2i, 2i+1]                       c[2], c[3]: C[g+8][2i, 2i+1]
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Dynamic shared memory of the kernel for head_dim D: the K and V tiles (rows padded by
// kPad), then the warps' Q operands (16 bytes per lane and 16-dim chunk).
template <int D>
struct Layout {
  static constexpr int kStride = D + kPad;  // bf16 per shared K/V row (a multiple of 8: rows 16-byte aligned)
  static constexpr int kTileBytes = kKeys * kStride * 2;
  static constexpr int kQOffset = 2 * kTileBytes;
  static constexpr int kBytes = kQOffset + kWarps * (D / 16) * 32 * 16;
  static_assert(kTileBytes % 16 == 0, "the V tile and Q start 16-byte aligned");
};

// The offset in q and out of the head vector of query row r (of `rows`) of KV head g;
// -1 past the last row.
__device__ __forceinline__ int64_t head_vector(int64_t r, int64_t rows, int64_t group, int64_t g, int64_t q_heads,
                                               int64_t d) {
  if (r >= rows) return -1;
  const int64_t t = r / group, h = g * group + r % group;
  return (t * q_heads + h) * d;
}

// One block per (KV head g, tile of 64 rows R = t * group + r of that head's query
// rows); warp w holds rows 16w..16w+15 of the tile, lane l rows l / 4 and l / 4 + 8 of
// those. The grid lists the latest row tiles first (the heaviest of an ascending
// prefill), all KV heads of a tile together. At most 168 registers (3 blocks of 4 warps
// per SM): O (D / 2 floats a lane) and S (32) stay in registers, Q waits in shared
// memory. T: the KV dtype; vec: the pools allow 16-byte loads (else element by element).
template <int D, TensorType T>
__global__ void __launch_bounds__(kThreads, 3)
    flash_attention(const float* __restrict__ q, const int32_t* __restrict__ qpos, DevicePagedKv kv,
                    float* __restrict__ out, int64_t n, int64_t q_heads, int64_t n_kv, float scale_log2, bool vec) {
  static_assert(D % 16 == 0 && (D / 16) % 2 == 0, "head_dim: pairs of 16-wide k-chunks");
  constexpr int kStride = Layout<D>::kStride;
  constexpr int kParts = D / 8;  // 16-byte parts of a bf16 row
  constexpr int kIters = kKeys * kParts / kThreads;     // 16-byte chunks of K (and of V) per thread and tile
  constexpr int kBatch = T == TensorType::F32 ? 2 : 4;  // chunks whose loads are in flight together
  static_assert(kKeys * kParts % kThreads == 0 && kIters % kBatch == 0, "the tile loads split evenly");
  extern __shared__ uint4 smem[];
  uint16_t* const ks = reinterpret_cast<uint16_t*>(smem);  // K tile [key][kStride], bf16 bits
  uint16_t* const vs = ks + kKeys * kStride;                // V tile [key][kStride], bf16 bits
  uint4* const qs = smem + Layout<D>::kQOffset / 16;        // Q operands [warp][kc][lane]
  __shared__ int warp_lasts[kWarps];

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gq = lane / 4, iq = lane % 4;  // the mma's groupID and thread-in-group
  const int64_t group = q_heads / kv.kv_heads;
  const int64_t rows = n * group;
  const int64_t row_tiles = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t g = blockIdx.x % kv.kv_heads;
  const int64_t tile = row_tiles - 1 - blockIdx.x / kv.kv_heads;
  const int64_t row0 = tile * kBlockRows + warp * kRowsPerWarp;

  // This lane's two rows (gq and gq + 8 of the warp's 16): the last key each sees (< 0:
  // none, or past the last row).
  int last[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = row0 + gq + 8 * i;
    last[i] = -1;
    if (r < rows) {
      const int64_t p = qpos[r / group];
      last[i] = static_cast<int>(p < n_kv - 1 ? p : n_kv - 1);
    }
  }

  // Q as the A operands of S = Q K^T, rounded to bf16, parked in shared memory (registers
  // are short): qs[(warp * D / 16 + kc) * 32 + lane] holds this lane's a[0..3] for dims
  // [16 kc, 16 kc + 16) (the layout of mma_bf16's a). Only the lane that writes an entry
  // reads it back: no barrier needed.
  uint4* const qlane = qs + warp * (D / 16) * 32 + lane;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    const int c = kc * 16 + iq * 2;
    float x[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t at = head_vector(row0 + gq + 8 * i, rows, group, g, q_heads, D);
      if (at >= 0) {
        const float* qr = q + at;
        x[i][0] = qr[c];
        x[i][1] = qr[c + 1];
        x[i][2] = qr[c + 8];
        x[i][3] = qr[c + 9];
      } else {
        x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.0f;
      }
    }
    qlane[kc * 32] = make_uint4(pack_bf16(x[0][0], x[0][1]), pack_bf16(x[1][0], x[1][1]),
                                pack_bf16(x[0][2], x[0][3]), pack_bf16(x[1][2], x[1][3]));
  }

  // The last key any row of the warp / the block sees: the block loads key tiles up to
  // the block's, a warp computes on those up to its own.
  int warp_last = last[0] > last[1] ? last[0] : last[1];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, warp_last, o);
    warp_last = other > warp_last ? other : warp_last;
  }
  if (lane == 0) warp_lasts[warp] = warp_last;
  __syncthreads();
  int block_last = warp_lasts[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) block_last = warp_lasts[w] > block_last ? warp_lasts[w] : block_last;
  const int key_tiles = block_last < 0 ? 0 : block_last / kKeys + 1;
  const int lane_min_last = last[0] < last[1] ? last[0] : last[1];

  float o[D / 8][4];  // O: o[nt] covers dims [8 nt, 8 nt + 8) (the layout of mma_bf16's c)
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of each row's scores (log2 units)
  float l[2] = {0.0f, 0.0f};            // this lane's part of each row's sum of p

  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kKeys;
    __syncthreads();  // every warp is done with the previous tile
    // Keys [k0, k0 + 64) of KV head g into shared memory as bf16; zeros past n_kv (no
    // page there to read, and V must be finite where p is 0).
    if (vec) {
      // kBatch chunks of K and V in flight at once (32 registers), then converted and stored.
#pragma unroll 1
      for (int b0 = 0; b0 < kIters; b0 += kBatch) {
        uint4 kr[kBatch][2], vr[kBatch][2];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int c = static_cast<int>(threadIdx.x) + (b0 + b) * kThreads;
          const int64_t j = k0 + c / kParts;
          if (j < n_kv) {
            const int64_t src = kv.row_offset(g, j) + (c % kParts) * 8;
            load_raw8<T>(kv.k, src, kr[b]);
            load_raw8<T>(kv.v, src, vr[b]);
          } else {
            kr[b][0] = kr[b][1] = vr[b][0] = vr[b][1] = make_uint4(0u, 0u, 0u, 0u);
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int c = static_cast<int>(threadIdx.x) + (b0 + b) * kThreads;
          const int at = (c / kParts) * kStride + (c % kParts) * 8;
          *reinterpret_cast<uint4*>(&ks[at]) = raw8_to_bf16<T>(kr[b]);
          *reinterpret_cast<uint4*>(&vs[at]) = raw8_to_bf16<T>(vr[b]);
        }
      }
    } else {
#pragma unroll 1
      for (int it = 0; it < kIters; ++it) {
        const int c = static_cast<int>(threadIdx.x) + it * kThreads;
        const int64_t j = k0 + c / kParts;
        uint4 kx = make_uint4(0u, 0u, 0u, 0u), vx = kx;
        if (j < n_kv) {
          const int64_t src = kv.row_offset(g, j) + (c % kParts) * 8;
          kx = load8_bf16_scalar(T, kv.k, src);
          vx = load8_bf16_scalar(T, kv.v, src);
        }
        const int at = (c / kParts) * kStride + (c % kParts) * 8;
        *reinterpret_cast<uint4*>(&ks[at]) = kx;
        *reinterpret_cast<uint4*>(&vs[at]) = vx;
      }
    }
    __syncthreads();
    if (k0 > warp_last) continue;  // no row of this warp sees a key of this tile (warp-uniform)

    // S = Q K^T for the warp's 16 rows and the tile's 64 keys: s[nt] covers keys
    // [k0 + 8 nt, k0 + 8 nt + 8). B[k = dim][n = key] = K[key][dim]: ldmatrix matrix mi
    // is keys 8 nt..8 nt+7, dims 16 kc + 8 mi..+7, i.e. b0, b1 of chunk kc and of kc + 1.
    float s[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc += 2) {
      const uint4 q0 = qlane[kc * 32], q1 = qlane[(kc + 1) * 32];
      const uint32_t a0[4] = {q0.x, q0.y, q0.z, q0.w}, a1[4] = {q1.x, q1.y, q1.z, q1.w};
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        uint32_t b[4];
        ldmatrix_x4(b, &ks[(nt * 8 + (lane & 7)) * kStride + kc * 16 + (lane >> 3) * 8]);
        mma_bf16(s[nt], a0, b[0], b[1]);
        mma_bf16(s[nt], a1, b[2], b[3]);
      }
    }

    // Scores in log2 units; keys past a row's last masked (only in tiles that reach past
    // the last key of one of this lane's rows).
    const bool mask = k0 + kKeys - 1 > lane_min_last;
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= scale_log2;
        if (mask && k0 + nt * 8 + iq * 2 + (e & 1) > last[e >> 1]) s[nt][e] = -INFINITY;
      }

    // Online softmax per row; the 4 lanes of a quad hold the row's 64 scores.
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[i], mx);
      // No key yet for this row: subtract 0, so p and the correction are exp2(-inf) = 0
      // rather than exp2(-inf - -inf) = NaN.
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      corr[i] = exp2f(m[i] - base);
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        s[nt][2 * i] = exp2f(s[nt][2 * i] - base);
        s[nt][2 * i + 1] = exp2f(s[nt][2 * i + 1] - base);
        sum += s[nt][2 * i] + s[nt][2 * i + 1];
      }
      l[i] = l[i] * corr[i] + sum;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      o[nt][0] *= corr[0];
      o[nt][1] *= corr[0];
      o[nt][2] *= corr[1];
      o[nt][3] *= corr[1];
    }

    // O += P V: P's A operand for keys [16 kk, 16 kk + 16) is s[2 kk] (keys 2i, 2i+1) and
    // s[2 kk + 1] (keys 2i+8, 2i+9), in bf16. B[k = key][n = dim] = V[key][dim]: with
    // .trans, matrix mi is keys 16 kk + 8 (mi % 2)..+7, dims 8 nt + 8 (mi / 2)..+7, i.e.
    // b0, b1 of dims tile nt and of nt + 1.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nt = 0; nt < D / 8; nt += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, &vs[(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + nt * 8 + (lane >> 4) * 8]);
        mma_bf16(o[nt], a, b[0], b[1]);
        mma_bf16(o[nt + 1], a, b[2], b[3]);
      }
    }
  }

  // O / l per row (0 for a row with no key); every real row written.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = l[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int64_t at = head_vector(row0 + gq + 8 * i, rows, group, g, q_heads, D);
    if (at < 0) continue;
    float* orow = out + at;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      orow[nt * 8 + iq * 2] = o[nt][2 * i] * inv;
      orow[nt * 8 + iq * 2 + 1] = o[nt][2 * i + 1] * inv;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int D, TensorType T>
void launch(unsigned grid, const float* q, const int32_t* qpos, const DevicePagedKv& kv, float* out, int64_t n,
            int64_t q_heads, int64_t n_kv, float scale_log2, bool vec, cudaStream_t stream) {
  constexpr int bytes = Layout<D>::kBytes;
  // Past 48 KiB a kernel must opt in, once per device (a bit per device already done;
  // devices past 63 ask every time).
  if constexpr (bytes > 48 * 1024) {
    static std::atomic<uint64_t> opted_in{0};
    int device = 0;
    BS_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (bit == 0 || (opted_in.load(std::memory_order_acquire) & bit) == 0) {
      BS_CUDA_CHECK(cudaFuncSetAttribute(flash_attention<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      opted_in.fetch_or(bit, std::memory_order_release);
    }
  }
  flash_attention<D, T><<<grid, kThreads, bytes, stream>>>(q, qpos, kv, out, n, q_heads, n_kv, scale_log2, vec);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool attention_flash_supports(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

void attention_flash(const float* q, const int32_t* qpos, const DevicePagedKv& kv, float* out, int64_t n,
                     int64_t q_heads, int64_t n_kv, float scale, cudaStream_t stream) {
  if (!attention_flash_supports(kv.head_dim))
    throw std::invalid_argument("cuda attention_flash: head_dim " + std::to_string(kv.head_dim) +
                                " (64 or 128 only)");
  if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
    throw std::invalid_argument("cuda attention_flash: " + std::to_string(q_heads) + " query heads over " +
                                std::to_string(kv.kv_heads) + " KV heads");
  if (n <= 0) return;
  const int64_t group = q_heads / kv.kv_heads;
  const int64_t row_tiles = (n * group + kBlockRows - 1) / kBlockRows;
  const int64_t blocks = row_tiles * kv.kv_heads;
  if (blocks > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("cuda attention_flash: " + std::to_string(n) + " rows is too many");
  // 16-byte vector loads (F32: two) where every row part [8 p, 8 p + 8) starts 16-byte
  // aligned: aligned pools and strides in whole 16 bytes (always so for the pools of
  // kv_cache.h; otherwise the kernel reads element by element).
  const int64_t per16 = kv.dtype == TensorType::F32 ? 4 : 8;  // elements in 16 bytes
  const bool vec = aligned16(kv.k) && aligned16(kv.v) && kv.page_stride % per16 == 0 &&
                   kv.head_stride % per16 == 0 && kv.head_dim % per16 == 0;
  const float scale_log2 = scale * kLog2e;
  const unsigned grid = static_cast<unsigned>(blocks);
  const bool d64 = kv.head_dim == 64;
  switch (kv.dtype) {
    case TensorType::F32:
      (d64 ? launch<64, TensorType::F32> : launch<128, TensorType::F32>)(grid, q, qpos, kv, out, n, q_heads, n_kv,
                                                                         scale_log2, vec, stream);
      break;
    case TensorType::F16:
      (d64 ? launch<64, TensorType::F16> : launch<128, TensorType::F16>)(grid, q, qpos, kv, out, n, q_heads, n_kv,
                                                                         scale_log2, vec, stream);
      break;
    case TensorType::BF16:
      (d64 ? launch<64, TensorType::BF16> : launch<128, TensorType::BF16>)(grid, q, qpos, kv, out, n, q_heads, n_kv,
                                                                           scale_log2, vec, stream);
      break;
    default:
      throw std::invalid_argument("cuda attention_flash: K/V must be F32, F16 or BF16");
  }
}

}  // namespace bs::kernels::cuda
