// Decode-size products read the stored weights (Q4_0/Q4_1/Q8_0/F16/BF16/F32)
// directly: decode is memory-bound, and 4/8-bit rows are 4-8x fewer bytes than
// bf16. Each 32-element block is expanded to fp32 in registers and multiplied
// with fp32 activations (no activation quantization, so no extra error).
//
// AVX2 exception: expanding every 4/8-bit weight to fp32 costs ~25 instructions per
// block, which makes decode compute-bound at a third of the memory bandwidth on AVX2.
// There the activations of Q4_0/Q4_1 products are rounded to int16 per block of 32
// (scale max|x| / 32767: error <= 2^-16 of the block's largest value, far below the
// weights' own 4-bit error), and blocks multiply as integers (vpmaddwd). Q8_0 blocks
// expand cheaply and keep fp32 activations (the output projection's logits stay
// within 1e-4 of llama.cpp's).
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"
#include "kernels/dequant.h"

namespace bs::kernels::cpu::BS_ISA_NS {
namespace {

constexpr int kMaxTokens = 8;
constexpr int kBlock = 32;
constexpr int kBlockVecs = kBlock / kLanes;

#if BS_ISA_LEVEL >= 1
inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
#endif

// Expand one block of 32 weights into kBlockVecs vectors (elements in order).
template <TensorType T>
inline void load_block(const uint8_t* blk, vf* w) {
#if BS_ISA_LEVEL >= 2
  if constexpr (T == TensorType::Q4_1 || T == TensorType::Q4_0) {
    const float d = half_to_float(blk);
    const uint8_t* qs = blk + (T == TensorType::Q4_1 ? 4 : 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, mask)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), mask)));
    const __m512 vd = _mm512_set1_ps(d);
    if constexpr (T == TensorType::Q4_1) {
      const __m512 vm = _mm512_set1_ps(half_to_float(blk + 2));
      w[0] = _mm512_fmadd_ps(lo, vd, vm);
      w[1] = _mm512_fmadd_ps(hi, vd, vm);
    } else {
      const __m512 eight = _mm512_set1_ps(8.0f);
      w[0] = _mm512_mul_ps(_mm512_sub_ps(lo, eight), vd);
      w[1] = _mm512_mul_ps(_mm512_sub_ps(hi, eight), vd);
    }
  } else if constexpr (T == TensorType::Q8_0) {
    const __m512 vd = _mm512_set1_ps(half_to_float(blk));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), vd);
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), vd);
  } else if constexpr (T == TensorType::F32) {
    w[0] = _mm512_loadu_ps(reinterpret_cast<const float*>(blk));
    w[1] = _mm512_loadu_ps(reinterpret_cast<const float*>(blk) + 16);
  } else if constexpr (T == TensorType::F16) {
    w[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    w[1] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
  } else {  // BF16: shift into the upper half of a float
    const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    w[1] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  }
#elif BS_ISA_LEVEL == 1
  if constexpr (T == TensorType::Q4_1 || T == TensorType::Q4_0) {
    const __m256 vd = _mm256_set1_ps(half_to_float(blk));
    const uint8_t* qs = blk + (T == TensorType::Q4_1 ? 4 : 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask);                     // elements 0..15
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);  // elements 16..31
    const __m256 q[4] = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))};
    if constexpr (T == TensorType::Q4_1) {
      const __m256 vm = _mm256_set1_ps(half_to_float(blk + 2));
      for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(q[i], vd, vm);
    } else {
      const __m256 eight = _mm256_set1_ps(8.0f);
      for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(_mm256_sub_ps(q[i], eight), vd);
    }
  } else if constexpr (T == TensorType::Q8_0) {
    const __m256 vd = _mm256_set1_ps(half_to_float(blk));
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i)))),
          vd);
  } else if constexpr (T == TensorType::F32) {
    for (int i = 0; i < 4; ++i) w[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(blk) + 8 * i);
  } else if constexpr (T == TensorType::F16) {
    for (int i = 0; i < 4; ++i) w[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * i)));
  } else {  // BF16
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * i))), 16));
  }
