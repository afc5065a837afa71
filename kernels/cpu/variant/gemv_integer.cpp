// The decode-size products with activations rounded to integers per block of 32, weights
// as stored integers (kernels/cpu/variant/gemv_blocks.h unpacks them):
// - gemv_int8 (DecodeActivations::Int8, every block type): activations rounded to int8
//   (scale max|x| / 127, as llama.cpp's Q8_0 activations), one vpmaddubsw and one
//   vpmaddwd per block's 32 products per token;
// - gemv_int16 (the default product of Q4_0, Q4_1, Q5_0, Q5_1: gemv_quantized.cpp says
//   why): activations rounded to int16 (scale max|x| / 32767), weights widened to int16,
//   two vpmaddwd.
// Each block's integer dot product is exact; 8 of them (8 rows of one token, or one row
// of up to 8 tokens) are finished together into one vector, scaled and accumulated
// there, in the same steps either way, so a row is bit-identical alone or batched. An
// offset (Q4_0's -8, Q5_0's -16) comes off the exact integer sum, a minimum (Q4_1, Q5_1,
// the K-quants' mins) multiplies the block's fp32 sum, Q6_K's two 16-element scales go
// into the vpmaddwd. 256-bit integer ops on AVX-512 too. The scalar forms:
// kernels/activation_quant.h. The scalar variant has neither (it runs the fp32 product).
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/gemv_blocks.h"
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {
#if BS_ISA_LEVEL >= 1
namespace {

// The integer products' activations (AVX2 integer and 256-bit float ops, which every
// variant from AVX2 up executes). Lane sums as the AVX2 variant's hsum and hmax.
inline float hsum256(__m256 v) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
inline float hmax256(__m256 v) {
  const __m128 b = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}

// A block of 32 activations into v[4]; returns max |x| over the block.
inline float load_block_amax(const float* xb, __m256* v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
  return hmax256(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                               _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]))));
}

// The fp32 sum of a block loaded by load_block_amax (the offset term of the types that add).
inline float block_sum(const __m256* v) {
  return hsum256(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
}

// Every block of 32 of nt tokens' activations x [nt, in]: emit(t, b, v, scale, inv) with
// its values in v[4], scale = max|x| / qmax (1 for a block of zeros) and inv = 1 / scale.
template <class Emit>
inline void for_each_scaled_block(const float* x, int64_t nt, int64_t in, float qmax, Emit emit) {
  const int64_t blocks = in / kBlock;
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      __m256 v[4];
      const float amax = load_block_amax(x + t * in + b * kBlock, v);
      const float sc = amax > 0.0f ? amax / qmax : 1.0f;
      emit(t, b, v, sc, _mm256_set1_ps(1.0f / sc));
    }
}

// x rounded to A (int8_t or int16_t) per block of 32, as kernels/activation_quant.h's
// scalar reference (int8: llama.cpp's Q8_0 activations): q = round(x / scale), scale =
// max|x| / qmax (127 or 32767), so |q| <= qmax; qsum[t][b] = the block's sum of q (what
// a weight offset such as Q4_0's -8 takes off the integer dot product); sum[t][b] = the
// block's fp32 sum (what a weight minimum multiplies).
template <class A>
void quantize_blocks(const float* x, int64_t nt, int64_t in, A* q, float* scale, int32_t* qsum, float* sum) {
  constexpr bool kInt8 = sizeof(A) == 1;  // int8_t (else int16_t)
  const int64_t blocks = in / kBlock;
  for_each_scaled_block(x, nt, in, kInt8 ? 127.0f : 32767.0f, [&](int64_t t, int64_t b, const __m256* v, float sc,
                                                                   __m256 inv) {
    __m256i i32[4];
    for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // nearest even
    A* qb = q + t * in + b * kBlock;
    const __m256i q01 = _mm256_packs_epi32(i32[0], i32[1]), q23 = _mm256_packs_epi32(i32[2], i32[3]);
    if constexpr (kInt8) {
      const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleave
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb),
                          _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), order));
    } else {  // one pack: 64-bit quarters (0, 2, 1, 3) put the elements in order
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), _mm256_permute4x64_epi64(q01, 0xD8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 16), _mm256_permute4x64_epi64(q23, 0xD8));
    }
    const __m256i isum = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), isum);
    int32_t total = 0;
    for (int i = 0; i < 8; ++i) total += lanes[i];
    scale[t * blocks + b] = sc;
    qsum[t * blocks + b] = total;
    sum[t * blocks + b] = block_sum(v);
  });
}

