// Benchmarks run by blendctl; each prints one JSON object per measurement.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace bs::tools {

struct BenchOptions {
  std::string model_path;
  kernels::Precision precision = kernels::Precision::BF16;
  std::vector<int64_t> prefill_lengths{512, 3072};
  int repeats = 3;
  int64_t decode_context = 512;
  int decode_tokens = 128;
};

int bench_prefill(const BenchOptions& opt);

}  // namespace bs::tools
