// The one table of tensor types: every type a weight or a file tensor can have, with
// ggml's numbering (so a GGUF type id is a TensorType value), its block geometry and
// its dequantizer. The GGUF reader, the backends and the dequantizers all read this
// table; nothing else numbers types.
#pragma once

#include <cstdint>

namespace bs::kernels {

enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14,  // super-blocks of 256 (kernels/kquant_blocks.h)
  BF16 = 30
};

struct TensorTypeTraits {
  TensorType type;
  const char* name;        // "Q4_1"
  int64_t block_elements;  // elements per block (1 for plain types, 32, or 256 for K-quants)
  int64_t block_bytes;     // bytes per block
  // dst[0..n) = the n elements at src as fp32, bit-exact to ggml's reference;
  // n is a multiple of block_elements.
  void (*to_f32)(const void* src, float* dst, int64_t n);
};

// The entry of a supported type; nullptr for any other ggml type number.
const TensorTypeTraits* find_tensor_type(uint32_t ggml_type);
// The entry of a TensorType (every enumerator has one).
const TensorTypeTraits& type_traits(TensorType type);
// A name for any ggml type number, supported or not ("Q4_K", "Q4_2 (removed)"), or
// nullptr when ggml never had it: for error messages.
const char* ggml_type_name(uint32_t ggml_type);
// Bytes of n elements of `type`; n must be a multiple of its block size.
inline int64_t type_row_bytes(TensorType type, int64_t n) {
  const TensorTypeTraits& t = type_traits(type);
  return n / t.block_elements * t.block_bytes;
}

}  // namespace bs::kernels