// Lane i of the result = the sum of p[i]'s 8 lanes. Integers: exact, so the order of
// the additions does not matter.
inline __m256i reduce8_epi32(const __m256i* p) {
  __m256i a[4];
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
  const __m256i b03 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[0], a[1]), _mm256_unpackhi_epi64(a[0], a[1]));
  const __m256i b47 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2], a[3]), _mm256_unpackhi_epi64(a[2], a[3]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(b03, b47, 0x20), _mm256_permute2x128_si256(b03, b47, 0x31));
}

// A group of up to kMaxTokens tokens' per-block activation values, transposed for the
// kernels with tokens in the lanes: token t's value of block b at [b * kMaxTokens + t],
// 0 past the group. `bias` (int8 path) multiplies the blocks' sums of q.
struct TokenBlocks {
  Scratch buf;
  float* scale;
  float* sum;
  int32_t* bias_qsum;
  explicit TokenBlocks(int64_t blocks)
      : buf(static_cast<size_t>(3 * blocks * kMaxTokens) * sizeof(float)), scale(buf.as<float>()),
        sum(scale + blocks * kMaxTokens), bias_qsum(reinterpret_cast<int32_t*>(sum + blocks * kMaxTokens)) {}
  // From the [token][block] arrays of all tokens (qsum may be null), tokens t0 .. t0 + nt.
  void fill(const float* all_scale, const float* all_sum, const int32_t* all_qsum, int32_t bias, int64_t blocks,
            int64_t t0, int64_t nt) {
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t t = 0; t < kMaxTokens; ++t) {
        const bool in = t < nt;
        const int64_t at = (t0 + t) * blocks + b;
        scale[b * kMaxTokens + t] = in ? all_scale[at] : 0.0f;
        sum[b * kMaxTokens + t] = in ? all_sum[at] : 0.0f;
        bias_qsum[b * kMaxTokens + t] = in && all_qsum ? bias * all_qsum[at] : 0;
      }
  }
};

// ---- The integer products: int8 activations (gemv_int8, every block type) and int16
// activations (the default product of the 4/5-bit types, kInt16Product) ----
// Block b of a row as the integer products multiply it: 32 stored integers w as bytes in
// element order, and what turns their integer sum with a block of rounded activations
// into the product:
//   product = factor * scale[t][b] * (isum - bias * qsum[t][b]) + add * sum[t][b]
// isum = sum_e w[e] * q[t][e] (Q6_K: each half's sum times its int8 scale), exact in
// int32 (int16 activations: |w| <= 31, so |isum| <= 32 * 31 * 32767 < 2^25). Q4_0 and Q5_0 store their values offset by +8 and +16 (bias), which comes off
// the exact integer sum; Q8_0 and Q6_K hold signed values (kernels/activation_quant.h
// has the scalar form of every type: reference_gemv_rounded_activations).
template <TensorType T>
constexpr bool kIntSigned = T == TensorType::Q8_0 || T == TensorType::Q6_K;
template <TensorType T>
constexpr int kIntBias = T == TensorType::Q4_0 ? 8 : T == TensorType::Q5_0 ? 16 : 0;
template <TensorType T>
constexpr bool kIntAdds = T == TensorType::Q4_1 || T == TensorType::Q5_1 || T == TensorType::Q4_K ||
                          T == TensorType::Q5_K;

struct Int8Block {
  __m256i w;       // unsigned (<= 31) or, where kIntSigned, signed (|w| <= 128) bytes
  __m256i scales;  // Q6_K: the int16 multipliers of vpmaddwd (lanes 0-7 the first half's scale)
  float factor;
  float add;
};

template <TensorType T>
inline void load_int8_block(const uint8_t* row, int64_t b, Int8Block& k) {
  if constexpr (kSuperBlock<T>) {
    const uint8_t* super = row + (b >> 3) * kTypeBytes<T>;
    const int s = static_cast<int>(b & 7);
    k.w = k_quants<T>(super, s);
    if constexpr (T == TensorType::Q6_K) {
      const auto* sc = reinterpret_cast<const int8_t*>(super + 192);
      const int n = s / 4, j = s % 4;
      k.scales = _mm256_set_m128i(_mm_set1_epi16(sc[8 * n + 2 * j + 1]), _mm_set1_epi16(sc[8 * n + 2 * j]));
      k.factor = half_to_float(super + 208);
      k.add = 0.0f;
    } else {
      const KSubBlockScales sc = k_scales<T>(super, s);
      k.factor = sc.scale[0];
      k.add = -sc.offset;
    }
  } else {
    const uint8_t* blk = row + b * kTypeBytes<T>;
    k.factor = half_to_float(blk);
    k.add = 0.0f;
    if constexpr (T == TensorType::Q8_0) {
      k.w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    } else if constexpr (T == TensorType::Q5_0) {
      k.w = q5_quants(blk + 2, blk + 6);
    } else if constexpr (T == TensorType::Q5_1) {
      k.w = q5_quants(blk + 4, blk + 8);
      k.add = half_to_float(blk + 2);
    } else {  // Q4_0, Q4_1
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (T == TensorType::Q4_1 ? 4 : 2)));
      k.w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
      if constexpr (T == TensorType::Q4_1) k.add = half_to_float(blk + 2);
    }
  }
}

