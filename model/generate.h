// Sampling and the prefill + decode loop with stop conditions.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/sampling.h"
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
  // The next step's settings and draw (one draw per sampled step; greedy draws none):
  // whoever picks the token with it (kernels::pick_token here, or a backend's
  // sample_rows on the device) picks the same one.
  kernels::SampleRow next_row();
  // next_row() picked from host logits.
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

// One sequence's decoding state, one token at a time: sampling, end of turn, stop
// strings (cut, never emitted), and text released only as whole UTF-8 characters
// that can no longer become part of a stop string. decode_from() loops over it; the
// runtime's decoder interleaves many of them, one step per message.
class DecodeSession {
 public:
  DecodeSession(const Tokenizer& tok, int64_t vocab, const SamplingParams& params);

  struct Step {
    int32_t token = -1;  // the sampled token to feed next, or -1 when finished
    std::string text;    // text that became final with this step (may be empty)
    bool done = false;
  };
  // logits: [vocab] after the last token. can_continue: the cache has room for one
  // more token (false: this step is the last, finish "length").
  Step step(const float* logits, bool can_continue);
  // The same with the row drawn earlier by next_row() (the runtime draws when it asks
  // for the step, so a step sampled on the device and one sampled here use one draw).
  Step step(const float* logits, const kernels::SampleRow& row, bool can_continue);
  // The same with the token already picked (on the device, with a next_row() draw).
  Step step_token(int32_t token, bool can_continue);
  kernels::SampleRow next_row() { return sampler_.next_row(); }
  // Ends the session early (cancelled): nothing more is released, and text() is
  // what was released so far.
  void cancel();

  bool done() const { return done_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::string& text() const { return text_; }           // the final text so far
  const std::string& finish_reason() const { return finish_; }  // "stop" | "length" | "cancelled"

 private:
  std::string release(size_t upto);
  Step advance(int32_t token, bool can_continue);

  const Tokenizer& tok_;
  int64_t vocab_;
  SamplingParams params_;
  Sampler sampler_;
  StreamDecoder stream_;
  std::vector<std::string> stops_;
  std::vector<int32_t> tokens_;
  std::string text_;
  size_t emitted_ = 0;
  bool done_ = false;
  std::string finish_ = "length";
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
