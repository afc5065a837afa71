#include "model/architecture.h"

#include <cstdlib>
#include <set>

namespace bs {
namespace {

using kernels::RopeStyle;

constexpr ArchFeatures kArchitectures[] = {
    // Llama 2 / 3 / 3.x (and SmolLM2, Mistral v0.3, which files call llama); biases
    // optional, as llama.cpp's llama graph takes them.
    {"llama", RopeStyle::Interleaved, true, false},
    {"mistral", RopeStyle::Interleaved, true, false},
    {"qwen2", RopeStyle::HalfSplit, true, false},
    {"qwen3", RopeStyle::HalfSplit, false, true},
    // Gemma 3 (text): GeGLU, pre and post norms, scaled embeddings, per-head q/k norms,
    // local and global layers (model/architecture.h).
    {"gemma3", RopeStyle::HalfSplit, false, true, FfnActivation::GeluTanh, true, true, true},
};

[[noreturn]] void refuse(const std::string& what) { throw gguf::GgufError(what); }

}  // namespace

const ArchFeatures* find_architecture(std::string_view name) {
  for (const auto& a : kArchitectures)
    if (name == a.name) return &a;
  return nullptr;
}

std::string supported_architectures() {
  std::string out;
  for (const auto& a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

void check_file_features(const gguf::GgufFile& file, const ArchFeatures& arch, int n_layers, int head_dim,
                         int64_t context_length) {
  const std::string a = arch.name;
  // Keys that change the math.
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (auto v = file.get_float(a + "." + key); v && *v != 0.0)
      refuse(a + "." + key + " = " + std::to_string(*v) + ": logit soft-capping is not supported");
  if (auto v = file.get_int(a + ".rope.dimension_count"); v && *v != head_dim)
    refuse(a + ".rope.dimension_count = " + std::to_string(*v) + " of head_dim " + std::to_string(head_dim) +
           ": partial rotary embeddings are not supported");
  if (auto v = file.get_int(a + ".attention.sliding_window"); !arch.local_global_layers && v && *v > 0 &&
                                                                 *v < context_length)
    refuse(a + ".attention.sliding_window = " + std::to_string(*v) + " (context " + std::to_string(context_length) +
           "): sliding-window attention is not supported for " + a);
  if (auto v = file.get_int(a + ".expert_count"); v && *v > 0)
    refuse(a + ".expert_count = " + std::to_string(*v) + ": mixture-of-experts models are not supported");
  if (auto v = file.get_int(a + ".attention.value_length"); v && *v != head_dim)
    refuse(a + ".attention.value_length = " + std::to_string(*v) + " differs from the key length " +
           std::to_string(head_dim) + ": not supported");

  // Tensors: every one must be one we read.
  std::set<std::string> block = {"attn_norm.weight", "ffn_norm.weight", "attn_q.weight",   "attn_k.weight",
                                 "attn_v.weight",    "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                                 "ffn_down.weight"};
  if (arch.qkv_bias) block.insert({"attn_q.bias", "attn_k.bias", "attn_v.bias"});
  if (arch.qk_norm) block.insert({"attn_q_norm.weight", "attn_k_norm.weight"});
  if (arch.post_norms) block.insert({"post_attention_norm.weight", "post_ffw_norm.weight"});
  const std::set<std::string> top = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"};
  for (const auto& t : file.tensors()) {
    const std::string& n = t.name;
    if (n.rfind("blk.", 0) == 0) {
      const size_t dot = n.find('.', 4);
      char* end = nullptr;
      const long layer = dot == std::string::npos ? -1 : std::strtol(n.c_str() + 4, &end, 10);
      const std::string rest = dot == std::string::npos ? "" : n.substr(dot + 1);
      if (layer < 0 || layer >= n_layers || end != n.c_str() + dot)
        refuse("tensor '" + n + "' is in no block of the model's " + std::to_string(n_layers));
      if (block.count(rest)) continue;
      if (rest.find("_exps") != std::string::npos || rest.rfind("ffn_gate_inp", 0) == 0 ||
          rest.find("_shexp") != std::string::npos)
        refuse("tensor '" + n + "': mixture-of-experts layers are not supported");
      refuse("tensor '" + n + "' is not part of a " + a + " block (an unknown tensor would change the math)");
    } else if (!top.count(n)) {
      refuse("tensor '" + n + "' is not part of a " + a + " model (an unknown tensor would change the math)");
    }
  }
  // The per-head norms and the post norms are required where the architecture has them
  // (their absence is another model, not a default).
  for (int l = 0; l < n_layers; ++l) {
    if (arch.qk_norm)
      for (const char* t : {"attn_q_norm.weight", "attn_k_norm.weight"})
        if (!file.find_tensor("blk." + std::to_string(l) + "." + t))
          refuse("missing tensor blk." + std::to_string(l) + "." + t + " (" + a + " normalizes q and k per head)");
    if (arch.post_norms)
      for (const char* t : {"post_attention_norm.weight", "post_ffw_norm.weight"})
        if (!file.find_tensor("blk." + std::to_string(l) + "." + t))
          refuse("missing tensor blk." + std::to_string(l) + "." + t + " (" + a +
                 " normalizes the attention's and the feed-forward's outputs)");
  }
}

}  // namespace bs
