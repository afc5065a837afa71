// What the tools that start blendserve processes (blendctl cluster up, bench
// control) say when one fails: the end of its log, and how it ended.
#pragma once

#include <cstddef>
#include <string>

namespace bs::tools {

// The last `lines` lines of a file, each as "  | line\n" ("  (the log is empty)\n").
std::string log_tail(const std::string& path, size_t lines);
// A waitpid status in words: "exited with status N", "was killed by signal S", "stopped".
std::string describe_status(int status);

}  // namespace bs::tools
