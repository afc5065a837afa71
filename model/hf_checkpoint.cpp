#include "model/hf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/dequant.h"
#include "model/safetensors.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using gguf::GgufError;
using gguf::MetaValue;
using gguf::TensorInfo;
using nlohmann::json;

[[noreturn]] void refuse(const fs::path& file, const std::string& msg) {
  throw GgufError(msg + " [" + file.string() + "]");
}

json read_json(const fs::path& p, bool required) {
  std::ifstream in(p);
  if (!in) {
    if (required) refuse(p, "cannot read");
    return json();
  }
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    refuse(p, std::string("not JSON: ") + e.what());
  }
}

// The checkpoint's tensor name in GGUF's naming, or the name itself when it has none
// (the loader then refuses it by that name). Gemma's block names its norms apart: its
// post_attention_layernorm is a post norm, pre_feedforward_layernorm the FFN's input.
std::string gguf_name(const std::string& hf, bool gemma) {
  static const std::map<std::string, std::string> top = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  if (auto it = top.find(hf); it != top.end()) return it->second;
  static const std::map<std::string, std::string> block = {
      {"input_layernorm.weight", "attn_norm.weight"},     {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},        {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},        {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},            {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},            {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},   {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},             {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  static const std::map<std::string, std::string> gemma_norms = {
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
  };
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return hf;
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return hf;
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return hf;
  const std::string rest = hf.substr(dot + 1);
  if (gemma)
    if (auto g = gemma_norms.find(rest); g != gemma_norms.end()) return "blk." + layer + "." + g->second;
  auto it = block.find(rest);
  return it == block.end() ? hf : "blk." + layer + "." + it->second;
}

// The GGUF pre-tokenizer name of a tokenizer.json's pre_tokenizer (llama.cpp's names,
// model/tokenizer.cpp's kinds), recognized by its exact structure.
std::string pre_tokenizer_name(const json& pre, const fs::path& file) {
  const std::string llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string qwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  auto byte_level = [](const json& p, bool regex) {
    return p.is_object() && p.value("type", "") == "ByteLevel" && p.value("use_regex", true) == regex &&
           !p.value("add_prefix_space", false);
  };
  if (byte_level(pre, true)) return "gpt2";
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2) {
    const json& a = pre["pretokenizers"][0];
    const json& b = pre["pretokenizers"][1];
    if (a.value("type", "") == "Digits" && a.value("individual_digits", false) && byte_level(b, true))
      return "smollm";
    if (a.value("type", "") == "Split" && a.contains("pattern") && a["pattern"].is_object() &&
        a["pattern"].contains("Regex") && a["pattern"]["Regex"].is_string() && byte_level(b, false)) {
      const std::string re = a["pattern"]["Regex"];
      if (re == llama3) return "llama-bpe";
      if (re == qwen2) return "qwen2";
    }
  }
  refuse(file, "tokenizer.json: pre_tokenizer " + pre.dump().substr(0, 200) +
                   " is not one we implement (byte-level BPE as GPT-2, SmolLM, Llama 3 or Qwen2 split it)");
}

// A SentencePiece BPE's normalizer and pre-tokenizer, as Hugging Face's converters
// write them, into how the space prefix is put (TokenizerSpec): spaces become U+2581
// either by a Replace normalizer (with Prepend("▁") before it: llama.cpp's
// add_space_prefix, Llama 2's legacy layout, Phi-3) or by a Metaspace pre-tokenizer
// (prepend_scheme first / always / never, without split: Llama 2 and Mistral in
// transformers' current layout); Gemma's Split(" ") after the Replace finds no space
// left and does nothing. Anything else is refused by its JSON.
void read_spm_layout(const json& tok, const fs::path& tj, std::unordered_map<std::string, MetaValue>& meta) {
  const json norm = tok.contains("normalizer") ? tok["normalizer"] : json();
  const json pre = tok.contains("pre_tokenizer") ? tok["pre_tokenizer"] : json();
  auto is_replace_space = [](const json& n) {
    return n.is_object() && n.value("type", "") == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
           n["pattern"].value("String", "") == " " && n.value("content", "") == "\u2581";
  };
  auto is_prepend = [](const json& n) {
    return n.is_object() && n.value("type", "") == "Prepend" && n.value("prepend", "") == "\u2581";
  };
  bool replace = false, prepend = false;
  if (norm.is_null()) {
  } else if (is_replace_space(norm)) {
    replace = true;
  } else if (norm.is_object() && norm.value("type", "") == "Sequence" && norm.contains("normalizers") &&
             norm["normalizers"].is_array() && norm["normalizers"].size() == 2 && is_prepend(norm["normalizers"][0]) &&
             is_replace_space(norm["normalizers"][1])) {
    replace = prepend = true;
  } else {
    refuse(tj, "tokenizer.json: normalizer " + norm.dump().substr(0, 200) +
                   " is not one we implement for a SentencePiece BPE (Replace(\" \", \"\u2581\"), after a "
                   "Prepend(\"\u2581\") or not)");
  }
  bool first_only = false, unless_space = false;
  if (pre.is_null()) {
  } else if (pre.is_object() && pre.value("type", "") == "Metaspace" && !replace &&
             pre.value("replacement", "") == "\u2581" && !pre.value("split", true)) {
    const std::string scheme = pre.value("prepend_scheme", "always");
    if (scheme != "first" && scheme != "always" && scheme != "never")
      refuse(tj, "tokenizer.json: Metaspace prepend_scheme '" + scheme + "' is not supported");
    replace = true;
    prepend = scheme != "never";
    first_only = scheme == "first";
    unless_space = true;  // Metaspace adds no space before one
  } else if (pre.is_object() && pre.value("type", "") == "Split" && replace && pre.contains("pattern") &&
             pre["pattern"].is_object() && pre["pattern"].value("String", "") == " " && !pre.value("invert", false)) {
    // Splits at spaces the Replace normalizer has already turned into U+2581: nothing.
  } else {
    refuse(tj, "tokenizer.json: pre_tokenizer " + pre.dump().substr(0, 200) +
                   " is not one we implement for a SentencePiece BPE (Metaspace without split, or none)");
  }
  if (!replace)
    refuse(tj, "tokenizer.json: a SentencePiece BPE whose spaces nothing turns into \u2581 is not supported");
  meta["tokenizer.ggml.add_space_prefix"] = prepend;
  meta["blendserve.tokenizer.spm_merge_by_rank"] = true;
  meta["blendserve.tokenizer.space_prefix_first_only"] = first_only;
  meta["blendserve.tokenizer.space_prefix_unless_space"] = unless_space;
  if (tok["model"].value("ignore_merges", false))
    refuse(tj, "tokenizer.json: ignore_merges in a SentencePiece BPE is not supported");
  if (tok["model"].contains("dropout") && !tok["model"]["dropout"].is_null())
    refuse(tj, "tokenizer.json: BPE dropout is not supported");
}

// The type names of a normalizer or pre-tokenizer, nested ones in brackets
// ("Sequence[Precompiled, Replace]"): what a refusal names (a Precompiled normalizer's
// JSON is mostly its character map).
std::string type_names(const json& j) {
  if (!j.is_object()) return j.is_null() ? "none" : j.dump().substr(0, 60);
  std::string out = j.value("type", "?");
  for (const char* list : {"normalizers", "pretokenizers"})
    if (j.contains(list) && j[list].is_array()) {
      out += "[";
      for (size_t i = 0; i < j[list].size(); ++i) out += (i ? ", " : "") + type_names(j[list][i]);
      out += "]";
    }
  return out;
}

// A Unigram's normalizer, pre-tokenizer and model options (model/unigram.h: Hugging
// Face's rules): no normalizer, a Metaspace pre-tokenizer (prepend_scheme first /
// always / never, split or not), an unknown piece. Anything else is refused by name:
// T5's Precompiled normalizer (SentencePiece's character map), WhitespaceSplit, subword
// sampling.
void read_unigram_layout(const json& tok, const fs::path& tj, std::unordered_map<std::string, MetaValue>& meta) {
  const json norm = tok.contains("normalizer") ? tok["normalizer"] : json();
  const json pre = tok.contains("pre_tokenizer") ? tok["pre_tokenizer"] : json();
  const json& model = tok["model"];
  if (!norm.is_null())
    refuse(tj, "tokenizer.json: normalizer " + type_names(norm) +
                   " is not one we implement for a Unigram (none; Precompiled is SentencePiece's character map)");
  if (!(pre.is_object() && pre.value("type", "") == "Metaspace" && pre.value("replacement", "") == "\u2581"))
    refuse(tj, "tokenizer.json: pre_tokenizer " + type_names(pre) +
                   " is not one we implement for a Unigram (Metaspace with \u2581)");
  const std::string scheme = pre.value("prepend_scheme", "always");
  if (scheme != "first" && scheme != "always" && scheme != "never")
    refuse(tj, "tokenizer.json: Metaspace prepend_scheme '" + scheme + "' is not supported");
  for (const char* key : {"alpha", "nbest_size"})
    if (model.contains(key) && !model[key].is_null())
      refuse(tj, std::string("tokenizer.json: Unigram ") + key + " (subword sampling) is not supported");
  if (!model.contains("unk_id") || !model["unk_id"].is_number_integer())
    refuse(tj, "tokenizer.json: a Unigram without unk_id is not supported");
  meta["tokenizer.ggml.add_space_prefix"] = scheme != "never";
  meta["tokenizer.ggml.unknown_token_id"] = model["unk_id"].get<int64_t>();
  meta["blendserve.tokenizer.unigram_hf"] = true;
  meta["blendserve.tokenizer.byte_fallback"] = model.value("byte_fallback", false);
  meta["blendserve.tokenizer.metaspace_split"] = pre.value("split", true);
  meta["blendserve.tokenizer.space_prefix_first_only"] = scheme == "first";
  meta["blendserve.tokenizer.space_prefix_unless_space"] = true;  // Metaspace adds no space before one
}

// tokenizer.json (+ tokenizer_config.json, generation_config.json) into GGUF's
// tokenizer keys.
void read_tokenizer(const fs::path& dir, std::unordered_map<std::string, MetaValue>& meta) {
  const fs::path tj = dir / "tokenizer.json";
  const json tok = read_json(tj, true);
  const json& model = tok.contains("model") ? tok["model"] : json();
  const std::string type = model.is_object() ? model.value("type", "") : "";
  if (type != "BPE" && type != "Unigram")
    refuse(tj, "tokenizer.json: model.type '" + type +
                   "' is not supported (BPE: byte-level, or SentencePiece's with byte_fallback; Unigram)");
  // byte_fallback: a SentencePiece BPE (Llama 2, Mistral, Gemma, Phi-3) converted to
  // Hugging Face's format; else byte-level BPE.
  const bool unigram = type == "Unigram";
  const bool spm = !unigram && model.value("byte_fallback", false);
  if (unigram) {
    read_unigram_layout(tok, tj, meta);
  } else if (spm) {
    read_spm_layout(tok, tj, meta);
  } else if (tok.contains("normalizer") && !tok["normalizer"].is_null()) {
    const std::string nt = tok["normalizer"].value("type", "");
    // NFC: Qwen2's; llama.cpp's tokenizer applies none either (its inputs are NFC text).
    if (nt != "NFC") refuse(tj, "tokenizer.json: normalizer '" + nt + "' is not supported");
  }
  if (!model.contains("vocab") || !(unigram ? model["vocab"].is_array() : model["vocab"].is_object()))
    refuse(tj, "tokenizer.json: no model.vocab");
  std::map<int64_t, std::pair<std::string, int64_t>> by_id;  // id -> (token, GGUF token type)
  std::map<int64_t, double> scores;                           // Unigram: id -> its score
  // SentencePiece's byte tokens (<0x0A>) are its bytes (GGUF token type 6); its
  // unknown token is type 2.
  const std::string unk = spm && model.contains("unk_token") && model["unk_token"].is_string()
                              ? model["unk_token"].get<std::string>()
                              : std::string();
  auto normal_type = [&](const std::string& piece) -> int64_t {
    if (!spm) return 1;
    if (piece == unk) return 2;
    static const std::regex byte_token("<0x[0-9A-F]{2}>");
    return std::regex_match(piece, byte_token) ? 6 : 1;
  };
  if (unigram) {  // [[piece, score], ...]: the id is the place; the unknown piece type 2, byte pieces 6
    const int64_t unk_id = model["unk_id"].get<int64_t>();
    const bool bytes = model.value("byte_fallback", false);
    static const std::regex byte_token("<0x[0-9A-F]{2}>");
    const json& vocab = model["vocab"];
    if (vocab.size() > (size_t{1} << 24)) refuse(tj, "tokenizer.json: vocabulary too large");
    for (size_t i = 0; i < vocab.size(); ++i) {
      const json& e = vocab[i];
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
        refuse(tj, "tokenizer.json: a Unigram piece is not [text, score]");
      const auto id = static_cast<int64_t>(i);
      const std::string piece = e[0].get<std::string>();
      by_id[id] = {piece, id == unk_id ? 2 : bytes && std::regex_match(piece, byte_token) ? 6 : 1};
      scores[id] = e[1].get<double>();
    }
    if (unk_id < 0 || unk_id >= static_cast<int64_t>(vocab.size())) refuse(tj, "tokenizer.json: unk_id out of range");
  } else {
    for (const auto& [piece, id] : model["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (int64_t{1} << 24))
        refuse(tj, "tokenizer.json: token '" + piece + "' has an invalid id");
      by_id[id.get<int64_t>()] = {piece, normal_type(piece)};
    }
  }
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
    for (const auto& a : tok["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        refuse(tj, "tokenizer.json: an added token without id or content");
      const int64_t id = a["id"];
      if (id < 0 || id > (int64_t{1} << 24)) refuse(tj, "tokenizer.json: an added token has an invalid id");
      by_id[id] = {a["content"].get<std::string>(), a.value("special", false) ? 3 : 4};  // control : user-defined
    }
  if (by_id.empty()) refuse(tj, "tokenizer.json: empty vocabulary");
  const int64_t n = by_id.rbegin()->first + 1;
  if (static_cast<int64_t>(by_id.size()) != n) refuse(tj, "tokenizer.json: token ids are not 0.." + std::to_string(n - 1));
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  std::map<std::string, int64_t> id_of;
  for (const auto& [id, t] : by_id) {
    tokens.push_back(t.first);
    types.push_back(t.second);
    id_of.emplace(t.first, id);
  }
  std::vector<std::string> merges;
  if (model.contains("merges") && model["merges"].is_array())
    for (const auto& m : model["merges"]) {
      if (m.is_string()) merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
        merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      else refuse(tj, "tokenizer.json: a merge is neither \"a b\" nor [a, b]");
    }
  if (unigram) {
    meta["tokenizer.ggml.model"] = std::string("t5");
    std::vector<double> by_id_scores;  // an added token outside the model's pieces: 0 (it never matches)
    for (const auto& [id, t] : by_id) by_id_scores.push_back(scores.count(id) ? scores[id] : 0.0);
    meta["tokenizer.ggml.scores"] = std::move(by_id_scores);
  } else if (spm) {
    meta["tokenizer.ggml.model"] = std::string("llama");
  } else {
    meta["tokenizer.ggml.model"] = std::string("gpt2");
    meta["tokenizer.ggml.pre"] = pre_tokenizer_name(tok.contains("pre_tokenizer") ? tok["pre_tokenizer"] : json(), tj);
  }
  meta["tokenizer.ggml.tokens"] = tokens;
  meta["tokenizer.ggml.token_type"] = types;
  meta["tokenizer.ggml.merges"] = merges;

  // BOS / EOS by name (tokenizer_config.json), EOS also by id (generation_config.json).
  const json cfg = read_json(dir / "tokenizer_config.json", false);
  auto token_id = [&](const json& v) -> int64_t {
    std::string s = v.is_string() ? v.get<std::string>() : v.is_object() ? v.value("content", "") : "";
    auto it = id_of.find(s);
    return it == id_of.end() ? -1 : it->second;
  };
  if (cfg.is_object()) {
    if (cfg.contains("bos_token") && token_id(cfg["bos_token"]) >= 0)
      meta["tokenizer.ggml.bos_token_id"] = token_id(cfg["bos_token"]);
    if (cfg.contains("eos_token") && token_id(cfg["eos_token"]) >= 0)
      meta["tokenizer.ggml.eos_token_id"] = token_id(cfg["eos_token"]);
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
      meta["tokenizer.ggml.add_bos_token"] = cfg["add_bos_token"].get<bool>();
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (ct.is_string()) {
        meta["tokenizer.chat_template"] = ct.get<std::string>();
      } else if (ct.is_array()) {  // [{name, template}]: the default one
        for (const auto& e : ct)
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
            meta["tokenizer.chat_template"] = e["template"].get<std::string>();
      }
    }
  }
  if (fs::exists(dir / "chat_template.jinja")) {
    std::ifstream in(dir / "chat_template.jinja");
    std::stringstream ss;
    ss << in.rdbuf();
    meta["tokenizer.chat_template"] = ss.str();
  }
  // generation_config.json's eos_token_id (one id or a list): the EOS where the
  // tokenizer's config names none, and every one of them ends a generation
  // (TokenizerSpec::end_ids).
  const json gen = read_json(dir / "generation_config.json", false);
  if (gen.is_object() && gen.contains("eos_token_id")) {
    const json& e = gen["eos_token_id"];
    std::vector<int64_t> ids;
    if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
    if (e.is_array())
      for (const auto& v : e)
        if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
    if (!ids.empty()) {
      if (!meta.count("tokenizer.ggml.eos_token_id")) meta["tokenizer.ggml.eos_token_id"] = ids[0];
      meta["blendserve.eos_token_ids"] = std::move(ids);
    }
  }
}

}  // namespace

bool is_hf_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

gguf::GgufFile open_hf_checkpoint(const std::string& dir_s) {
  const fs::path dir(dir_s);
  const fs::path cfg_path = dir / "config.json";
  json cfg = read_json(cfg_path, true);
  if (!cfg.is_object()) refuse(cfg_path, "not a JSON object");
  // Multimodal wrappers keep the language model's config in text_config.
  if (cfg.contains("text_config") && cfg["text_config"].is_object()) refuse(cfg_path, "a multimodal checkpoint (text_config) is not supported");
  std::string arch = cfg.value("model_type", "");
  if (arch.empty()) refuse(cfg_path, "no model_type");
  // Gemma 3's language model (Gemma3ForCausalLM) is GGUF's gemma3; a "gemma3" config is
  // the multimodal wrapper (refused above by its text_config).
  const bool gemma = arch == "gemma3_text";
  if (gemma) arch = "gemma3";
  // The feed-forward activation each family computes (model/architecture.h).
  const std::string act = cfg.value("hidden_activation", cfg.value("hidden_act", std::string(gemma ? "gelu_pytorch_tanh" : "silu")));
  if (act != (gemma ? "gelu_pytorch_tanh" : "silu"))
    refuse(cfg_path, "hidden_act '" + act + "' is not supported for " + arch + " (it computes " +
                         (gemma ? "gelu_pytorch_tanh" : "silu") + ")");
  if (cfg.value("use_bidirectional_attention", false))
    refuse(cfg_path, "use_bidirectional_attention (an encoder, e.g. EmbeddingGemma) is not supported");
  std::unordered_map<std::string, MetaValue> meta;
  meta["general.architecture"] = arch;
  meta["general.name"] = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  meta["blendserve.hf_checkpoint"] = true;
  auto num = [&](const char* key) -> std::optional<json> {
    if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
    if (!cfg[key].is_number()) refuse(cfg_path, std::string(key) + " is not a number");
    return cfg[key];
  };
  auto put_int = [&](const char* key, const std::string& gguf_key) {
    if (auto v = num(key)) meta[arch + "." + gguf_key] = v->get<int64_t>();
  };
  auto put_float = [&](const char* key, const std::string& gguf_key) {
    if (auto v = num(key)) meta[arch + "." + gguf_key] = v->get<double>();
  };
  put_int("num_hidden_layers", "block_count");
  put_int("hidden_size", "embedding_length");
  put_int("intermediate_size", "feed_forward_length");
  put_int("num_attention_heads", "attention.head_count");
  put_int("num_key_value_heads", "attention.head_count_kv");
  put_int("head_dim", "attention.key_length");
  put_int("max_position_embeddings", "context_length");
  put_float("rms_norm_eps", "attention.layer_norm_rms_epsilon");
  put_float("attn_logit_softcapping", "attn_logit_softcapping");
  put_float("final_logit_softcapping", "final_logit_softcapping");
  put_int("num_local_experts", "expert_count");
  put_int("num_experts", "expert_count");
  // RoPE: transformers 4 says rope_theta and rope_scaling, 5 rope_parameters (Gemma 3:
  // one per layer type, the global layers' and the local ones').
  json rope = cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object() ? cfg["rope_parameters"]
              : cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object() ? cfg["rope_scaling"]
                                                                                : json::object();
  if (gemma) {
    double local_theta = 10000.0;
    if (auto v = num("rope_local_base_freq")) local_theta = v->get<double>();
    if (rope.contains("sliding_attention") && rope["sliding_attention"].is_object()) {
      const json& local = rope["sliding_attention"];
      const std::string t = local.value("rope_type", std::string("default"));
      if (t != "default") refuse(cfg_path, "rope_parameters.sliding_attention: rope_type '" + t + "' is not supported");
      if (local.contains("rope_theta") && local["rope_theta"].is_number()) local_theta = local["rope_theta"].get<double>();
    }
    meta["gemma3.rope.freq_base_swa"] = local_theta;
    if (rope.contains("full_attention")) rope = rope["full_attention"].is_object() ? rope["full_attention"] : json::object();
    // The attention scale: query_pre_attn_scalar^-1/2 (not always head_dim's).
    if (auto v = num("query_pre_attn_scalar")) meta["blendserve.query_pre_attn_scalar"] = v->get<double>();
  }
  double theta = 10000.0;
  if (auto v = num("rope_theta")) theta = v->get<double>();
  if (rope.contains("rope_theta") && rope["rope_theta"].is_number()) theta = rope["rope_theta"].get<double>();
  meta[arch + ".rope.freq_base"] = theta;
  const int64_t heads = cfg.value("num_attention_heads", int64_t{0});
  const int64_t head_dim =
      cfg.contains("head_dim") && cfg["head_dim"].is_number_integer() ? cfg["head_dim"].get<int64_t>()
      : heads > 0 ? cfg.value("hidden_size", int64_t{0}) / heads : 0;
  if (auto v = num("partial_rotary_factor"); v && v->get<double>() != 1.0)
    meta[arch + ".rope.dimension_count"] = static_cast<int64_t>(std::lround(v->get<double>() * head_dim));
  std::vector<float> rope_freqs;  // llama3 scaling, as llama.cpp's converter computes it
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (rope_type == "llama3") {
    const double factor = rope.value("factor", 8.0), lo = rope.value("low_freq_factor", 1.0),
                 hi = rope.value("high_freq_factor", 4.0);
    const double old = rope.value("original_max_position_embeddings", 8192.0);
    if (!(factor > 0 && lo > 0 && hi > lo && old > 0)) refuse(cfg_path, "invalid llama3 rope scaling " + rope.dump());
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double freq = 1.0 / std::pow(theta, 2.0 * i / head_dim);
      const double wl = 2 * std::numbers::pi / freq;
      if (wl < old / hi) rope_freqs.push_back(1.0f);
      else if (wl > old / lo) rope_freqs.push_back(static_cast<float>(factor));
      else {
        const double smooth = (old / wl - lo) / (hi - lo);
        rope_freqs.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
      }
    }
  } else if (rope_type == "linear") {
    meta[arch + ".rope.scaling.type"] = std::string("linear");
    meta[arch + ".rope.scaling.factor"] = rope.value("factor", 1.0);
  } else if (rope_type != "default") {
    meta[arch + ".rope.scaling.type"] = rope_type;  // yarn, dynamic, longrope, ...: the loader refuses it by name
  }
  // A sliding window, where the config turns it on: the loader refuses it if shorter
  // than the context.
  const bool sliding = cfg.contains("use_sliding_window") ? cfg.value("use_sliding_window", false)
                                                           : cfg.contains("sliding_window") && !cfg["sliding_window"].is_null();
  if (sliding && cfg.contains("sliding_window") && cfg["sliding_window"].is_number_integer())
    meta[arch + ".attention.sliding_window"] = cfg["sliding_window"].get<int64_t>();
  if (gemma) {  // which layers are local: layer_types, or the older sliding_window_pattern
    std::vector<bool> local;
    if (cfg.contains("layer_types") && cfg["layer_types"].is_array()) {
      for (const auto& t : cfg["layer_types"]) {
        const std::string type = t.is_string() ? t.get<std::string>() : "";
        if (type != "sliding_attention" && type != "full_attention")
          refuse(cfg_path, "layer_types: '" + t.dump() + "' is not sliding_attention or full_attention");
        local.push_back(type == "sliding_attention");
      }
    } else {
      const int64_t period = cfg.value("sliding_window_pattern", int64_t{6});
      const int64_t layers = cfg.value("num_hidden_layers", int64_t{0});
      if (period <= 0 || layers <= 0 || layers > 4096) refuse(cfg_path, "invalid sliding_window_pattern or num_hidden_layers");
      for (int64_t l = 0; l < layers; ++l) local.push_back((l + 1) % period != 0);
    }
    meta["gemma3.attention.sliding_window_pattern"] = local;
  }

  // The weights: one file or the shards its index names.
  std::vector<fs::path> files;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const json index = read_json(dir / "model.safetensors.index.json", true);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      refuse(dir / "model.safetensors.index.json", "no weight_map");
    std::set<std::string> shards;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        refuse(dir / "model.safetensors.index.json", "tensor '" + name + "' maps to an invalid file");
      shards.insert(file.get<std::string>());
    }
    for (const auto& s : shards) files.push_back(dir / s);
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back(dir / "model.safetensors");
  } else {
    refuse(dir, "no model.safetensors or model.safetensors.index.json");
  }
  std::vector<TensorInfo> tensors;
  std::vector<std::shared_ptr<const void>> keep;
  for (const auto& f : files) {
    safetensors::File st;
    try {
      st = safetensors::File::open(f.string());
    } catch (const safetensors::SafetensorsError& e) {
      throw GgufError(e.what());
    }
    keep.push_back(st.keep());
    for (const auto& t : st.tensors()) {
      if (t.name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // derived from the config
      TensorInfo ti;
      ti.name = gguf_name(t.name, gemma);
      ti.dims.assign(t.shape.rbegin(), t.shape.rend());  // GGUF order: the contiguous dimension first
      if (ti.dims.empty()) ti.dims = {1};
      ti.type = t.type;
      ti.offset = 0;
      ti.data = t.data;
      ti.nbytes = t.nbytes;
      if (gemma && ti.name.ends_with("norm.weight") && ti.dims.size() == 1) {
        // Gemma scales by (1 + w); GGUF holds 1 + w (llama.cpp's converter), so do we.
        auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(ti.dims[0]));
        kernels::dequantize_row(ti.type, ti.data, buf->data(), ti.dims[0]);
        for (float& x : *buf) x += 1.0f;
        ti.type = kernels::TensorType::F32;
        ti.data = reinterpret_cast<const uint8_t*>(buf->data());
        ti.nbytes = buf->size() * sizeof(float);
        keep.push_back(buf);
      }
      tensors.push_back(std::move(ti));
    }
  }
  if (!rope_freqs.empty()) {
    auto buf = std::make_shared<std::vector<float>>(rope_freqs);
    tensors.push_back(TensorInfo{"rope_freqs.weight", {static_cast<int64_t>(buf->size())}, kernels::TensorType::F32,
                                 0, reinterpret_cast<const uint8_t*>(buf->data()), buf->size() * sizeof(float)});
    keep.push_back(buf);
  }
  const bool has_head = std::any_of(tensors.begin(), tensors.end(), [](const TensorInfo& t) {
    return t.name == "output.weight";
  });
  if (!has_head && !cfg.value("tie_word_embeddings", true))
    refuse(cfg_path, "tie_word_embeddings is false but the checkpoint has no lm_head.weight");
  read_tokenizer(dir, meta);
  return gguf::GgufFile::assemble(std::move(meta), std::move(tensors), std::move(keep));
}

