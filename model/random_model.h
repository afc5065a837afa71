// Llama models of a known shape with random weights, as GGUF files: benchmarks of
// shapes we have no weights for (Llama-3.2-1B's 32 query / 8 KV heads, Llama-3.1-8B on
// a GPU; an 8B-shaped Q4_K_M in 24 GiB) and of the shipped model's shape without its
// file. Weights are Q4_0 (as a served CPU model would be), the Q4_K_M mix (Q4_K, with
// attn_v, ffn_down and an untied LM head in Q6_K, as llama.cpp writes it) or BF16 (as a
// GPU serves them), scaled to keep activations in range; the tokenizer is a byte-level alphabet padded to the vocabulary. Speed only:
// the text such a model writes means nothing.
//
// `--model random:NAME` anywhere a model path is taken (LlamaModel, the runtime, every
// benchmark) builds NAME's BF16 model in memory (a memfd: nothing on disk, nothing large
// to carry to a GPU machine) the first time the process asks for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor_types.h"

namespace bs {

struct RandomLlamaShape {
  std::string name;
  int layers = 0, dim = 0, ff = 0, heads = 0, kv_heads = 0, vocab = 0;
  float rope_theta = 10000.0f;
};

// The shapes we know by name: "smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", and
// "tiny-256" (2 layers of width 256, for tests).
// std::invalid_argument naming the known ones for another name.
RandomLlamaShape random_llama_shape(const std::string& name);
std::vector<std::string> random_llama_shape_names();

// Writes a random-weight model of `shape` to `path` (seeded: the same file every
// time), its matrices in `weights` (Q4_0, Q4_K for the Q4_K_M mix, or BF16; the mix
// needs widths that are multiples of 256, std::invalid_argument otherwise). Throws std::runtime_error when the
// file cannot be written, std::invalid_argument for another weight type.
void write_random_llama(const RandomLlamaShape& shape, const std::string& path, uint32_t seed = 1,
                        kernels::TensorType weights = kernels::TensorType::Q4_0);

// The prefix that names a random model in a model path: "random:llama-3.1-8b".
inline constexpr const char* kRandomModelPrefix = "random:";
// `path` itself, or for "random:NAME" a path to NAME's BF16 random model built in memory
// (once per process and name; /proc/self/fd/N of a memfd that lives as long as the
// process). std::invalid_argument for an unknown NAME.
std::string materialize_model_path(const std::string& path);

}  // namespace bs
