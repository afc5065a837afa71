// How a token is picked from one row of logits, given the sampler's settings and one
// uniform draw made by the caller from the request's seeded generator. Written once for
// the host sampler (model/generate.h) and as the reference of the device sampler
// (kernels/cuda/sample.cuh, through Backend::sample_rows), which must pick the same
// token from the same logits and draw.
#pragma once

#include <cstdint>
#include <random>
#include <limits>

namespace bs::kernels {

struct SampleRow {
  float temperature = 0.0f;  // <= 0: greedy (the draw is not used)
  float top_p = 1.0f;        // nucleus mass; 1: no cut
  int32_t top_k = 0;         // 0: no limit (the candidates are at most kMaxCandidates anyway)
  double uniform = 0.0;      // in [0, 1): this step's draw
};

// Temperature sampling considers at most this many of the most likely tokens.
inline constexpr int64_t kMaxCandidates = 1024;

// std::max_element's answer: the first index of the largest logit, NaN skipped — except
// a NaN at index 0, which nothing compares above (then 0).
int32_t argmax_logit(const float* logits, int64_t vocab);

// The token `row` picks: greedy when temperature <= 0; else the K = min(top_k or vocab,
// kMaxCandidates) largest logits, larger first, equal logits by lower index;
// p_i = exp((l_i - l_max) / T) in double; cut to the shortest prefix whose share of the
// K's sum reaches top_p; the kept p_i normalized by their own sum, partial sums in
// double with the last set to 1, and the first whose partial sum is >= uniform
// (std::discrete_distribution's arithmetic in libstdc++).
int32_t pick_token(const float* logits, int64_t vocab, const SampleRow& row);

// Frees pick_token's scratch of the calling thread (Backend::release_scratch).
void release_sampling_scratch();

// One draw in [0, 1) from `rng`: what std::discrete_distribution draws (one
// generate_canonical<double, 53>), so a seeded request draws the same numbers as before
// the pick moved here.
template <class Rng>
double uniform_draw(Rng& rng) {
  return std::generate_canonical<double, std::numeric_limits<double>::digits>(rng);
}

}  // namespace bs::kernels
