// Benchmarks run by blendctl; each prints one JSON object per measurement.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace bs::tools {

struct BenchOptions {
  std::string model_path;
  std::string precision = "auto";  // auto | bf16 | f32 (kernels::choose_precision)
  std::vector<int64_t> prefill_lengths{512, 3072};
  int repeats = 3;
  int64_t decode_context = 512;
  int decode_tokens = 128;
};

int bench_prefill(const BenchOptions& opt);

struct TtftOptions {
  std::string model_path;
  std::string dataset;  // JSON lines with "documents": text the chunks are cut from
  std::string precision = "auto";  // auto | bf16 | f32 (kernels::choose_precision)
  int chunks = 6;
  int chunk_tokens = 512;
  float ratio = 0.15f;
  std::vector<int> check_layers{1};
  int requests = 3;  // distinct requests (different chunks)
  int repeats = 1;   // runs of each request per mode (median reported)
};
int bench_ttft(const TtftOptions& opt);

struct EvalOptions {
  std::string model_path;
  std::string dataset;
  std::string precision = "auto";  // auto | bf16 | f32 (kernels::choose_precision)
  std::vector<std::string> modes{"blend"};
  float ratio = 0.15f;
  std::vector<int> check_layers{1};
  std::vector<float> schedule;
  int skip_cases = 0;  // start after the first N cases (split a long run)
  int max_cases = 0;   // 0: all
  int max_tokens = 32;
  bool print_cases = true;
  std::string system_prompt =
      "You will be asked a question after reading several passages. Please directly answer the question based on "
      "the given passages. Do NOT repeat the question. The answer should be within 5 words.";
  std::string question_prefix =
      "Answer the question directly based on the given passages. Do NOT repeat the question. The answer should be "
      "within 5 words.\nQuestion: ";
};
int eval_rag(const EvalOptions& opt);

}  // namespace bs::tools
