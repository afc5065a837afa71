// The system calls the SSD tier makes (storage/disk_store.*), behind one interface,
// so that what real devices do — a full disk (ENOSPC), a failing one (EIO), a short
// read — can be injected into the real store and everything above it, in tests and
// soaks, without a special filesystem. FileIo::system() is the real one (plain POSIX
// calls); a DiskKvStore given no other uses it. The methods mirror the POSIX calls
// they stand for: same arguments, same results, errno set on failure.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <memory>

namespace bs {

class FileIo {
 public:
  virtual ~FileIo() = default;
  virtual int open(const char* path, int flags, mode_t mode = 0);
  virtual ssize_t pread(int fd, void* buf, size_t n, off_t offset);
  virtual ssize_t write(int fd, const void* buf, size_t n);
  virtual int fsync(int fd);
  virtual int close(int fd);
  virtual int rename(const char* from, const char* to);
  virtual int unlink(const char* path);
  virtual int fstat(int fd, struct stat* st);
  virtual int stat(const char* path, struct stat* st);

  // The process's real file system calls (shared, stateless).
  static const std::shared_ptr<FileIo>& system();
};

}  // namespace bs