#else
  // Scalar: the bit-exact reference dequantizers, one block at a time.
  alignas(64) float tmp[kBlock];
  if constexpr (T == TensorType::Q4_1) dequantize_q4_1(blk, tmp, kBlock);
  else if constexpr (T == TensorType::Q4_0) dequantize_q4_0(blk, tmp, kBlock);
  else if constexpr (T == TensorType::Q8_0) dequantize_q8_0(blk, tmp, kBlock);
  else if constexpr (T == TensorType::F32) dequantize_f32(blk, tmp, kBlock);
  else if constexpr (T == TensorType::F16) dequantize_f16(blk, tmp, kBlock);
  else dequantize_bf16(blk, tmp, kBlock);
  for (int i = 0; i < kBlockVecs; ++i) w[i] = vload(tmp + i * kLanes);
#endif
}

// Every token keeps kBlockVecs accumulator chains (vector i of each block adds into
// chain i) however many tokens share the weight pass, so its FMAs do not wait on each
// other and its result is bit-identical alone or batched (Transformer::decode_step
// relies on it). The chains of a group of tokens and the block's weights must fit
// the registers: AVX-512 has room for 8 tokens (16 + 2 of 32); AVX2 for 3 (12 + 1 of
// 16), so there a row is expanded to fp32 once into a buffer (L1) and the groups of 3
// read it, instead of expanding every block once per group.
#if BS_ISA_LEVEL == 1
constexpr int kGroup = 3;
constexpr bool kExpandRows = true;
#else
constexpr int kGroup = kMaxTokens;
constexpr bool kExpandRows = false;
#endif

// The products of one row with G tokens (a compile-time count: the accumulators stay
// in registers); y[t * out] receives token t's. The row is either stored blocks
// (W::Stored) or already expanded to fp32 (W::Expanded, the same values load_block
// gives): both add the same products in the same order.
enum class Row { Stored, Expanded };
template <TensorType T, Row R, int G>
inline void row_tokens(const void* row, int64_t bbytes, int64_t blocks, const float* x, int64_t in, float* y,
                       int64_t out) {
  vf acc[G][kBlockVecs];
  for (int t = 0; t < G; ++t)
    for (int c = 0; c < kBlockVecs; ++c) acc[t][c] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    if constexpr (R == Row::Stored) {
      vf wv[kBlockVecs];
      load_block<T>(static_cast<const uint8_t*>(row) + b * bbytes, wv);
      for (int t = 0; t < G; ++t) {
        const float* xb = x + t * in + b * kBlock;
        for (int i = 0; i < kBlockVecs; ++i) acc[t][i] = vfma(wv[i], vload(xb + i * kLanes), acc[t][i]);
      }
    } else {
      // One weight vector live at a time: the registers hold the accumulators.
      for (int i = 0; i < kBlockVecs; ++i) {
        const vf wv = vload(static_cast<const float*>(row) + b * kBlock + i * kLanes);
        for (int t = 0; t < G; ++t) acc[t][i] = vfma(wv, vload(x + t * in + b * kBlock + i * kLanes), acc[t][i]);
      }
    }
  }
  for (int t = 0; t < G; ++t) {
    vf sum = acc[t][0];
    for (int c = 1; c < kBlockVecs; ++c) sum = vadd(sum, acc[t][c]);
    y[t * out] = hsum(sum);
  }
}

// row_tokens for a run-time count g <= G.
template <TensorType T, Row R, int G>
inline void row_group(int64_t g, const void* row, int64_t bbytes, int64_t blocks, const float* x, int64_t in,
                      float* y, int64_t out) {
  if constexpr (G > 1) {
    if (g < G) return row_group<T, R, G - 1>(g, row, bbytes, blocks, x, in, y, out);
  }
  row_tokens<T, R, G>(row, bbytes, blocks, x, in, y, out);
}

// One row times nt tokens, in groups of kGroup.
template <TensorType T, Row R>
inline void row_all_tokens(const void* row, int64_t bbytes, int64_t blocks, const float* x, int64_t in, float* y,
                           int64_t out, int64_t nt) {
  for (int64_t t0 = 0; t0 < nt; t0 += kGroup)
    row_group<T, R, kGroup>(imin(kGroup, nt - t0), row, bbytes, blocks, x + t0 * in, in, y + t0 * out, out);
}

