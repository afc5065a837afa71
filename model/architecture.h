// The architectures we compute, and what each one's block does beyond the plain
// Llama block, in one table. The loader (model/llama_model.cpp) reads a file's
// general.architecture here, checks its tensors and keys against the entry, and sets
// the config flags the transformer (model/transformer.cpp) reads; nothing else names
// an architecture. Whatever a file asks for that no entry describes is refused at load
// by name (check_file_features), never ignored.
//
// Gemma 3's norm weights are stored as (1 + w) in GGUF (llama.cpp's converter adds the
// one); a checkpoint's are w, and the checkpoint reader adds it (model/hf_checkpoint.h).
#pragma once

#include <string>
#include <string_view>

#include "kernels/backend.h"
#include "model/gguf.h"

namespace bs {

// The feed-forward's gate activation: silu (SwiGLU) or GELU's tanh approximation (GeGLU).
enum class FfnActivation { Silu, GeluTanh };

struct ArchFeatures {
  const char* name;               // general.architecture
  kernels::RopeStyle rope_style;  // GGUF's convention for the family (llama.cpp's)
  bool qkv_bias;                  // attn_q/k/v.bias may be present (all three or none)
  bool qk_norm;                   // attn_q_norm / attn_k_norm [head_dim]: per-head RMSNorm of
                                  // q and k before RoPE, required (Qwen3, Gemma 3)
  FfnActivation ffn_activation = FfnActivation::Silu;
  // Gemma 3: post_attention_norm and post_ffw_norm [dim], RMSNorm of the attention's and
  // the feed-forward's outputs before each is added to the residual stream (required).
  bool post_norms = false;
  // Gemma 3: the token embeddings scaled by sqrt(dim) before the first layer (the tied
  // LM head reads the table unscaled).
  bool embed_scale = false;
  // Gemma 3: interleaved local (sliding-window) and global layers.
  // attention.sliding_window is the local layers' window; which layers are local comes
  // from attention.sliding_window_pattern (a period P: layer l is global iff
  // l % P == P - 1; or one bool per layer, true = local), default 6 as llama.cpp's;
  // local layers rotate with rope.freq_base_swa (default 10000) and no scaling, global
  // ones with rope.freq_base and the file's scaling. The attention scale is
  // 1/sqrt(head_dim), or 1/sqrt(dim / heads) for a 62-layer model (Gemma 3 27B's
  // query_pre_attn_scalar), as llama.cpp sets it; a checkpoint states its own
  // (blendserve.query_pre_attn_scalar).
  bool local_global_layers = false;
};

// The entry of `name`, or nullptr for an architecture we do not compute.
const ArchFeatures* find_architecture(std::string_view name);
// "llama, mistral, qwen2, qwen3, gemma3": for error messages.
std::string supported_architectures();

// Refuses (gguf::GgufError naming the key or tensor) what the file asks for and
// `arch` does not compute: a tensor no entry names (inside a block or outside: MoE
// experts, unknown norms, ...), logit soft-capping, partial rotary, a sliding window
// shorter than the context where the family has no local layers, mixture-of-experts
// keys, value heads of another width than the keys. head_dim and context_length are the
// file's (the config's).
void check_file_features(const gguf::GgufFile& file, const ArchFeatures& arch, int n_layers, int head_dim,
                         int64_t context_length);

}  // namespace bs
