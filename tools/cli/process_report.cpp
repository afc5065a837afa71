#include "tools/cli/process_report.h"

#include <sys/wait.h>

#include <cstring>
#include <deque>
#include <fstream>

namespace bs::tools {

std::string log_tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  for (std::string l; std::getline(in, l);) {
    last.push_back(l);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "  | " + l + "\n";
  return out.empty() ? "  (the log is empty)\n" : out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

}  // namespace bs::tools
