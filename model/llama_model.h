// A Llama-family model (Llama, SmolLM2, Mistral, Qwen2, Qwen3, Gemma 3:
// model/architecture.h)
// loaded from GGUF: hyper-parameters, weights prepared on a backend, tokenizer and
// chat template.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/architecture.h"
#include "model/gguf.h"
#include "model/tensor_parallel.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace bs {

struct RopeScaling {
  std::string type = "none";  // none | linear | llama3 (frequency factors)
  float factor = 1.0f;
  // Llama-3 style frequency scaling parameters (used when type == "llama3" and the
  // file carries no precomputed rope_freqs tensor): the file's
  // rope.scaling.original_context_length where it has one. GGUF has no keys for the
  // two frequency factors (llama.cpp's converter writes rope_freqs instead), so these
  // are Llama 3.1's.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

struct LlamaConfig {
  std::string architecture;
  int n_layers = 0;
  int dim = 0;
  int ff = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  int context_length = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  kernels::RopeStyle rope_style = kernels::RopeStyle::Interleaved;
  RopeScaling rope_scaling;
  bool qk_norm = false;  // q and k RMS-normalized per head before RoPE (model/architecture.h)
  // Gemma 3's block (model/architecture.h: ArchFeatures).
  FfnActivation ffn_activation = FfnActivation::Silu;
  bool post_norms = false;   // post_attention_norm / post_ffw_norm before the residual adds
  bool embed_scale = false;  // embeddings times sqrt(dim)
  // Scores are q.k times this (1/sqrt(head_dim) unless the family says otherwise).
  float attn_scale = 0.0f;
  // Local (sliding-window) layers: local_layers[l] says layer l is one (empty: none);
  // they attend to the last sliding_window positions and rotate with rope_theta_local.
  int sliding_window = 0;
  std::vector<bool> local_layers;
  float rope_theta_local = 10000.0f;
  bool is_local(int layer) const { return !local_layers.empty() && local_layers[static_cast<size_t>(layer)]; }
  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

// inv_freq for a config, scaling applied. `freq_factors` (Llama-3 rope_freqs
// tensor, may be empty) divides each frequency's wavelength factor in.
kernels::RopeTable make_rope_table(const LlamaConfig& cfg, const std::vector<float>& freq_factors = {});

// Every weight prepared on the backend, in its memory.
struct LayerWeights {
  kernels::DeviceBuffer attn_norm;                    // [dim] fp32
  kernels::DeviceBuffer ffn_norm;                     // [dim] fp32
  kernels::DeviceBuffer qkv_bias;                     // [q_dim + 2 kv_dim] fp32, or none
  kernels::DeviceBuffer attn_q_norm, attn_k_norm;     // [head_dim] fp32 where config().qk_norm
  kernels::DeviceBuffer post_attn_norm, post_ffw_norm;// [dim] fp32 where config().post_norms
  std::unique_ptr<kernels::PreparedWeights> wqkv;     // [q_dim + 2 kv_dim, dim]
  std::unique_ptr<kernels::PreparedWeights> wo;       // [dim, q_dim]
  std::unique_ptr<kernels::PreparedWeights> w_gate_up;// [2 ff, dim]
  std::unique_ptr<kernels::PreparedWeights> w_down;   // [dim, ff]
};

// Bumped whenever the meaning of stored KV bytes changes (layout, RoPE convention).
inline constexpr uint32_t kKvLayoutVersion = 1;

class LlamaModel {
 public:
  // Loads and prepares all weights on `backend` (which must outlive the model).
  // kv_dtype: how its KV caches store K and V (F32, F16 or BF16; kernels/kv_view.h);
  // std::invalid_argument for another type.
  // shard: the rank's part of a tensor-parallel model (model/tensor_parallel.h): only
  // its heads, feed-forward rows and LM head rows are prepared. std::invalid_argument
  // naming the counts when the degree does not divide the model.
  LlamaModel(const std::string& gguf_path, kernels::Backend& backend, kernels::Precision precision,
             kernels::TensorType kv_dtype = kernels::TensorType::F32, TpShard shard = {});

  // The shapes this rank computes: its query / KV heads and feed-forward width (the
  // whole model's at tp 1). Its KV caches hold config().n_kv_heads heads.
  const LlamaConfig& config() const { return cfg_; }
  // The model's own shapes, whatever the rank holds (stored chunks hold every KV head).
  const LlamaConfig& full_config() const { return full_cfg_; }
  TpShard shard() const { return shard_; }
  // The first KV head of this rank in the model's numbering.
  int first_kv_head() const { return shard_.rank * cfg_.n_kv_heads; }
  // Rows of the LM head this rank computes: vocab / tp when tp divides the vocabulary
  // (the ranks' logits are gathered), else the whole vocabulary.
  int64_t output_rows() const { return output_rows_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The model's own chat template (model/chat_template.h), or the one given in its place.
  const ChatTemplate& chat_template() const { return chat_template_; }
  // Renders chats with `t` instead (model.chat_template, --chat-template): before the
  // model is shared, as nothing synchronizes it.
  void set_chat_template(ChatTemplate t) { chat_template_ = std::move(t); }
  kernels::Backend& backend() const { return *backend_; }
  kernels::Precision precision() const { return precision_; }
  kernels::TensorType kv_dtype() const { return kv_dtype_; }
  // The RoPE table as the backend prepared it; rope().table is its host description.
  // The global layers' (every layer's, but for a model with local layers).
  const kernels::PreparedRope& rope() const { return *rope_; }
  // Layer l's table: the local one on a local (sliding-window) layer.
  const kernels::PreparedRope& rope(int layer) const {
    return cfg_.is_local(layer) ? *rope_local_ : *rope_;
  }
  // Layer l's attention window (KvView::window): config().sliding_window on a local
  // layer, 0 (none) elsewhere.
  int64_t window(int layer) const { return cfg_.is_local(layer) ? cfg_.sliding_window : 0; }
  const LayerWeights& layer(int l) const { return layers_[l]; }
  const kernels::PreparedWeights& token_embedding() const { return *embedding_; }
  const float* output_norm() const { return output_norm_.as<float>(); }  // [dim], backend memory
  const kernels::PreparedWeights& output() const { return *output_; }
  // Identifies everything that changes computed KV bytes: all weight bytes, the
  // hyper-parameters (norm epsilon, RoPE base/style/scaling/inv_freq), kKvLayoutVersion,
  // the backend's kernel_id, the precision, the KV dtype and the tensor parallel
  // degree (llama_model.cpp lists them). Keys cached
  // KV, so KV is never served to a model or kernel that would compute other bytes.
  uint64_t fingerprint() const { return fingerprint_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gguf::GgufFile file_;
  LlamaConfig cfg_;       // this rank's
  LlamaConfig full_cfg_;  // the model's
  kernels::Backend* backend_;
  kernels::Precision precision_;
  kernels::TensorType kv_dtype_;
  TpShard shard_;
  int64_t output_rows_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate chat_template_;
  std::unique_ptr<kernels::PreparedRope> rope_;
  std::unique_ptr<kernels::PreparedRope> rope_local_;  // local layers' table, where there are any
  std::vector<LayerWeights> layers_;
  std::vector<std::vector<uint8_t>> column_storage_;  // this rank's columns of row-split matrices (tp > 1)
  kernels::WeightView embed_view_;
  std::unique_ptr<kernels::PreparedWeights> embedding_;
  kernels::DeviceBuffer output_norm_;
  std::unique_ptr<kernels::PreparedWeights> output_;
  uint64_t fingerprint_ = 0;
};

}  // namespace bs
