#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace bs {

int32_t argmax(const float* logits, int64_t vocab) { return kernels::argmax_logit(logits, vocab); }

kernels::SampleRow Sampler::next_row() {
  kernels::SampleRow row{params_.temperature, params_.top_p, params_.top_k, 0.0};
  if (params_.temperature > 0.0f) row.uniform = kernels::uniform_draw(rng_);  // greedy draws nothing
  return row;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) { return kernels::pick_token(logits, vocab, next_row()); }

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

DecodeSession::DecodeSession(const Tokenizer& tok, int64_t vocab, const SamplingParams& params)
    : tok_(tok), vocab_(vocab), params_(params), sampler_(params), stream_(tok) {
  for (const auto& s : params.stop)
    if (!s.empty()) stops_.push_back(s);
}

std::string DecodeSession::release(size_t upto) {
  if (upto <= emitted_) return {};
  std::string out = text_.substr(emitted_, upto - emitted_);
  emitted_ = upto;
  return out;
}

void DecodeSession::cancel() {
  if (done_) return;
  done_ = true;
  finish_ = "cancelled";
  text_.resize(emitted_);  // the final text is what was released, nothing held back
}

DecodeSession::Step DecodeSession::step(const float* logits, bool can_continue) {
  if (done_) return Step{-1, {}, true};
  return advance(sampler_.sample(logits, vocab_), can_continue);
}

DecodeSession::Step DecodeSession::step(const float* logits, const kernels::SampleRow& row, bool can_continue) {
  if (done_) return Step{-1, {}, true};
  return advance(kernels::pick_token(logits, vocab_, row), can_continue);
}

DecodeSession::Step DecodeSession::step_token(int32_t id, bool can_continue) {
  if (done_) return Step{-1, {}, true};
  return advance(id, can_continue);
}

DecodeSession::Step DecodeSession::advance(int32_t id, bool can_continue) {
  Step st;
  // The last step: everything still pending is released (after a stop-string cut,
  // the text ends at the cut and the decoder's tail is dropped with it).
  auto finish = [&](const char* reason, bool flush) {
    done_ = true;
    finish_ = reason;
    if (flush) text_ += stream_.flush();
    st.text = release(text_.size());
    st.done = true;
    return st;
  };
  if (tok_.ends_generation(id)) return finish("stop", true);
  tokens_.push_back(id);
  text_ += stream_.push(id);
  // Stop strings: cut the text at the first occurrence (searching only where a new
  // occurrence can start).
  bool stopped = false;
  for (const auto& s : stops_) {
    const size_t at = text_.find(s, emitted_ > s.size() ? emitted_ - s.size() : 0);
    if (at != std::string::npos) {
      text_.resize(at);
      stopped = true;
    }
  }
  if (stopped) return finish("stop", false);
  if (static_cast<int>(tokens_.size()) >= params_.max_tokens || !can_continue) return finish("length", true);
  st.text = release(text_.size() - held_back(text_, stops_));
  st.token = id;
  return st;
}

GenerationResult decode_from(const Transformer& tf, KvCache& cache, std::vector<float> logits,
                             const SamplingParams& params, const TextCallback& on_text) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  DecodeSession session(tf.model().tokenizer(), tf.model().config().vocab, params);
  while (true) {
    auto st = session.step(logits.data(), cache.length + 1 <= cache.capacity);
    if (on_text && !st.text.empty() && !on_text(st.text)) {
      session.cancel();
      break;
    }
    if (st.done) break;
    logits = tf.forward(std::span<const int32_t>(&st.token, 1), cache);
  }
  GenerationResult r;
  r.tokens = session.tokens();
  r.text = session.text();
  r.finish_reason = session.finish_reason() == "cancelled" ? "length" : session.finish_reason();
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
