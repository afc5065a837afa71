#include "tools/eval/reference_cache.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace bs::tools {

int64_t argmax_row(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

float lead_over_runner_up(const float* x, int64_t n, int64_t best) {
  int64_t second = best == 0 ? 1 : 0;
  for (int64_t i = 0; i < n; ++i)
    if (i != best && x[i] > x[second]) second = i;
  return x[best] - x[second];
}

std::filesystem::path reference_file(const std::string& dir, uint64_t fingerprint, const std::string& precision,
                                     const std::vector<int32_t>& tokens, int64_t answer_rows) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
  for (int32_t t : tokens)
    for (int b = 0; b < 4; ++b) h = (h ^ ((static_cast<uint32_t>(t) >> (8 * b)) & 0xffu)) * 1099511628211ull;
  char name[96];
  std::snprintf(name, sizeof name, "%016llx-%s-%016llx-%lld.ref", static_cast<unsigned long long>(fingerprint),
                precision.c_str(), static_cast<unsigned long long>(h), static_cast<long long>(answer_rows));
  return std::filesystem::path(dir) / name;
}

bool read_reference(const std::filesystem::path& file, int64_t V, int64_t A, Reference& ref) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return false;
  ref.first.resize(static_cast<size_t>(V));
  ref.argmax.resize(static_cast<size_t>(A));
  f.read(reinterpret_cast<char*>(ref.first.data()), static_cast<std::streamsize>(V * sizeof(float)));
  f.read(reinterpret_cast<char*>(ref.argmax.data()), static_cast<std::streamsize>(A * sizeof(int64_t)));
  return static_cast<bool>(f) && f.peek() == std::ifstream::traits_type::eof();
}

std::filesystem::path full_answer_file(const std::string& dir, uint64_t fingerprint, const std::string& precision,
                                       const std::vector<int32_t>& prompt, int max_tokens) {
  auto name = reference_file(dir, fingerprint, precision, prompt, max_tokens).filename().string();
  name.replace(name.size() - 4, 4, ".answer");
  return std::filesystem::path(dir) / name;
}

bool read_full_answer(const std::filesystem::path& file, int max_tokens, int64_t V, std::vector<int32_t>& answer) {
  std::ifstream f(file, std::ios::binary | std::ios::ate);
  if (!f) return false;
  const auto bytes = static_cast<int64_t>(f.tellg());
  if (bytes < 0 || bytes % 4 != 0 || bytes / 4 > max_tokens) return false;
  answer.resize(static_cast<size_t>(bytes / 4));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(answer.data()), static_cast<std::streamsize>(bytes));
  return static_cast<bool>(f) && std::all_of(answer.begin(), answer.end(), [V](int32_t t) { return t >= 0 && t < V; });
}

void write_whole(const std::filesystem::path& file, std::initializer_list<std::pair<const void*, size_t>> parts) {
  std::filesystem::create_directories(file.parent_path());
  const auto tmp = file.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    for (const auto& [data, bytes] : parts)
      f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!f) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, file);
}

void write_full_answer(const std::filesystem::path& file, const std::vector<int32_t>& answer) {
  write_whole(file, {{answer.data(), answer.size() * sizeof(int32_t)}});
}

void write_reference(const std::filesystem::path& file, int64_t V, const Reference& ref) {
  write_whole(file, {{ref.first.data(), static_cast<size_t>(V) * sizeof(float)},
                     {ref.argmax.data(), ref.argmax.size() * sizeof(int64_t)}});
}

}  // namespace bs::tools
