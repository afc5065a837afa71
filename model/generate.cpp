#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace bs {

int32_t argmax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature <= 0.0f) return argmax(logits, vocab);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
  // Candidates sorted by logit; partial sort is enough when top_k or top_p limits them.
  const int64_t sort_n = std::min<int64_t>(keep, 1024);
  std::partial_sort(idx.begin(), idx.begin() + sort_n, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  keep = std::min(keep, sort_n);
  const float inv_t = 1.0f / params_.temperature;
  std::vector<double> probs(static_cast<size_t>(keep));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += probs[i] = std::exp((logits[idx[i]] - mx) * inv_t);
  if (params_.top_p < 1.0f) {
    double cum = 0;
    int64_t cut = keep;
    for (int64_t i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    probs.resize(static_cast<size_t>(keep));
  }
  std::discrete_distribution<int64_t> dist(probs.begin(), probs.end());
  return idx[dist(rng_)];
}

namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string:
// that much text must be held back, since the next token may complete the stop.
size_t held_back(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len)
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
  return hold;
}

}  // namespace

GenerationResult decode_from(const Transformer& tf, KvCache& cache, std::vector<float> logits,
                             const SamplingParams& params, const TextCallback& on_text) {
  using clock = std::chrono::steady_clock;
  const auto& tok = tf.model().tokenizer();
  const int64_t vocab = tf.model().config().vocab;
  Sampler sampler(params);
  GenerationResult r;
  StreamDecoder stream(tok);
  std::string pending;  // decoded text not yet released to the callback
  size_t emitted = 0;   // bytes of r.text already released
  const auto t0 = clock::now();
  std::vector<std::string> stops;
  for (const auto& s : params.stop)
    if (!s.empty()) stops.push_back(s);
  bool cancelled = false;
  bool cut = false;  // text was cut at a stop string
  r.finish_reason = "length";
  for (int i = 0; i < params.max_tokens; ++i) {
    const int32_t id = sampler.sample(logits.data(), vocab);
    if (id == tok.eos_id() || tok.is_control(id)) {
      r.finish_reason = "stop";
      break;
    }
    r.tokens.push_back(id);
    r.text += stream.push(id);
    // Stop strings: cut the text at the first occurrence.
    bool stopped = false;
    for (const auto& s : stops) {
      const size_t at = r.text.find(s, emitted > s.size() ? emitted - s.size() : 0);
      if (at != std::string::npos) {
        r.text.resize(at);
        stopped = true;
      }
    }
    if (stopped) {
      r.finish_reason = "stop";
      cut = true;
      break;
    }
    if (on_text) {
      const size_t hold = held_back(r.text, stops);
      if (r.text.size() - hold > emitted) {
        if (!on_text(std::string_view(r.text).substr(emitted, r.text.size() - hold - emitted))) {
          cancelled = true;
          emitted = r.text.size() - hold;
          break;
        }
        emitted = r.text.size() - hold;
      }
    }
    if (i + 1 == params.max_tokens) break;
    if (cache.length + 1 > cache.capacity) break;  // context full: finish with "length"
    logits = tf.forward(std::span<const int32_t>(&id, 1), cache);
  }
  if (!cancelled && !cut) r.text += stream.flush();
  if (on_text && !cancelled && r.text.size() > emitted) on_text(std::string_view(r.text).substr(emitted));
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return r;
}

GenerationResult generate(const Transformer& tf, KvCache& cache, std::span<const int32_t> prompt,
                          const SamplingParams& params, const TextCallback& on_text) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  if (cache.length + static_cast<int64_t>(prompt.size()) > cache.capacity)
    throw std::length_error("prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                            std::to_string(cache.capacity - cache.length) + " tokens");
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = tf.forward(prompt, cache);
  const double prefill = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto r = decode_from(tf, cache, std::move(logits), params, on_text);
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  r.prefill_seconds = prefill;
  return r;
}

}  // namespace bs
