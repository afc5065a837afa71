#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

namespace bs::safetensors {
namespace {

constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // the format's own limit (100 MB)

[[noreturn]] void fail(const std::string& what, const std::string& msg) {
  throw SafetensorsError("safetensors: " + msg + " [" + what + "]");
}

struct Mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (addr) munmap(addr, len);
  }
};

}  // namespace

File File::parse(const uint8_t* data, size_t size, const std::string& what) {
  File f;
  if (size < 8) fail(what, "truncated: " + std::to_string(size) + " bytes, no header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeader || n > size - 8)
    fail(what, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) + " bytes)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data + 8, data + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail(what, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) fail(what, "header is not a JSON object");
  const uint8_t* base = data + 8 + n;
  const uint64_t data_size = size - 8 - n;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string t = "tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail(what, t + " lacks dtype, shape or data_offsets");
    const auto& dt = entry["dtype"];
    if (!dt.is_string()) fail(what, t + " has a dtype that is not a string");
    const std::string dtype = dt.get<std::string>();
    kernels::TensorType type;
    uint64_t esize;
    if (dtype == "F32") type = kernels::TensorType::F32, esize = 4;
    else if (dtype == "F16") type = kernels::TensorType::F16, esize = 2;
    else if (dtype == "BF16") type = kernels::TensorType::BF16, esize = 2;
    else fail(what, t + " has dtype " + dtype + " (supported: F32, F16, BF16)");
    const auto& shape = entry["shape"];
    if (!shape.is_array() || shape.size() > 8) fail(what, t + " has an invalid shape");
    Tensor out{name, type, {}, nullptr, 0};
    uint64_t count = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        fail(what, t + " has an invalid dimension " + d.dump());
      const uint64_t v = d.get<uint64_t>();
      if (__builtin_mul_overflow(count, v, &count) || count > (uint64_t{1} << 44))
        fail(what, t + " has too many elements");
      out.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(what, t + " has invalid data_offsets");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail(what, t + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") are outside the data (" + std::to_string(data_size) + " bytes)");
    if (end - begin != count * esize)
      fail(what, t + " holds " + std::to_string(end - begin) + " bytes for " + std::to_string(count) + " " + dtype +
                     " elements");
    if (begin % esize != 0) fail(what, t + " is not aligned to its element size");
    out.data = base + begin;
    out.nbytes = static_cast<size_t>(end - begin);
    f.tensors_.push_back(std::move(out));
  }
  return f;
}

File File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  auto m = std::make_shared<Mapping>();
  m->len = static_cast<size_t>(st.st_size);
  if (m->len > 0) {
    m->addr = mmap(nullptr, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->addr == MAP_FAILED) {
      m->addr = nullptr;
      const int e = errno;
      ::close(fd);
      fail(path, std::string("cannot mmap: ") + std::strerror(e));
    }
  }
  ::close(fd);
  File f = parse(static_cast<const uint8_t*>(m->addr), m->len, path);
  f.mapping_ = std::move(m);
  return f;
}

}  // namespace bs::safetensors
