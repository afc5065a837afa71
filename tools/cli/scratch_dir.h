// A benchmark's data directory: the one the user named (kept), or a fresh one under
// the system's temp dir named after the benchmark and this process (removed with
// everything in it when the benchmark ends, however it ends).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace bs::tools {

class ScratchDir {
 public:
  // `given` empty: a temp dir "<temp>/blendctl_<name>_<pid>". Created either way.
  ScratchDir(const std::string& given, const std::string& name)
      : temp_(given.empty()),
        path_(temp_ ? std::filesystem::temp_directory_path() / ("blendctl_" + name + "_" + std::to_string(::getpid()))
                    : std::filesystem::path(given)) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    if (temp_) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  bool temp_;
  std::filesystem::path path_;
};

}  // namespace bs::tools
