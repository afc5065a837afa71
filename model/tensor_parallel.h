// Tensor parallelism (Megatron-LM's split of a Llama layer) for one model over
// `size` ranks. Each rank holds:
//   - its query heads [rank * heads/size, ...) and KV heads [rank * kv_heads/size, ...)
//     of the fused QKV projection (rows; a head's rows are contiguous), and its
//     columns of the output projection, so attention needs no communication: each
//     rank's query heads read only its own KV heads (GQA groups never straddle ranks
//     because both counts are divided by the same size);
//   - its rows [rank * ff/size, ...) of the gate and up projections and its columns of
//     the down projection, so SwiGLU is rank-local;
//   - the norms and the embedding table whole (replicated);
//   - the rows [rank * vocab/size, ...) of the LM head when size divides the vocabulary
//     (the logits are gathered), else the whole head.
// The output and down projections then produce partial sums that every rank adds
// in rank order (Communicator::all_reduce_sum: bit-identical on every rank), so every
// rank carries the same hidden state from layer to layer. A rank's KV cache holds
// only its KV heads.
#pragma once

#include <string>

namespace bs {

struct LlamaConfig;

// Which shard of the model a rank holds. {0, 1}: the whole model.
struct TpShard {
  int rank = 0;
  int size = 1;
};

// Throws std::invalid_argument naming the counts when `size` ranks cannot split the
// model (size < 1, or it does not divide the query heads, the KV heads or the
// feed-forward width). SmolLM2-135M (9 query / 3 KV heads): tp 1 or 3.
void check_tensor_parallel(const LlamaConfig& full, int size);

// The shapes one rank computes: heads, KV heads and feed-forward width divided by
// shard.size; everything else as `full`. Checks as check_tensor_parallel, and the
// rank against the size.
LlamaConfig shard_config(const LlamaConfig& full, TpShard shard);

}  // namespace bs
