#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace bs::kernels {

int32_t argmax_logit(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

namespace {
// pick_token's scratch, this thread's: the ids being ordered ([vocab]) and the kept
// candidates' probabilities.
thread_local std::vector<int32_t> idx;
thread_local std::vector<double> probs;
}  // namespace

void release_sampling_scratch() {
  std::vector<int32_t>().swap(idx);
  std::vector<double>().swap(probs);
}

int32_t pick_token(const float* logits, int64_t vocab, const SampleRow& row) {
  if (row.temperature <= 0.0f || vocab <= 1) return argmax_logit(logits, vocab);
  int64_t keep = vocab;
  if (row.top_k > 0 && row.top_k < vocab) keep = row.top_k;
  keep = std::min(keep, kMaxCandidates);
  idx.resize(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const float inv_t = 1.0f / row.temperature;
  probs.resize(static_cast<size_t>(keep));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += probs[i] = std::exp((logits[idx[i]] - mx) * inv_t);
  if (row.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= row.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (keep < 2) return idx[0];
  // std::discrete_distribution: normalized by the kept sum, partial sums, the last 1.
  double kept_sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) kept_sum += probs[i];
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum = i + 1 == keep ? 1.0 : cum + probs[i] / kept_sum;
    if (cum >= row.uniform) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace bs::kernels
