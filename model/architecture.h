// The architectures we compute, and what each one's block does beyond the plain
// Llama block, in one table. The loader (model/llama_model.cpp) reads a file's
// general.architecture here, checks its tensors and keys against the entry, and sets
// the config flags the transformer (model/transformer.cpp) reads; nothing else names
// an architecture. Whatever a file asks for that no entry describes is refused at load
// by name (check_file_features), never ignored.
#pragma once

#include <string>
#include <string_view>

#include "kernels/backend.h"
#include "model/gguf.h"

namespace bs {

struct ArchFeatures {
  const char* name;               // general.architecture
  kernels::RopeStyle rope_style;  // GGUF's convention for the family (llama.cpp's)
  bool qkv_bias;                  // attn_q/k/v.bias may be present (all three or none)
  bool qk_norm;                   // attn_q_norm / attn_k_norm [head_dim]: per-head RMSNorm of
                                  // q and k before RoPE, required (Qwen3)
};

// The entry of `name`, or nullptr for an architecture we do not compute.
const ArchFeatures* find_architecture(std::string_view name);
// "llama, mistral, qwen2, qwen3": for error messages.
std::string supported_architectures();

// Refuses (gguf::GgufError naming the key or tensor) what the file asks for and
// `arch` does not compute: a tensor no entry names (inside a block or outside: MoE
// experts, unknown norms, ...), logit soft-capping, partial rotary, a sliding window
// shorter than the context, mixture-of-experts keys, value heads of another width
// than the keys. head_dim and context_length are the file's (the config's).
void check_file_features(const gguf::GgufFile& file, const ArchFeatures& arch, int n_layers, int head_dim,
                         int64_t context_length);

}  // namespace bs