// The block's integer sum with 32 activations rounded to A, as 8 partial sums.
// int8: vpmaddubsw multiplies unsigned by signed bytes: signed weights go in as |w| with
// the activations' signs flipped where w < 0 (llama.cpp's trick). No pair saturates:
// |pair| <= 2 * 128 * 127 < 32768. int16 (kInt16Product types: unsigned w <= 31): the
// weights widened to int16, two vpmaddwd.
template <TensorType T, class A>
inline __m256i block_dot(const Int8Block& k, const A* xq) {
  if constexpr (sizeof(A) == 2) {
    static_assert(kInt16Product<T>, "int16 activations multiply unsigned <= 5-bit weights");
    const __m256i w0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(k.w));
    const __m256i w1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(k.w, 1));
    return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))),
                            _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16))));
  } else {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
    __m256i pairs;
    if constexpr (kIntSigned<T>) pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(k.w), _mm256_sign_epi8(x, k.w));
    else pairs = _mm256_maddubs_epi16(k.w, x);
    if constexpr (T == TensorType::Q6_K) return _mm256_madd_epi16(pairs, k.scales);
    else return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
}

// One token, 8 rows per lane group: lane r of main and off is row r's. The products of a
// (row, token) pair take the same steps here and in int_tokens (factor * scale, one
// FMA per block; add * sum, one FMA per block; main + off), so a row is bit-identical
// alone or batched (Transformer::decode_step relies on it).
template <TensorType T, class A>
void int_rows(const uint8_t* base, int64_t row_bytes, int64_t blocks, const A* xq, const float* scale,
               const int32_t* qsum, const float* sum, float* y, int64_t out) {
  const int64_t groups = (out + 7) / 8;
#pragma omp parallel for schedule(static) if (out >= 64)
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = base + imin(g * 8 + r, out - 1) * row_bytes;
    const uint8_t* next = base + (g + 1) * 8 * row_bytes;  // the next group, prefetched a block's share at a time
    const int64_t share = 8 * row_bytes / blocks;
    __m256 main = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t at = b * share; at < (b + 1) * share; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T0);
      __m256i p[8];
      alignas(32) float factor[8], add[8];
      for (int r = 0; r < 8; ++r) {
        Int8Block k;
        load_int8_block<T>(rows[r], b, k);
        p[r] = block_dot<T>(k, xq + b * kBlock);
        factor[r] = k.factor;
        add[r] = k.add;
      }
      __m256i isum = reduce8_epi32(p);
      if constexpr (kIntBias<T> != 0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(kIntBias<T> * qsum[b]));
      const __m256 fs = _mm256_mul_ps(_mm256_load_ps(factor), _mm256_broadcast_ss(scale + b));
      main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), fs, main);
      if constexpr (kIntAdds<T>) off = _mm256_fmadd_ps(_mm256_load_ps(add), _mm256_broadcast_ss(sum + b), off);
    }
    alignas(32) float res[8];
    _mm256_store_ps(res, _mm256_add_ps(main, off));
    for (int64_t r = 0; r < 8 && g * 8 + r < out; ++r) y[g * 8 + r] = res[r];
  }
}

// One row per lane group, NT (2..8) tokens in the lanes. By block b: scale, sum and
// bias * qsum of token t at [b * 8 + t] (0 past NT).
template <TensorType T, class A, int NT>
void int_tokens(const uint8_t* base, int64_t row_bytes, int64_t blocks, const A* xq, int64_t in,
                 const float* scale_by_block, const float* sum_by_block, const int32_t* bias_by_block, float* y,
                 int64_t out) {
#pragma omp parallel for schedule(static) if (out >= 64)
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* row = base + o * row_bytes;
    const uint8_t* next = row + 4 * row_bytes;  // prefetched a block's share at a time
    __m256 main = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + b * row_bytes / blocks), _MM_HINT_T0);
      Int8Block k;
      load_int8_block<T>(row, b, k);
      __m256i p[8];
      for (int t = 0; t < 8; ++t) p[t] = t < NT ? block_dot<T>(k, xq + t * in + b * kBlock) : _mm256_setzero_si256();
      __m256i isum = reduce8_epi32(p);
      if constexpr (kIntBias<T> != 0)
        isum = _mm256_sub_epi32(isum, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias_by_block + b * 8)));
      const __m256 fs = _mm256_mul_ps(_mm256_set1_ps(k.factor), _mm256_loadu_ps(scale_by_block + b * 8));
      main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), fs, main);
      if constexpr (kIntAdds<T>) off = _mm256_fmadd_ps(_mm256_set1_ps(k.add), _mm256_loadu_ps(sum_by_block + b * 8), off);
    }
    alignas(32) float res[8];
    _mm256_store_ps(res, _mm256_add_ps(main, off));
    for (int t = 0; t < NT; ++t) y[t * out + o] = res[t];
  }
}

