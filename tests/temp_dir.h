// A fresh directory under the system temp dir for one test's files (data dirs,
// SSD tiers, synthetic models), removed with everything in it at the end. The
// name carries the process id and a counter, so parallel test processes and
// several directories in one test never collide.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace bs::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "bs_test") {
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace bs::testing
