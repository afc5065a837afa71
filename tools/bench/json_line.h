// A benchmark's result line on stdout: one JSON object, flushed at once, so a reader
// (a pipe, a log, tools that collect the rows) sees each measurement when it is made.
// Progress goes to stderr (tools/cli/progress.h).
#pragma once

#include <cstdio>

#include <nlohmann/json.hpp>

namespace bs::tools {

inline void print_json_line(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace bs::tools