// Rows [0, out) of W times nt <= kMaxTokens tokens, in one pass over the weights.
template <TensorType T>
void gemv_tokens(const uint8_t* base, int64_t bbytes, int64_t blocks, const float* x, int64_t in, float* y,
                 int64_t out, int64_t nt) {
  const int64_t row_bytes = blocks * bbytes;
  if (!kExpandRows || nt == 1) {
#pragma omp parallel for schedule(static) if (out >= 64)
    for (int64_t o = 0; o < out; ++o)
      row_all_tokens<T, Row::Stored>(base + o * row_bytes, bbytes, blocks, x, in, y + o, out, nt);
    return;
  }
#pragma omp parallel if (out >= 64)
  {
    Scratch buf(static_cast<size_t>(blocks * kBlock) * sizeof(float));
    float* w = buf.as<float>();
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      const uint8_t* row = base + o * row_bytes;
      for (int64_t b = 0; b < blocks; ++b) {
        vf wv[kBlockVecs];
        load_block<T>(row + b * bbytes, wv);
        for (int i = 0; i < kBlockVecs; ++i) vstore(w + b * kBlock + i * kLanes, wv[i]);
      }
      row_all_tokens<T, Row::Expanded>(w, bbytes, blocks, x, in, y + o, out, nt);
    }
  }
}

#if BS_ISA_LEVEL == 1
// x rounded per block of 32: q[t][i] = round(x[t][i] / scale[t][b]), scale = max|x| / 32767;
// sum[t][b] = the block's exact fp32 sum (Q4_1's offset term).
struct Int16Activations {
  const int16_t* q;               // [nt, in]
  const float* scale;             // [nt, blocks]
  const float* sum;               // [nt, blocks]
  const float* scale_by_block;    // [blocks, kMaxTokens]: scale transposed, 0 past nt
};

void quantize_int16(const float* x, int64_t nt, int64_t in, int16_t* q, float* scale, float* sum) {
  const int64_t blocks = in / kBlock;
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + t * in + b * kBlock;
      float amax = 0.0f, s = 0.0f;
      for (int i = 0; i < kBlock; ++i) {
        amax = fmax2(amax, fabsf(xb[i]));
        s += xb[i];
      }
      const float sc = amax > 0.0f ? amax / 32767.0f : 1.0f;
      const float inv = 1.0f / sc;
      for (int i = 0; i < kBlock; ++i) q[t * in + b * kBlock + i] = static_cast<int16_t>(lrintf(xb[i] * inv));
      scale[t * blocks + b] = sc;
      sum[t * blocks + b] = s;
    }
}

// The block's 32 weights as int16 (Q4_0: q - 8; Q4_1: q, the offset m handled apart;
// Q8_0: q), elements 0..15 and 16..31.
template <TensorType T>
inline void load_block_int16(const uint8_t* blk, __m256i& w0, __m256i& w1) {
  if constexpr (T == TensorType::Q8_0) {
    w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (T == TensorType::Q4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    w0 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, mask));
    w1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), mask));
    if constexpr (T == TensorType::Q4_0) {
      w0 = _mm256_sub_epi16(w0, _mm256_set1_epi16(8));
      w1 = _mm256_sub_epi16(w1, _mm256_set1_epi16(8));
    }
  }
}

// NT tokens at once (a compile-time count: the accumulators stay in registers). The
// block scales come as fp32 arrays (block_scales), so a block costs no fp16
// conversion, and Q4_1's offset term sum_b m_b * sum(x_b) is one dot product per row.
//
// Several tokens: the products d_b * scale[t][b] of a row (the same fp32 products a
// single token computes) are made 8 tokens per multiply into a small buffer first,
// which takes a multiply per token and block off the busiest FP pipe.
template <TensorType T, int NT>
void gemv_int16_tokens(const uint8_t* base, const float* block_scales, int64_t bbytes, int64_t blocks,
                       Int16Activations xa, int64_t in, float* y, int64_t out) {
  const int64_t row_bytes = blocks * bbytes;
#pragma omp parallel if (out >= 64)
  {
    Scratch ds_buf(NT > 1 ? static_cast<size_t>(blocks * kMaxTokens) * sizeof(float) : 0);
    float* ds = ds_buf.as<float>();  // [blocks, kMaxTokens]: d_b * scale[t][b]
#pragma omp for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* row = base + o * row_bytes;
    const float* dr = block_scales + o * 2 * blocks;  // d of each block, then m
    if constexpr (NT > 1)
      for (int64_t b = 0; b < blocks; ++b)
        _mm256_store_ps(ds + b * kMaxTokens,
                        _mm256_mul_ps(_mm256_broadcast_ss(dr + b), _mm256_loadu_ps(xa.scale_by_block + b * kMaxTokens)));
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      __m256i w0, w1;
      load_block_int16<T>(row + b * bbytes, w0, w1);
      for (int t = 0; t < NT; ++t) {
        const int16_t* xq = xa.q + t * in + b * kBlock;
        const __m256i p = _mm256_add_epi32(
            _mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))),
            _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16))));
        const __m256 dsv = NT > 1 ? _mm256_broadcast_ss(ds + b * kMaxTokens + t)
                                  : _mm256_mul_ps(_mm256_broadcast_ss(dr + b), _mm256_broadcast_ss(xa.scale + b));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dsv, acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      float offset = 0.0f;
      if constexpr (T == TensorType::Q4_1) {
        const float* mr = dr + blocks;
        const float* xs = xa.sum + t * blocks;
        __m256 om = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + 8 <= blocks; b += 8) om = _mm256_fmadd_ps(_mm256_loadu_ps(mr + b), _mm256_loadu_ps(xs + b), om);
        offset = hsum(om);
        for (; b < blocks; ++b) offset += mr[b] * xs[b];
      }
      y[t * out + o] = hsum(acc[t]) + offset;
    }
  }
  }
}
#endif

