#include "model/llama_model.h"

#include <malloc.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <optional>
#include <stdexcept>

#include "kernels/dequant.h"
#include "kernels/kv_view.h"
#include "kernels/tensor_types.h"
#include "model/architecture.h"
#include "model/hf_checkpoint.h"
#include "model/random_model.h"

namespace bs {
namespace {

using gguf::GgufError;

kernels::WeightView view_of(const gguf::TensorInfo& t) {
  if (t.dims.size() != 2) throw GgufError("tensor '" + t.name + "' must be 2-D");
  return kernels::WeightView{t.type, t.data, t.dims[1], t.dims[0]};
}

std::vector<float> load_vector(const gguf::TensorInfo& t, int64_t expected) {
  if (t.n_elements() != expected)
    throw GgufError("tensor '" + t.name + "' has " + std::to_string(t.n_elements()) + " elements, expected " +
                    std::to_string(expected));
  std::vector<float> out(static_cast<size_t>(expected));
  kernels::dequantize_row(t.type, t.data, out.data(), expected);
  return out;
}

void check_shape(const gguf::TensorInfo& t, int64_t out_features, int64_t in_features) {
  if (t.dims.size() != 2 || t.dims[0] != in_features || t.dims[1] != out_features)
    throw GgufError("tensor '" + t.name + "' has an unexpected shape");
}

// Gemma 3's local and global layers (model/architecture.h: local_global_layers), its
// attention scale, as llama.cpp reads them.
void read_local_global_layers(const gguf::GgufFile& file, const std::string& arch, LlamaConfig& cfg) {
  const int64_t window = file.get_int(arch + ".attention.sliding_window").value_or(0);
  if (window < 0 || window > (int64_t{1} << 30))
    throw GgufError(arch + ".attention.sliding_window = " + std::to_string(window) + " is not valid");
  if (window > 0) {  // no window: every layer global (llama.cpp's LLAMA_SWA_TYPE_NONE)
    cfg.sliding_window = static_cast<int>(window);
    cfg.local_layers.assign(static_cast<size_t>(cfg.n_layers), false);
    const std::string key = arch + ".attention.sliding_window_pattern";
    const auto it = file.metadata().find(key);
    if (it != file.metadata().end() && std::holds_alternative<std::vector<bool>>(it->second)) {
      const auto& per_layer = std::get<std::vector<bool>>(it->second);
      if (per_layer.size() != static_cast<size_t>(cfg.n_layers))
        throw GgufError(key + " has " + std::to_string(per_layer.size()) + " entries for " +
                        std::to_string(cfg.n_layers) + " layers");
      for (int l = 0; l < cfg.n_layers; ++l) cfg.local_layers[static_cast<size_t>(l)] = per_layer[static_cast<size_t>(l)];
    } else {
      const int64_t period = file.get_int(key).value_or(6);
      if (period < 0 || period > (int64_t{1} << 20))
        throw GgufError(key + " = " + std::to_string(period) + " is not valid");
      for (int l = 0; l < cfg.n_layers; ++l)
        cfg.local_layers[static_cast<size_t>(l)] = period == 0 || l % period < period - 1;
    }
    cfg.rope_theta_local = static_cast<float>(file.get_float(arch + ".rope.freq_base_swa").value_or(10000.0));
    if (!(cfg.rope_theta_local > 0.0f)) throw GgufError(arch + ".rope.freq_base_swa must be positive");
  }
  if (auto scalar = file.get_float("blendserve.query_pre_attn_scalar")) {
    if (!(*scalar > 0.0)) throw GgufError("query_pre_attn_scalar must be positive");
    cfg.attn_scale = static_cast<float>(1.0 / std::sqrt(*scalar));
  } else if (cfg.n_layers == 62) {  // Gemma 3 27B: query_pre_attn_scalar = dim / heads
    cfg.attn_scale = 1.0f / std::sqrt(static_cast<float>(cfg.dim / cfg.n_heads));
  }
}

}  // namespace

kernels::RopeTable make_rope_table(const LlamaConfig& cfg, const std::vector<float>& freq_factors) {
  kernels::RopeTable table;
  table.style = cfg.rope_style;
  table.head_dim = cfg.head_dim;
  const int half = cfg.head_dim / 2;
  table.inv_freq.resize(half);
  const auto& sc = cfg.rope_scaling;
  for (int i = 0; i < half; ++i) {
    double f = std::pow(static_cast<double>(cfg.rope_theta), -2.0 * i / cfg.head_dim);
    if (!freq_factors.empty()) {
      f /= freq_factors[i];
    } else if (sc.type == "linear") {
      f /= sc.factor;
    } else if (sc.type == "llama3") {
      // Llama-3.1 rule: long wavelengths are slowed by `factor`, short ones kept,
      // the band in between interpolated smoothly.
      const double low_wavelen = sc.original_context / sc.low_freq_factor;
      const double high_wavelen = sc.original_context / sc.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= sc.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (sc.original_context / wavelen - sc.low_freq_factor) /
                              (sc.high_freq_factor - sc.low_freq_factor);
        f = (1.0 - smooth) * f / sc.factor + smooth * f;
      }
    }
    table.inv_freq[i] = static_cast<float>(f);
  }
  return table;
}

