// blendctl bench gemv: the decode-size product of one weight matrix, per block type, on
// the CPU kernels this machine selects: microseconds per product and the weight bytes
// read per second, with the default activations (fp32, or int16 for Q4_0/Q4_1/Q5_0/
// Q5_1: kernels/activation_quant.h) and with int8 activations (DecodeActivations::Int8).
// What a decode step's products cost without the rest of the step: whether a type's
// product is bound by its arithmetic or by memory (the shapes default to Gemma 3 270M's
// MLP, its down projection and a 32k-row slice of a vocabulary head). The weights are
// random blocks with fixed small scales (speed does not depend on the values). One JSON
// object per (type, shape, tokens, activations) on stdout.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "kernels/tensor_types.h"
#include "tools/bench/bench.h"

namespace bs::tools {
namespace {

using kernels::TensorType;

// Random blocks of `type` whose fp16 scale fields hold 2^-7 (and a minimum field 2^-8),
// so every product stays finite.
std::vector<uint8_t> random_blocks(TensorType type, int64_t rows, int64_t in, std::mt19937& rng) {
  const auto& t = kernels::type_traits(type);
  const int64_t blocks = rows * in / t.block_elements;
  std::vector<uint8_t> raw(static_cast<size_t>(blocks * t.block_bytes));
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  const bool has_min = type == TensorType::Q4_1 || type == TensorType::Q5_1 || type == TensorType::Q4_K ||
                       type == TensorType::Q5_K;
  const int d_at = type == TensorType::Q6_K ? 208 : 0;
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* p = raw.data() + b * t.block_bytes;
    p[d_at] = 0x00;
    p[d_at + 1] = 0x20;  // fp16 2^-7
    if (has_min) {
      p[2] = 0x00;
      p[3] = 0x1C;  // fp16 2^-8
    }
  }
  return raw;
}

// A block type by its name, any case ("q5_0", "Q4_K"); false for another name.
bool block_type_named(const std::string& name, TensorType& out) {
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
                       TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    const std::string n = kernels::type_traits(t).name;
    bool same = n.size() == name.size();
    for (size_t i = 0; same && i < n.size(); ++i) same = std::toupper(static_cast<unsigned char>(name[i])) == n[i];
    if (same) {
      out = t;
      return true;
    }
  }
  return false;
}

}  // namespace

int bench_gemv(const GemvBenchOptions& opt) {
  std::mt19937 rng(7);
  for (const std::string& type_name : opt.types) {
    TensorType type;
    if (!block_type_named(type_name, type))
      throw std::invalid_argument("bench gemv: '" + type_name + "' is not a block type (q4_0 ... q6_k)");
    for (const auto& [rows, in] : opt.shapes) {
      if (in % kernels::type_traits(type).block_elements != 0) {
        std::fprintf(stderr, "[bench gemv] %s: %lld columns are not whole blocks, skipped\n", type_name.c_str(),
                     static_cast<long long>(in));
        continue;
      }
      const auto raw = random_blocks(type, rows, in, rng);
      const kernels::WeightView view{type, raw.data(), rows, in};
      for (const char* acts : {"default", "int8"}) {
        auto be = kernels::make_cpu_backend(acts[0] == 'i' ? kernels::DecodeActivations::Int8
                                                           : kernels::DecodeActivations::Exact);
        auto w = be->prepare(view, kernels::Precision::F32);
        for (int64_t n : opt.tokens) {
          std::vector<float> x(static_cast<size_t>(n * in)), y(static_cast<size_t>(n * rows));
          std::uniform_real_distribution<float> u(-1.0f, 1.0f);
          for (auto& v : x) v = u(rng);
          // About 0.2 s of products per timing, the fastest of --repeats timings.
          const int64_t iters = std::max<int64_t>(3, 400000000 / (rows * in * n));
          for (int i = 0; i < 3; ++i) be->linear(*w, x.data(), y.data(), n, nullptr);
          double best = 1e30;
          for (int r = 0; r < opt.repeats; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int64_t i = 0; i < iters; ++i) be->linear(*w, x.data(), y.data(), n, nullptr);
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
          }
          std::printf("%s\n", nlohmann::json{{"bench", "gemv"}, {"kernel", be->kernel_id()}, {"type", type_name},
                                             {"rows", rows}, {"in", in}, {"tokens", n}, {"activations", acts},
                                             {"us", best * 1e6},
                                             {"weight_gb_s", static_cast<double>(raw.size()) / best / 1e9}}
                                  .dump()
                                  .c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

}  // namespace bs::tools
