// Sampling on the device: one token per row of logits, picked exactly as the host
// picks (kernels/sampling.h: pick_token) from the same logits and the same uniform draw,
// so only n ids come back to the host instead of n * vocab logits.
//
// Greedy rows: a block-wide argmax (first index of the largest). Sampled rows: every
// row sorted by logit, descending, by CUB's segmented radix sort — stable, so equal
// logits keep lower indices first, the host's order — then one block per row takes the
// first K = min(top_k or vocab, 1024): the K exponentials in double in parallel, the
// sums, the top_p cut and the draw's place in the partial sums in order on one thread,
// the host's arithmetic step by step. Two caveats, both stated where the device and the
// host may differ: the device's double exp may differ from glibc's in the last bit
// (the token differs only if the draw falls within that of a boundary), and a row with
// NaN logits is ordered differently (the model's output is broken then anyway).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_resources.h"
#include "kernels/sampling.h"

namespace bs::kernels::cuda {

// What sample_rows keeps between calls (grown as needed).
struct SampleScratch {
  DeviceAllocation rows;     // [n] SampleRow
  DeviceAllocation tokens;   // [n] int32
  DeviceAllocation sorted;   // [n, vocab] fp32: the logits, descending per row
  DeviceAllocation order;    // [n, vocab] int32: their indices
  DeviceAllocation iota;     // [n, vocab] int32: 0..vocab-1 per row
  DeviceAllocation offsets;  // [n + 1] int32: row starts
  DeviceAllocation temp;     // CUB's temporary storage
  int64_t iota_rows = 0, iota_vocab = 0;  // what iota and offsets hold
};

// tokens_out is pinned host memory (cudaHostAlloc) the ids are copied into on
// `stream`: they are there once the caller waited for the stream (the backend's
// bounded wait; the call itself does not wait). n * vocab < 2^31.
void sample_rows(const float* logits,     // device [n, vocab]
                 int64_t n, int64_t vocab,
                 const SampleRow* rows,   // host [n]
                 int32_t* tokens_out,     // pinned host [n]
                 SampleScratch& scratch, cudaStream_t stream);

}  // namespace bs::kernels::cuda