gguf::GgufFile open_hf_tokenizer(const std::string& dir) {
  std::unordered_map<std::string, MetaValue> meta;
  read_tokenizer(fs::path(dir), meta);
  return gguf::GgufFile::assemble(std::move(meta), {}, {});
}

gguf::GgufFile open_model_file(const std::string& path) {
  if (is_hf_checkpoint(path)) return open_hf_checkpoint(path);
  const fs::path p(path);
  if (p.extension() == ".safetensors" || p.extension() == ".json") {
    if (is_hf_checkpoint(p.parent_path().string())) return open_hf_checkpoint(p.parent_path().string());
    throw GgufError(path + ": a safetensors file alone has no config; give the checkpoint directory (with its "
                    "config.json and tokenizer.json)");
  }
  std::error_code ec;
  if (fs::is_directory(p, ec))
    throw GgufError(path + " is a directory without a config.json (not a Hugging Face checkpoint)");
  return gguf::GgufFile::open(path);
}

std::string model_display_name(const std::string& path) {
  if (path.rfind("random:", 0) == 0) return path;
  fs::path p(path);
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  if (is_hf_checkpoint(p.string())) return p.filename().string();
  if (p.extension() == ".safetensors" && is_hf_checkpoint(p.parent_path().string()))
    return p.parent_path().filename().string();
  // A GGUF file: the name without .gguf (not stem(): "Llama-3.1-8B.Q4_K_M.gguf" has
  // dots of its own), then without a quantization suffix.
  std::string name = p.filename().string();
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  static const std::regex quant(R"([.-](Q\d+(_[A-Z0-9]+)*|F16|F32|BF16|IQ\d+\w*)$)", std::regex::icase);
  name = std::regex_replace(name, quant, "");
  return name.empty() ? "default" : name;
}

}  // namespace bs
