// A Hugging Face checkpoint directory (what vLLM and SGLang load): config.json,
// model.safetensors or its shards with model.safetensors.index.json, tokenizer.json,
// tokenizer_config.json and generation_config.json. Read into the same view a GGUF
// file gives (gguf::GgufFile::assemble): the config under GGUF's keys, the tensors
// under GGUF's names, memory-mapped in place (F32, F16, BF16), so one loader
// (model/llama_model.cpp) and one feature check (model/architecture.h) serve both.
//
// What the view marks as a checkpoint's: blendserve.hf_checkpoint = true. The loader
// then uses half-split RoPE for every family: a checkpoint's q and k rows are in
// transformers' rotate_half order (llama.cpp's converter permutes Llama's into pairs;
// here they stay as they are).
//
// Gemma 3 (model_type gemma3_text) is read as GGUF's gemma3: its local and global
// layers (layer_types or sliding_window_pattern) into
// gemma3.attention.sliding_window_pattern, one bool per layer; the local layers' RoPE
// base into rope.freq_base_swa; query_pre_attn_scalar into
// blendserve.query_pre_attn_scalar; its norm weights w as F32 copies of 1 + w (what
// GGUF holds); its post_attention_layernorm as the post norm it is.
//
// Whatever a config or tokenizer asks for that we do not compute is carried under the
// GGUF key the loader refuses (soft-capping, partial rotary, experts, a sliding
// window outside Gemma 3, YaRN) or refused here by name (a tokenizer other than
// byte-level BPE, SentencePiece's BPE with byte_fallback or a Unigram with a Metaspace
// and no normalizer, a dtype other than
// F32/F16/BF16, an activation other than the family's, a bidirectional encoder); an
// unknown tensor keeps its checkpoint name, which the loader refuses.
#pragma once

#include <string>

#include "model/gguf.h"

namespace bs {

// Whether `path` is a directory holding a config.json.
bool is_hf_checkpoint(const std::string& path);

// The checkpoint at `dir` as a model view; gguf::GgufError naming the file and the
// problem for anything malformed or unsupported.
gguf::GgufFile open_hf_checkpoint(const std::string& dir);

// The tokenizer of the checkpoint at `dir` alone (tokenizer.json, tokenizer_config.json,
// generation_config.json, no config or weights) as a view of tokenizer keys, which
// Tokenizer::from_gguf reads: for tools and tests that need no weights.
gguf::GgufFile open_hf_tokenizer(const std::string& dir);
// Any model path a user gives (model.path, BLENDSERVE_MODEL, --model): a GGUF file,
// a checkpoint directory, or a checkpoint's model.safetensors (its directory is read).
// A .safetensors file without a config.json beside it is refused: it has no config.
gguf::GgufFile open_model_file(const std::string& path);

// What users call the model at `path` (the id /v1/models lists): a checkpoint's
// directory name ("Llama-3.1-8B-Instruct", also for its model.safetensors path), a
// GGUF file's name without ".gguf" and its quantization suffix
// ("SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct"), "random:NAME" as is.
std::string model_display_name(const std::string& path);

}  // namespace bs