// The product with activations rounded to A (int8_t: gemv_int8; int16_t: the default of
// the kInt16Product types) per block of 32.
template <TensorType T, class A>
void gemv_int_typed(const uint8_t* base, const float* x, float* y, int64_t n, int64_t in, int64_t out) {
  const int64_t blocks = in / kBlock;
  const int64_t row_bytes = in / kTypeElements<T> * kTypeBytes<T>;
  Scratch q_buf(static_cast<size_t>(n * in) * sizeof(A) + 64);
  Scratch f_buf(static_cast<size_t>(3 * n * blocks) * sizeof(float));
  A* q = q_buf.as<A>();
  float* scale = f_buf.as<float>();
  float* sum = scale + n * blocks;
  int32_t* qsum = reinterpret_cast<int32_t*>(sum + n * blocks);
  quantize_blocks(x, n, in, q, scale, qsum, sum);
  TokenBlocks by_block(blocks);
  float* scale_by_block = by_block.scale;
  float* sum_by_block = by_block.sum;
  int32_t* bias_by_block = by_block.bias_qsum;
  for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens) {
    const int64_t nt = imin(kMaxTokens, n - t0);
    float* yt = y + t0 * out;
    const A* qt = q + t0 * in;
    if (nt == 1) {
      int_rows<T>(base, row_bytes, blocks, qt, scale + t0 * blocks, qsum + t0 * blocks, sum + t0 * blocks, yt, out);
      continue;
    }
    by_block.fill(scale, sum, qsum, kIntBias<T>, blocks, t0, nt);
    switch (nt) {
#define BS_INT_TOKENS(N)                                                                                        \
  case N:                                                                                                       \
    int_tokens<T, A, N>(base, row_bytes, blocks, qt, in, scale_by_block, sum_by_block, bias_by_block, yt, out); \
    break;
      BS_INT_TOKENS(2) BS_INT_TOKENS(3) BS_INT_TOKENS(4) BS_INT_TOKENS(5) BS_INT_TOKENS(6) BS_INT_TOKENS(7)
#undef BS_INT_TOKENS
      default: int_tokens<T, A, 8>(base, row_bytes, blocks, qt, in, scale_by_block, sum_by_block, bias_by_block, yt, out);
    }
  }
}

}  // namespace

void gemv_int16(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
                int64_t out_features) {
  const auto* base = static_cast<const uint8_t*>(w);
  switch (type) {
    case TensorType::Q4_0: return gemv_int_typed<TensorType::Q4_0, int16_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q4_1: return gemv_int_typed<TensorType::Q4_1, int16_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_0: return gemv_int_typed<TensorType::Q5_0, int16_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_1: return gemv_int_typed<TensorType::Q5_1, int16_t>(base, x, y, n, in_features, out_features);
    default: return gemv_quantized(type, w, x, y, n, in_features, out_features);  // not a kInt16Product type
  }
}

void gemv_int8(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
               int64_t out_features) {
  const auto* base = static_cast<const uint8_t*>(w);
  switch (type) {
    case TensorType::Q4_0: return gemv_int_typed<TensorType::Q4_0, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q4_1: return gemv_int_typed<TensorType::Q4_1, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_0: return gemv_int_typed<TensorType::Q5_0, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_1: return gemv_int_typed<TensorType::Q5_1, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q8_0: return gemv_int_typed<TensorType::Q8_0, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q4_K: return gemv_int_typed<TensorType::Q4_K, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_K: return gemv_int_typed<TensorType::Q5_K, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q6_K: return gemv_int_typed<TensorType::Q6_K, int8_t>(base, x, y, n, in_features, out_features);
    default: return gemv_quantized(type, w, x, y, n, in_features, out_features);  // F32, F16, BF16
  }
}
#endif

}  // namespace bs::kernels::cpu::BS_ISA_NS
