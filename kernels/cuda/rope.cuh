// Rotary position embedding on the device, from per-token (cos, sin) rows the backend
// computes on the host in double (as the CPU backend's RoPE cache does) and uploads:
// so any position works (negative ones too: delta-RoPE of a moved chunk), frequency
// scaling (Llama 3) is in the table's inverse frequencies, and the device only rotates
// (kernels/op_math.h: rotate_pair), fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

void rope(float* x,              // device [n, heads, head_dim], rotated in place
          const float* cos_sin,  // device [n, head_dim / 2, 2]: (cos, sin) of token t's angle per pair
          int64_t n, int64_t heads, int64_t head_dim,
          bool interleaved,      // pairs (2i, 2i+1) (ggml NORM, Llama) or (i, i + head_dim/2) (NEOX)
          cudaStream_t stream);

// The same rotation at positions held on the device (the model's: uploaded once per
// forward): each (cos, sin) computed there in double from pos * inv_freq and rounded to
// fp32, the CPU backend's RoPE cache arithmetic, so both rotate by the same fp32 values
// (up to a rare last-bit difference of the two libraries' double cos/sin).
void rope_at_positions(float* x,               // device [n, heads, head_dim], rotated in place
                       const int32_t* pos,     // device [n], any position (negative: delta-RoPE)
                       const float* inv_freq,  // device [head_dim / 2], scaling applied
                       int64_t n, int64_t heads, int64_t head_dim, bool interleaved, cudaStream_t stream);

}  // namespace bs::kernels::cuda