template <TensorType T>
void gemv_typed(const void* w, const float* block_scales, const float* x, float* y, int64_t n, int64_t in,
                int64_t out) {
  const int64_t blocks = in / kBlock;
  const int64_t bbytes = T == TensorType::Q4_1 ? 20 : T == TensorType::Q4_0 ? 18 : T == TensorType::Q8_0 ? 34
                         : T == TensorType::F32 ? 128 : 64;
  const auto* base = static_cast<const uint8_t*>(w);
#if BS_ISA_LEVEL == 1
  if constexpr (T == TensorType::Q4_0 || T == TensorType::Q4_1) {
    if (block_scales) {
      Scratch q_buf(static_cast<size_t>(n * in) * sizeof(int16_t) + 64);
      Scratch f_buf(static_cast<size_t>(2 * n * blocks) * sizeof(float));
      int16_t* q = q_buf.as<int16_t>();
      float* scale = f_buf.as<float>();
      float* sum = scale + n * blocks;
      quantize_int16(x, n, in, q, scale, sum);
      Scratch t_buf(static_cast<size_t>(blocks * kMaxTokens) * sizeof(float));
      float* by_block = t_buf.as<float>();
      for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens) {
        const int64_t nt = imin(kMaxTokens, n - t0);
        for (int64_t b = 0; b < blocks; ++b)
          for (int64_t t = 0; t < kMaxTokens; ++t) by_block[b * kMaxTokens + t] = t < nt ? scale[(t0 + t) * blocks + b] : 0.0f;
        const Int16Activations xa{q + t0 * in, scale + t0 * blocks, sum + t0 * blocks, by_block};
        float* yt = y + t0 * out;
        switch (nt) {
          case 1: gemv_int16_tokens<T, 1>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
          case 2: gemv_int16_tokens<T, 2>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
          case 3: gemv_int16_tokens<T, 3>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
          case 4: gemv_int16_tokens<T, 4>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
          case 5: gemv_int16_tokens<T, 5>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
          case 6: gemv_int16_tokens<T, 6>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
          case 7: gemv_int16_tokens<T, 7>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
          default: gemv_int16_tokens<T, 8>(base, block_scales, bbytes, blocks, xa, in, yt, out); break;
        }
      }
      return;
    }
  }
#else
  (void)block_scales;  // only the AVX2 int16 path reads them
#endif
  for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens)
    gemv_tokens<T>(base, bbytes, blocks, x + t0 * in, in, y + t0 * out, out, imin(kMaxTokens, n - t0));
}

}  // namespace

void gemv_quantized(TensorType type, const void* w, const float* block_scales, const float* x, float* y, int64_t n,
                    int64_t in_features, int64_t out_features) {
  switch (type) {
    case TensorType::Q4_0: return gemv_typed<TensorType::Q4_0>(w, block_scales, x, y, n, in_features, out_features);
    case TensorType::Q4_1: return gemv_typed<TensorType::Q4_1>(w, block_scales, x, y, n, in_features, out_features);
    case TensorType::Q8_0: return gemv_typed<TensorType::Q8_0>(w, block_scales, x, y, n, in_features, out_features);
    case TensorType::F32: return gemv_typed<TensorType::F32>(w, block_scales, x, y, n, in_features, out_features);
    case TensorType::F16: return gemv_typed<TensorType::F16>(w, block_scales, x, y, n, in_features, out_features);
    case TensorType::BF16: return gemv_typed<TensorType::BF16>(w, block_scales, x, y, n, in_features, out_features);
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
