// A raw prompt the model continues by counting on ("1, 2, ..., 12, "): a stream
// that keeps decoding for exactly max_tokens tokens, for the tests that watch a
// decoding stream while something else runs (a prefill, a cancelled load).
#pragma once

#include <string>

#include "actors/runtime/request.h"

namespace bs::testing {

inline RuntimeRequest counting_request(int max_tokens) {
  RuntimeRequest r;
  r.raw = true;
  for (int i = 1; i < 13; ++i) r.raw_prompt += std::to_string(i) + ", ";
  r.sampling.max_tokens = max_tokens;
  return r;
}

}  // namespace bs::testing
