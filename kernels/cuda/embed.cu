#include "kernels/cuda/embed.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

// blockIdx.y: the token; threads stride over its dim elements.
template <TensorType T>
__global__ void embed_rows(const uint8_t* __restrict__ table, const int32_t* __restrict__ ids, float* __restrict__ out,
                           int64_t dim, int64_t row_bytes, int64_t vocab) {
  const int64_t t = blockIdx.y;
  const int64_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;  // an id out of range reads nothing: a NaN row
  const uint8_t* row = table + (valid ? id : 0) * row_bytes;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < dim;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v;
    if (!valid) {
      v = __int_as_float(0x7fc00000);
    } else if constexpr (T == TensorType::F32) {
      v = reinterpret_cast<const float*>(row)[c];
    } else if constexpr (T == TensorType::F16) {
      v = op_math::half_bits_to_float(op_math::load_u16_le(row + 2 * c));
    } else if constexpr (T == TensorType::BF16) {
      v = op_math::bf16_bits_to_float(op_math::load_u16_le(row + 2 * c));
    } else if constexpr (T == TensorType::Q8_0) {
      v = op_math::q8_0_element(row + (c / 32) * 34, static_cast<int>(c % 32));
    } else if constexpr (T == TensorType::Q4_0) {
      v = op_math::q4_0_element(row + (c / 32) * 18, static_cast<int>(c % 32));
    } else {
      v = op_math::q4_1_element(row + (c / 32) * 20, static_cast<int>(c % 32));
    }
    out[t * dim + c] = v;
  }
}

template <TensorType T>
void launch(const void* table, const int32_t* ids, float* out, int64_t n, int64_t dim, int64_t row_bytes,
            int64_t vocab, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const unsigned blocks_x = static_cast<unsigned>((dim + kThreads - 1) / kThreads);
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {  // gridDim.y is at most 65535
    const int64_t rows = n - t0 < 65535 ? n - t0 : 65535;
    embed_rows<T><<<dim3(blocks_x, static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(table), ids + t0, out + t0 * dim, dim, row_bytes, vocab);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void embed(TensorType type, const void* table, const int32_t* ids, float* out, int64_t n, int64_t dim, int64_t vocab,
           cudaStream_t stream) {
  const bool blocks = type == TensorType::Q8_0 || type == TensorType::Q4_0 || type == TensorType::Q4_1;
  if (blocks && dim % 32 != 0)
    throw std::invalid_argument("cuda embed: dim " + std::to_string(dim) + " is not a multiple of 32");
  if (n <= 0 || dim <= 0) return;
  switch (type) {
    case TensorType::F32: return launch<TensorType::F32>(table, ids, out, n, dim, dim * 4, vocab, stream);
    case TensorType::F16: return launch<TensorType::F16>(table, ids, out, n, dim, dim * 2, vocab, stream);
    case TensorType::BF16: return launch<TensorType::BF16>(table, ids, out, n, dim, dim * 2, vocab, stream);
    case TensorType::Q8_0: return launch<TensorType::Q8_0>(table, ids, out, n, dim, dim / 32 * 34, vocab, stream);
    case TensorType::Q4_0: return launch<TensorType::Q4_0>(table, ids, out, n, dim, dim / 32 * 18, vocab, stream);
    case TensorType::Q4_1: return launch<TensorType::Q4_1>(table, ids, out, n, dim, dim / 32 * 20, vocab, stream);
    default: break;  // the other types reach the device as bf16 (CudaBackend::decodable_view)
  }
  throw std::invalid_argument("cuda embed: no device decoder for tensor type " +
                              std::to_string(static_cast<int>(type)));
}

}  // namespace bs::kernels::cuda
