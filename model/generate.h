// Sampling and the prefill + decode loop with stop conditions.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/transformer.h"

namespace bs {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  int top_k = 0;             // 0: no limit
  uint64_t seed = 0;
  int max_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not included in the output)
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int32_t argmax(const float* logits, int64_t vocab);

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (without the prompt)
  std::string text;
  std::string finish_reason;    // "stop" | "length"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;   // time to first token
  double decode_seconds = 0;
};

// Text callback receives each newly final piece of text; return false to cancel.
using TextCallback = std::function<bool(std::string_view)>;

// Prefills `prompt` (after whatever the cache already holds) and decodes.
// Generation ends at an end-of-turn token (eos or a control token), a stop
// string, or max_tokens.
GenerationResult generate(const Transformer& tf, KvCache& cache, std::span<const int32_t> prompt,
                          const SamplingParams& params, const TextCallback& on_text = {});

// Continue decoding given the logits of the last prompt token (used by callers
// that produce the prefill themselves, e.g. the blend pipeline).
GenerationResult decode_from(const Transformer& tf, KvCache& cache, std::vector<float> first_logits,
                             const SamplingParams& params, const TextCallback& on_text = {});

}  // namespace bs
