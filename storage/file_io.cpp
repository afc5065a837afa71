#include "storage/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

namespace bs {

int FileIo::open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
ssize_t FileIo::pread(int fd, void* buf, size_t n, off_t offset) { return ::pread(fd, buf, n, offset); }
ssize_t FileIo::write(int fd, const void* buf, size_t n) { return ::write(fd, buf, n); }
int FileIo::fsync(int fd) { return ::fsync(fd); }
int FileIo::close(int fd) { return ::close(fd); }
int FileIo::rename(const char* from, const char* to) { return std::rename(from, to); }
int FileIo::unlink(const char* path) { return ::unlink(path); }
int FileIo::fstat(int fd, struct stat* st) { return ::fstat(fd, st); }
int FileIo::stat(const char* path, struct stat* st) { return ::stat(path, st); }

const std::shared_ptr<FileIo>& FileIo::system() {
  static const std::shared_ptr<FileIo> io = std::make_shared<FileIo>();
  return io;
}

}  // namespace bs
