#include "model/llama_model.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <optional>
#include <stdexcept>

#include "kernels/dequant.h"
#include "kernels/kv_view.h"

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
                       kernels::TensorType kv_dtype)
    : path_(gguf_path),
      file_(gguf::GgufFile::open(gguf_path)),
      backend_(&backend),
      precision_(precision),
      kv_dtype_(kv_dtype) {
  if (!kernels::is_kv_dtype(kv_dtype))
    throw std::invalid_argument(std::string("KV dtype ") + kernels::type_traits(kv_dtype).name +
                                " is not one of f32, f16, bf16");
  if (!backend.supports(precision))
    throw std::invalid_argument(std::string("precision ") + kernels::precision_name(precision) +
                                " is not supported by " + backend.kernel_id());
  const auto arch = file_.get_string("general.architecture");
  if (!arch) throw GgufError("gguf: missing general.architecture");
  cfg_.architecture = *arch;
  if (*arch != "llama" && *arch != "qwen2" && *arch != "mistral")
    throw GgufError("unsupported architecture '" + *arch +
                    "' in general.architecture (supported: llama, qwen2, mistral)");
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
  cfg_.rope_style = *arch == "qwen2" ? kernels::RopeStyle::HalfSplit : kernels::RopeStyle::Interleaved;
  if (auto st = file_.get_string(*arch + ".rope.scaling.type")) {
    cfg_.rope_scaling.type = *st == "yarn" ? "yarn" : *st;
    cfg_.rope_scaling.factor = static_cast<float>(file_.get_float(*arch + ".rope.scaling.factor").value_or(1.0));
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

  std::vector<float> freq_factors;
  if (const auto* rf = file_.find_tensor("rope_freqs.weight")) {
    freq_factors = load_vector(*rf, cfg_.head_dim / 2);
    cfg_.rope_scaling.type = "llama3";
  }
  const kernels::RopeTable rope_table = make_rope_table(cfg_, freq_factors);
  rope_ = backend.prepare_rope(rope_table);

  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file_));
  chat_template_ = ChatTemplate::from_gguf(file_);

  // Fused weights: rows of several matrices with the same input and type are
  // concatenated so one product computes them all.
  auto fuse = [&](std::initializer_list<const gguf::TensorInfo*> parts) {
    const auto type = parts.begin()[0]->type;
    int64_t rows = 0;
    size_t bytes = 0;
    for (auto* p : parts) {
      if (p->type != type) return std::optional<kernels::WeightView>{};
      rows += p->dims[1];
      bytes += p->nbytes;
    }
    auto& buf = fused_storage_.emplace_back(bytes);
    size_t off = 0;
    for (auto* p : parts) {
      std::memcpy(buf.data() + off, p->data, p->nbytes);
      off += p->nbytes;
    }
    return std::optional<kernels::WeightView>(
        kernels::WeightView{type, buf.data(), rows, parts.begin()[0]->dims[0]});
  };
  auto convert_f32 = [&](std::initializer_list<const gguf::TensorInfo*> parts) {
    // Mixed types cannot be concatenated raw: dequantize each to F32 rows instead.
    int64_t rows = 0;
    const int64_t in = parts.begin()[0]->dims[0];
    for (auto* p : parts) rows += p->dims[1];
    auto& buf = fused_storage_.emplace_back(static_cast<size_t>(rows * in * 4));
    auto* dst = reinterpret_cast<float*>(buf.data());
    for (auto* p : parts) {
      const int64_t row_bytes = p->nbytes / p->dims[1];
      for (int64_t r = 0; r < p->dims[1]; ++r, dst += in) kernels::dequantize_row(p->type, p->data + r * row_bytes, dst, in);
    }
    return kernels::WeightView{kernels::TensorType::F32, buf.data(), rows, in};
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
    const auto& q = file_.tensor(p + "attn_q.weight");
    const auto& k = file_.tensor(p + "attn_k.weight");
    const auto& v = file_.tensor(p + "attn_v.weight");
    check_shape(q, cfg_.q_dim(), cfg_.dim);
    check_shape(k, cfg_.kv_dim(), cfg_.dim);
    check_shape(v, cfg_.kv_dim(), cfg_.dim);
    auto qkv = fuse({&q, &k, &v});
    L.wqkv = backend.prepare(qkv ? *qkv : convert_f32({&q, &k, &v}), precision);
    if (const auto* qb = file_.find_tensor(p + "attn_q.bias")) {
      auto bias = load_vector(*qb, cfg_.q_dim());
      auto kb = load_vector(file_.tensor(p + "attn_k.bias"), cfg_.kv_dim());
      auto vb = load_vector(file_.tensor(p + "attn_v.bias"), cfg_.kv_dim());
      bias.insert(bias.end(), kb.begin(), kb.end());
      bias.insert(bias.end(), vb.begin(), vb.end());
      L.qkv_bias = upload_vector(bias);
    }
    const auto& o = file_.tensor(p + "attn_output.weight");
    check_shape(o, cfg_.dim, cfg_.q_dim());
    L.wo = backend.prepare(view_of(o), precision);
    const auto& g = file_.tensor(p + "ffn_gate.weight");
    const auto& u = file_.tensor(p + "ffn_up.weight");
    check_shape(g, cfg_.ff, cfg_.dim);
    check_shape(u, cfg_.ff, cfg_.dim);
    auto gu = fuse({&g, &u});
    L.w_gate_up = backend.prepare(gu ? *gu : convert_f32({&g, &u}), precision);
    const auto& d = file_.tensor(p + "ffn_down.weight");
    check_shape(d, cfg_.dim, cfg_.ff);
    L.w_down = backend.prepare(view_of(d), precision);
  }
  output_norm_ = upload_vector(load_vector(file_.tensor("output_norm.weight"), cfg_.dim));
  embedding_ = backend.prepare_embedding(embed_view_);
  const auto* out = file_.find_tensor("output.weight");
  auto out_view = out ? view_of(*out) : embed_view_;  // tied embeddings
  if (out_view.in_features != cfg_.dim) throw GgufError("output.weight has the wrong width");
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
  const int32_t dims[] = {cfg_.n_layers, cfg_.dim, cfg_.ff, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.vocab,
                          static_cast<int32_t>(cfg_.rope_style), cfg_.rope_scaling.original_context};
  add(dims, sizeof dims);
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
  fingerprint_ = XXH3_64bits_digest(st);
  XXH3_freeState(st);
}

}  // namespace bs
