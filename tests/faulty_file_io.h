// A FileIo (storage/file_io.h) that fails chosen calls the way devices do, for the
// tests of what the SSD tier and everything above it make of a full or failing disk:
//   - a disk of `capacity` bytes under one directory: a write that would take the
//     directory's files past it fails with ENOSPC (as a full filesystem: what the
//     files hold now plus what this write adds);
//   - rules: calls of one operation on paths containing a substring fail with an
//     errno, the next `times` of them (-1: every one) after `skip` that go through.
// Every other call is the real one. Thread-safe (the store calls it from loaders, the
// writer and the compute thread at once).
#pragma once

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "storage/file_io.h"

namespace bs::testing {

class FaultyFileIo : public FileIo {
 public:
  enum class Op { Open, Read, Write, Fsync, Rename };

  // After `skip` matching calls go through (a header read, say), the next `times` fail.
  void fail(Op op, std::string path_part, int err, int times = -1, int skip = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    rules_.push_back({op, std::move(path_part), err, times, skip});
  }
  void clear_rules() {
    std::lock_guard<std::mutex> lock(mu_);
    rules_.clear();
  }
  // 0: no capacity limit.
  void set_capacity(std::string dir, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_dir_ = std::move(dir);
    capacity_ = bytes;
  }
  int64_t failed(Op op) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = failed_.find(op);
    return it == failed_.end() ? 0 : it->second;
  }

  int open(const char* path, int flags, mode_t mode) override {
    if (int err = injected(Op::Open, path)) return fail_with(err);
    const int fd = FileIo::open(path, flags, mode);
    if (fd >= 0) {
      std::lock_guard<std::mutex> lock(mu_);
      paths_[fd] = path;
    }
    return fd;
  }
  ssize_t pread(int fd, void* buf, size_t n, off_t offset) override {
    if (int err = injected(Op::Read, path_of(fd))) return fail_with(err);
    return FileIo::pread(fd, buf, n, offset);
  }
  ssize_t write(int fd, const void* buf, size_t n) override {
    const std::string path = path_of(fd);
    if (int err = injected(Op::Write, path)) return fail_with(err);
    if (over_capacity(path, n)) {
      count(Op::Write);
      return fail_with(ENOSPC);
    }
    return FileIo::write(fd, buf, n);
  }
  int fsync(int fd) override {
    if (int err = injected(Op::Fsync, path_of(fd))) return fail_with(err);
    return FileIo::fsync(fd);
  }
  int rename(const char* from, const char* to) override {
    if (int err = injected(Op::Rename, to)) return fail_with(err);
    return FileIo::rename(from, to);
  }

 private:
  struct Rule {
    Op op;
    std::string path_part;
    int err;
    int times;
    int skip;
  };
  static int fail_with(int err) {
    errno = err;
    return -1;
  }
  std::string path_of(int fd) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = paths_.find(fd);
    return it == paths_.end() ? std::string() : it->second;
  }
  void count(Op op) {
    std::lock_guard<std::mutex> lock(mu_);
    ++failed_[op];
  }
  // The errno a rule gives this call (0: none).
  int injected(Op op, const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : rules_)
      if (r.op == op && r.times != 0 && path.find(r.path_part) != std::string::npos) {
        if (r.skip > 0) {
          --r.skip;
          continue;
        }
        if (r.times > 0) --r.times;
        ++failed_[op];
        return r.err;
      }
    return 0;
  }
  bool over_capacity(const std::string& path, size_t n) const {
    std::string dir;
    int64_t capacity;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dir = capacity_dir_;
      capacity = capacity_;
    }
    if (capacity <= 0 || path.rfind(dir, 0) != 0) return false;
    int64_t used = 0;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code fec;
      if (it->is_regular_file(fec)) used += static_cast<int64_t>(it->file_size(fec));
    }
    return used + static_cast<int64_t>(n) > capacity;
  }

  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  std::map<Op, int64_t> failed_;
  std::map<int, std::string> paths_;
  std::string capacity_dir_;
  int64_t capacity_ = 0;
};

}  // namespace bs::testing
