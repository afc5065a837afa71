// What `blendctl eval` keeps per case in --reference-dir (tools/eval/eval_rag.cpp):
// full prefill's teacher-forced reference (the first row's logits, every answer row's
// argmax) and full's greedy answer, each in a file named by everything that determines
// it, written whole (a temporary file renamed), read back only when its size is right.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace bs::tools {

// What the metrics need of full's teacher-forced logits: the first row (KL) and
// every row's argmax (agreement); with --forced-rows each row's lead too.
struct Reference {
  std::vector<float> first;     // [vocab]
  std::vector<int64_t> argmax;  // [answer tokens]
  std::vector<float> lead;      // [answer tokens] argmax's logit minus the runner-up's; empty unless --forced-rows
};

// The index of the row's largest value (the first of equals).
int64_t argmax_row(const float* x, int64_t n);

// x[best] minus the largest other logit of the row (n >= 2).
float lead_over_runner_up(const float* x, int64_t n, int64_t best);

// The reference file of one case: named by everything that determines its content.
std::filesystem::path reference_file(const std::string& dir, uint64_t fingerprint, const std::string& precision,
                                     const std::vector<int32_t>& tokens, int64_t answer_rows);

// Reads a reference file; false if it is missing or does not have the expected size.
bool read_reference(const std::filesystem::path& file, int64_t V, int64_t A, Reference& ref);

// Full's greedy answer of one case: named by the model, precision, prompt and the
// token limit. The file: the answer's token ids (int32), nothing else.
std::filesystem::path full_answer_file(const std::string& dir, uint64_t fingerprint, const std::string& precision,
                                       const std::vector<int32_t>& prompt, int max_tokens);

// False (recompute it) unless the file holds at most max_tokens ids, each in [0, V):
// the ids are fed to the model.
bool read_full_answer(const std::filesystem::path& file, int max_tokens, int64_t V, std::vector<int32_t>& answer);

// Writes `parts` (pointer, bytes) one after the other to a temporary file renamed over
// `file`: a reader finds the file whole or absent.
void write_whole(const std::filesystem::path& file, std::initializer_list<std::pair<const void*, size_t>> parts);

void write_full_answer(const std::filesystem::path& file, const std::vector<int32_t>& answer);

void write_reference(const std::filesystem::path& file, int64_t V, const Reference& ref);

}  // namespace bs::tools
