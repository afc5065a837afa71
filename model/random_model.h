// Llama models of a known shape with random weights, as GGUF files: benchmarks of
// shapes we have no weights for (Llama-3.2-1B's 32 query / 8 KV heads, for tensor
// parallelism) and of the shipped model's shape without its file. Weights are Q4_0
// (as a served model would be) with scales that keep activations in range; the
// tokenizer is a byte-level alphabet padded to the vocabulary. Speed only: the text
// such a model writes means nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bs {

struct RandomLlamaShape {
  std::string name;
  int layers = 0, dim = 0, ff = 0, heads = 0, kv_heads = 0, vocab = 0;
  float rope_theta = 10000.0f;
};

// The shapes we know by name: "smollm2-135m", "llama-3.2-1b".
// std::invalid_argument naming the known ones for another name.
RandomLlamaShape random_llama_shape(const std::string& name);
std::vector<std::string> random_llama_shape_names();

// Writes a random-weight model of `shape` to `path` (seeded: the same file every
// time). Throws std::runtime_error when the file cannot be written.
void write_random_llama(const RandomLlamaShape& shape, const std::string& path, uint32_t seed = 1);

}  // namespace bs
