// What the CLI suites share (test_cli.cpp, test_cli_eval.cpp): a fresh data
// directory for every process they start, a binary of the build run with its output,
// JSON lines, the shipped cases shortened.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <csignal>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "kernels/cpu/isa.h"
#include "model/gguf.h"
#include "tests/model_fixture.h"
#include "tests/process_fixture.h"

namespace bs::cli_test {

namespace fs = std::filesystem;

namespace fs = std::filesystem;

// Every process these tests start keeps its SSD tier and traces in a fresh
// directory, never in the user's cache.
inline const fs::path& data_dir() {
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("bs_cli_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    ::setenv("BLENDSERVE_DATA_DIR", d.c_str(), 1);
    return d;
  }();
  return dir;
}
// Set before any test starts a process (static initialisation of this file),
// and removed at exit rather than in a gtest Environment's TearDown: ctest's
// test discovery runs this binary with --gtest_list_tests, which never reaches
// TearDown and left one directory behind per build. Registered after data_dir()
// has returned, so it runs before the path's own destructor.
inline void remove_data_dir() {
  std::error_code ignored;
  fs::remove_all(data_dir(), ignored);
}
inline const bool data_dir_set = [] {
  const bool made = !data_dir().empty();
  std::atexit(remove_data_dir);
  return made;
}();

using Run = bs::testing::CommandResult;

// A binary of the build with its arguments; stdout and stderr together.
inline Run run(const std::string& args) {
  return bs::testing::run_command(std::string(BLENDSERVE_BINARY_DIR) + "/" + args + " 2>&1");
}

inline std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

// The first `cases` cases of the shipped set with only their first `documents`
// documents each, each cut to its first kWordsPerDocument words, written under
// data_dir(): the eval tests check what eval prints, not the answers' quality, and a
// case's full six documents (~2,300 tokens) made each full prefill ~6 s on 2 AVX2 cores
// (two whole documents: ~820 tokens, 1.6 s on 2 AVX-512 cores, and these tests took
// 150 s of the model tests' time).
inline constexpr size_t kWordsPerDocument = 90;

inline std::string first_words(const std::string& text, size_t n) {
  size_t at = 0;
  for (size_t w = 0; w < n && at != std::string::npos; ++w) {
    at = text.find_first_not_of(' ', at);
    if (at != std::string::npos) at = text.find(' ', at);
  }
  return at == std::string::npos ? text : text.substr(0, at);
}

inline std::string shortened_cases(const std::string& name, size_t cases, size_t documents) {
  const std::string source = std::string(BLENDSERVE_FIXTURES) + "/../data/rag_qa_small.jsonl";
  std::ifstream in(source);
  if (!in) throw std::runtime_error("cannot read " + source);
  const auto path = data_dir() / name;
  std::ofstream out(path);
  std::string line;
  for (size_t i = 0; i < cases && std::getline(in, line); ++i) {
    auto c = nlohmann::json::parse(line);
    auto& docs = c.at("documents");
    docs.erase(docs.begin() + static_cast<std::ptrdiff_t>(std::min(documents, docs.size())), docs.end());
    for (auto& d : docs) d = first_words(d.get<std::string>(), kWordsPerDocument);
    out << c.dump() << "\n";
  }
  return path.string();
}

}  // namespace bs::cli_test