LlamaModel::LlamaModel(const std::string& gguf_path, kernels::Backend& backend, kernels::Precision precision,
                       kernels::TensorType kv_dtype, TpShard shard)
    : path_(gguf_path),
      file_(open_model_file(materialize_model_path(gguf_path))),  // GGUF, a checkpoint, "random:NAME"
      backend_(&backend),
      precision_(precision),
      kv_dtype_(kv_dtype),
      shard_(shard) {
  if (!kernels::is_kv_dtype(kv_dtype))
    throw std::invalid_argument(std::string("KV dtype ") + kernels::type_traits(kv_dtype).name +
                                " is not one of f32, f16, bf16");
  if (!backend.supports(precision))
    throw std::invalid_argument(std::string("precision ") + kernels::precision_name(precision) +
                                " is not supported by " + backend.kernel_id());
  const auto arch = file_.get_string("general.architecture");
  if (!arch) throw GgufError("gguf: missing general.architecture");
  cfg_.architecture = *arch;
  const ArchFeatures* features = find_architecture(*arch);
  if (!features)
    throw GgufError("unsupported architecture '" + *arch + "' in general.architecture (supported: " +
                    supported_architectures() + ")");
  auto req_int = [&](const std::string& key) {
    auto v = file_.get_int(*arch + "." + key);
    if (!v) throw GgufError("gguf: missing " + *arch + "." + key);
    return *v;
  };
  cfg_.n_layers = static_cast<int>(req_int("block_count"));
  cfg_.dim = static_cast<int>(req_int("embedding_length"));
  cfg_.ff = static_cast<int>(req_int("feed_forward_length"));
  cfg_.n_heads = static_cast<int>(req_int("attention.head_count"));
  cfg_.n_kv_heads = static_cast<int>(file_.get_int(*arch + ".attention.head_count_kv").value_or(cfg_.n_heads));
  cfg_.context_length = static_cast<int>(file_.get_int(*arch + ".context_length").value_or(4096));
  cfg_.rms_eps = static_cast<float>(file_.get_float(*arch + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  cfg_.rope_theta = static_cast<float>(file_.get_float(*arch + ".rope.freq_base").value_or(10000.0));
  if (cfg_.n_layers <= 0 || cfg_.n_layers > 512 || cfg_.dim <= 0 || cfg_.n_heads <= 0 || cfg_.n_kv_heads <= 0 ||
      cfg_.dim % cfg_.n_heads != 0 || cfg_.n_heads % cfg_.n_kv_heads != 0 || cfg_.ff <= 0)
    throw GgufError("gguf: inconsistent model hyper-parameters");
  cfg_.head_dim = static_cast<int>(file_.get_int(*arch + ".attention.key_length").value_or(cfg_.dim / cfg_.n_heads));
  // A checkpoint's q/k rows are in transformers' half-split order for every family
  // (model/hf_checkpoint.h); a GGUF file's in the family's convention.
  cfg_.rope_style = file_.get_bool("blendserve.hf_checkpoint").value_or(false) ? kernels::RopeStyle::HalfSplit
                                                                               : features->rope_style;
  cfg_.qk_norm = features->qk_norm;
  cfg_.ffn_activation = features->ffn_activation;
  cfg_.post_norms = features->post_norms;
  cfg_.embed_scale = features->embed_scale;
  check_file_features(file_, *features, cfg_.n_layers, cfg_.head_dim, cfg_.context_length);
  cfg_.attn_scale = 1.0f / std::sqrt(static_cast<float>(cfg_.head_dim));
  if (features->local_global_layers) read_local_global_layers(file_, *arch, cfg_);
  if ((features->local_global_layers || features->ffn_activation != FfnActivation::Silu || features->embed_scale) &&
      !backend.sliding_window_attention())
    throw GgufError("architecture '" + *arch + "' (sliding-window layers, GeGLU, scaled embeddings) is not implemented on the " +
                    backend.name() + " backend");
  if (auto st = file_.get_string(*arch + ".rope.scaling.type")) {
    cfg_.rope_scaling.type = *st == "yarn" ? "yarn" : *st;
    cfg_.rope_scaling.factor = static_cast<float>(file_.get_float(*arch + ".rope.scaling.factor").value_or(1.0));
    // The file's own pre-scaling context (Llama 3.1 and 3.2 say 8192; another model
    // another), not a built-in one.
    if (auto oc = file_.get_int(*arch + ".rope.scaling.original_context_length")) {
      if (*oc <= 0 || *oc > (int64_t{1} << 30))
        throw GgufError(*arch + ".rope.scaling.original_context_length = " + std::to_string(*oc) + " is not valid");
      cfg_.rope_scaling.original_context = static_cast<int>(*oc);
    }
    if (*st == "yarn")
      throw GgufError(*arch + ".rope.scaling.type 'yarn' (YaRN RoPE scaling) is not supported (supported: none, "
                      "linear, llama3)");
    // Any other scaling we do not implement would load with plain RoPE: wrong
    // attention at every position, silently. Refuse it by name instead.
    if (*st != "none" && *st != "linear" && *st != "llama3")
      throw GgufError(*arch + ".rope.scaling.type '" + *st +
                      "' is not supported (supported: none, linear, llama3)");
  }

  const auto& embd = file_.tensor("token_embd.weight");
  embed_view_ = view_of(embd);
  if (embed_view_.in_features != cfg_.dim) throw GgufError("token_embd.weight has the wrong width");
  cfg_.vocab = static_cast<int>(embed_view_.out_features);
  full_cfg_ = cfg_;
  cfg_ = shard_config(full_cfg_, shard_);  // throws, naming the counts, for a degree that does not fit

  std::vector<float> freq_factors;
  if (const auto* rf = file_.find_tensor("rope_freqs.weight")) {
    freq_factors = load_vector(*rf, cfg_.head_dim / 2);
    cfg_.rope_scaling.type = "llama3";
  }
  const kernels::RopeTable rope_table = make_rope_table(cfg_, freq_factors);
  rope_ = backend.prepare_rope(rope_table);
  kernels::RopeTable local_table;
  if (!cfg_.local_layers.empty()) {  // the local layers: their own base, no scaling
    LlamaConfig local = cfg_;
    local.rope_theta = cfg_.rope_theta_local;
    local.rope_scaling = RopeScaling{};
    local_table = make_rope_table(local);
    rope_local_ = backend.prepare_rope(local_table);
  }

  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file_));
  chat_template_ = ChatTemplate::from_gguf(file_, *tokenizer_);
  // The tokenizer holds the vocabulary now; the file's parsed copy of it goes.
  for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.merges"})
    file_.drop_metadata(key);

  // This rank's rows [first, first + rows) of a matrix: rows are contiguous, so a
  // view into the file.
  auto rows_of = [&](const gguf::TensorInfo& t, int64_t first, int64_t rows) {
    const auto v = view_of(t);
    const int64_t row_bytes = kernels::type_row_bytes(v.type, v.in_features);
    return kernels::WeightView{v.type, static_cast<const uint8_t*>(v.data) + first * row_bytes, rows, v.in_features};
  };
  // This rank's columns [first, first + cols) of every row (the row-split output and
  // down projections): the stored blocks when the range holds whole blocks, else
  // dequantized to F32.
  auto columns_of = [&](const gguf::TensorInfo& t, int64_t first, int64_t cols) {
    const auto v = view_of(t);
    if (first == 0 && cols == v.in_features) return v;
    const int64_t block = kernels::type_traits(v.type).block_elements;
    const int64_t row_bytes = kernels::type_row_bytes(v.type, v.in_features);
    const auto* src = static_cast<const uint8_t*>(v.data);
    if (first % block == 0 && cols % block == 0) {
      const int64_t skip = kernels::type_row_bytes(v.type, first), bytes = kernels::type_row_bytes(v.type, cols);
      auto& buf = column_storage_.emplace_back(static_cast<size_t>(v.out_features * bytes));
      for (int64_t r = 0; r < v.out_features; ++r)
        std::memcpy(buf.data() + r * bytes, src + r * row_bytes + skip, static_cast<size_t>(bytes));
      return kernels::WeightView{v.type, buf.data(), v.out_features, cols};
    }
    auto& buf = column_storage_.emplace_back(static_cast<size_t>(v.out_features * cols * 4));
    auto* dst = reinterpret_cast<float*>(buf.data());
    std::vector<float> row(static_cast<size_t>(v.in_features));
    for (int64_t r = 0; r < v.out_features; ++r) {
      kernels::dequantize_row(v.type, src + r * row_bytes, row.data(), v.in_features);
      std::memcpy(dst + r * cols, row.data() + first, static_cast<size_t>(cols) * sizeof(float));
    }
    return kernels::WeightView{kernels::TensorType::F32, buf.data(), v.out_features, cols};
  };
  auto upload_vector = [&](const std::vector<float>& v) {
    return backend.upload(v.data(), static_cast<int64_t>(v.size() * sizeof(float)));
  };
  layers_.resize(cfg_.n_layers);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto& L = layers_[l];
    L.attn_norm = upload_vector(load_vector(file_.tensor(p + "attn_norm.weight"), cfg_.dim));
    L.ffn_norm = upload_vector(load_vector(file_.tensor(p + "ffn_norm.weight"), cfg_.dim));
    if (cfg_.qk_norm) {  // [head_dim], shared by every head: the same on every rank
      L.attn_q_norm = upload_vector(load_vector(file_.tensor(p + "attn_q_norm.weight"), cfg_.head_dim));
      L.attn_k_norm = upload_vector(load_vector(file_.tensor(p + "attn_k_norm.weight"), cfg_.head_dim));
    }
    if (cfg_.post_norms) {  // [dim]: the whole residual width on every rank
      L.post_attn_norm = upload_vector(load_vector(file_.tensor(p + "post_attention_norm.weight"), cfg_.dim));
      L.post_ffw_norm = upload_vector(load_vector(file_.tensor(p + "post_ffw_norm.weight"), cfg_.dim));
    }
    const auto& q = file_.tensor(p + "attn_q.weight");
    const auto& k = file_.tensor(p + "attn_k.weight");
    const auto& v = file_.tensor(p + "attn_v.weight");
    check_shape(q, full_cfg_.q_dim(), cfg_.dim);
    check_shape(k, full_cfg_.kv_dim(), cfg_.dim);
    check_shape(v, full_cfg_.kv_dim(), cfg_.dim);
    // This rank's heads: query rows [r * q_dim, ...) and KV rows [r * kv_dim, ...) of
    // the shard config (whole matrices at tp 1).
    const int64_t q0 = int64_t{shard_.rank} * cfg_.q_dim(), kv0 = int64_t{shard_.rank} * cfg_.kv_dim();
    // One product for the query, key and value rows (Backend::prepare_fused: the CPU
    // reads them in place).
    L.wqkv = backend.prepare_fused(
        {rows_of(q, q0, cfg_.q_dim()), rows_of(k, kv0, cfg_.kv_dim()), rows_of(v, kv0, cfg_.kv_dim())}, precision);
    if (const auto* qb = file_.find_tensor(p + "attn_q.bias")) {
      auto qbias = load_vector(*qb, full_cfg_.q_dim());
      auto kb = load_vector(file_.tensor(p + "attn_k.bias"), full_cfg_.kv_dim());
      auto vb = load_vector(file_.tensor(p + "attn_v.bias"), full_cfg_.kv_dim());
      std::vector<float> bias(qbias.begin() + q0, qbias.begin() + q0 + cfg_.q_dim());
      bias.insert(bias.end(), kb.begin() + kv0, kb.begin() + kv0 + cfg_.kv_dim());
      bias.insert(bias.end(), vb.begin() + kv0, vb.begin() + kv0 + cfg_.kv_dim());
      L.qkv_bias = upload_vector(bias);
    }
    const auto& o = file_.tensor(p + "attn_output.weight");
    check_shape(o, cfg_.dim, full_cfg_.q_dim());
    L.wo = backend.prepare(columns_of(o, q0, cfg_.q_dim()), precision);
    const auto& g = file_.tensor(p + "ffn_gate.weight");
    const auto& u = file_.tensor(p + "ffn_up.weight");
    check_shape(g, full_cfg_.ff, cfg_.dim);
    check_shape(u, full_cfg_.ff, cfg_.dim);
    const int64_t f0 = int64_t{shard_.rank} * cfg_.ff;
    L.w_gate_up = backend.prepare_fused({rows_of(g, f0, cfg_.ff), rows_of(u, f0, cfg_.ff)}, precision);
    const auto& d = file_.tensor(p + "ffn_down.weight");
    check_shape(d, cfg_.dim, full_cfg_.ff);
    L.w_down = backend.prepare(columns_of(d, f0, cfg_.ff), precision);
  }
  output_norm_ = upload_vector(load_vector(file_.tensor("output_norm.weight"), cfg_.dim));
  embedding_ = backend.prepare_embedding(embed_view_);
  const auto* out = file_.find_tensor("output.weight");
  auto out_view = out ? view_of(*out) : embed_view_;  // tied embeddings
  if (out_view.in_features != cfg_.dim) throw GgufError("output.weight has the wrong width");
  if (out_view.out_features != cfg_.vocab) throw GgufError("output.weight has the wrong height");
  // The LM head by vocabulary rows across ranks when they divide it (logits gathered),
  // else whole on every rank.
  if (shard_.size > 1 && cfg_.vocab % shard_.size == 0) {
    output_rows_ = cfg_.vocab / shard_.size;
    const int64_t row_bytes = kernels::type_row_bytes(out_view.type, out_view.in_features);
    out_view.data = static_cast<const uint8_t*>(out_view.data) + int64_t{shard_.rank} * output_rows_ * row_bytes;
    out_view.out_features = output_rows_;
  } else {
    output_rows_ = cfg_.vocab;
  }
  output_ = backend.prepare(out_view, precision);

  // Fingerprint: everything that changes the bytes of computed KV. Every tensor's name,
  // type, shape and *all* its bytes (XXH3 runs at several GB/s: ~10 ms for this model),
  // the hyper-parameters that shape the computation (norm epsilon, RoPE base, style,
  // scaling and the final inv_freq table), the KV layout version, and the kernels and
  // precision that compute. Two models that differ in any of them never share a key.
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add = [&](const void* p, size_t n) { XXH3_64bits_update(st, p, n); };
  auto add_str = [&](const std::string& v) {
    const uint64_t n = v.size();
    add(&n, sizeof n);
    add(v.data(), v.size());
  };
  add(&kKvLayoutVersion, sizeof kKvLayoutVersion);
  add_str(cfg_.architecture);
  const LlamaConfig& fc = full_cfg_;  // the model's shapes: every rank's key is the same
  const int32_t dims[] = {fc.n_layers, fc.dim, fc.ff, fc.n_heads, fc.n_kv_heads, fc.head_dim, fc.vocab,
                          static_cast<int32_t>(fc.rope_style), fc.rope_scaling.original_context};
  add(dims, sizeof dims);
  if (fc.qk_norm) add_str("qk_norm");  // (models without it: keys as before)
  if (fc.ffn_activation != FfnActivation::Silu) add_str("gelu_tanh");
  if (fc.post_norms) add_str("post_norms");
  if (fc.embed_scale) add_str("embed_scale");
  if (fc.attn_scale != 1.0f / std::sqrt(static_cast<float>(fc.head_dim))) add(&fc.attn_scale, sizeof fc.attn_scale);
  if (!fc.local_layers.empty()) {  // which layers are local, their window and RoPE
    add_str("local_layers");
    for (bool b : fc.local_layers) add(&b, 1);
    add(&fc.sliding_window, sizeof fc.sliding_window);
    add(local_table.inv_freq.data(), local_table.inv_freq.size() * sizeof(float));
  }
  const float params[] = {cfg_.rms_eps, cfg_.rope_theta, cfg_.rope_scaling.factor, cfg_.rope_scaling.low_freq_factor,
                          cfg_.rope_scaling.high_freq_factor};
  add(params, sizeof params);
  add_str(cfg_.rope_scaling.type);
  add(rope_table.inv_freq.data(), rope_table.inv_freq.size() * sizeof(float));
  for (const auto& t : file_.tensors()) {
    add_str(t.name);
    add(&t.type, sizeof(t.type));
    add(t.dims.data(), t.dims.size() * sizeof(int64_t));
    add(t.data, t.nbytes);
  }
  // The kernels, precision and KV dtype that compute and store KV are part of it too:
  // KV computed by one kernel variant, at one precision or stored as one dtype is
  // never served as another's. (F32 adds nothing: keys of fp32 KV are as before.)
  add_str(backend.kernel_id() + "/" + kernels::precision_name(precision));
  if (kv_dtype != kernels::TensorType::F32) add_str(std::string("kv:") + kernels::type_traits(kv_dtype).name);
  // So is the tensor parallel degree: the row-split projections' partial sums are added
  // in another order, so KV computed at tp 3 differs in its last bits from tp 1's
  // (model/README.md, "Tensor parallelism: the split"). Not the rank: the ranks' shards
  // make one chunk. (tp 1 adds nothing: keys as before.)
  if (shard_.size > 1) add_str("tp:" + std::to_string(shard_.size));
  fingerprint_ = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  // Loading parsed and copied the vocabulary several times over (the file's arrays, the
  // tokenizer's spec) and freed all but one compact copy: give those pages back, or
  // they stay in the process's resident set for its whole life.
  malloc_trim(0);
}

}  // namespace bs
