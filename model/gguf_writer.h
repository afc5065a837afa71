// A small GGUF v3 writer (tests, random-weight models for benchmarks): typed metadata (set again to replace, erase to
// drop) and tensors given as raw bytes or as a function that fills them (generated
// while the file is written, one tensor in memory at a time: an 8B random model is
// 16 GB), laid out at 32-byte-aligned offsets exactly as
// the reader (model/gguf.cpp) and llama.cpp expect. Keys and tensors keep the order of
// their first set, so a file changed in one key is otherwise byte-identical.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bs {

class GgufWriter {
 public:
  // GGUF metadata value types.
  enum ValueType : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };
  static constexpr uint64_t kAlignment = 32;

  GgufWriter& u32(std::string_view key, uint32_t v) { return scalar(key, kU32, v); }
  GgufWriter& i32(std::string_view key, int32_t v) { return scalar(key, kI32, v); }
  GgufWriter& f32(std::string_view key, float v) { return scalar(key, kF32, v); }
  GgufWriter& boolean(std::string_view key, bool v) { return scalar(key, kBool, static_cast<uint8_t>(v ? 1 : 0)); }
  GgufWriter& str(std::string_view key, std::string_view v) {
    Buf b;
    b.put<uint32_t>(kString).str(v);
    return set(key, std::move(b.bytes));
  }
  GgufWriter& str_array(std::string_view key, const std::vector<std::string>& v) {
    Buf b;
    b.put<uint32_t>(kArray).put<uint32_t>(kString).put<uint64_t>(v.size());
    for (const auto& s : v) b.str(s);
    return set(key, std::move(b.bytes));
  }
  GgufWriter& i32_array(std::string_view key, const std::vector<int32_t>& v) { return array(key, kI32, v); }
  GgufWriter& f32_array(std::string_view key, const std::vector<float>& v) { return array(key, kF32, v); }
  GgufWriter& bool_array(std::string_view key, const std::vector<bool>& v) {
    return array(key, kBool, std::vector<uint8_t>(v.begin(), v.end()));
  }
  GgufWriter& erase(std::string_view key) {
    std::erase_if(kvs_, [&](const auto& kv) { return kv.first == key; });
    return *this;
  }
  bool has(std::string_view key) const {
    return std::any_of(kvs_.begin(), kvs_.end(), [&](const auto& kv) { return kv.first == key; });
  }

  // `dims` in ggml order (dims[0] is the row length); `type` a ggml type number;
  // `data` exactly the tensor's bytes (the writer does not check them against the type,
  // so tests can also write what the reader must refuse).
  GgufWriter& tensor(std::string name, std::vector<uint64_t> dims, uint32_t type, std::vector<uint8_t> data) {
    for (auto& t : tensors_) {
      if (t.name == name) {
        t = Tensor{std::move(name), std::move(dims), type, std::move(data), 0, {}};
        return *this;
      }
    }
    tensors_.push_back(Tensor{std::move(name), std::move(dims), type, std::move(data), 0, {}});
    return *this;
  }
  // Removes the tensor `name` (a file that lacks one).
  GgufWriter& drop_tensor(std::string_view name) {
    std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
    return *this;
  }
  // A tensor of `size` bytes that `fill` writes when the file is written.
  GgufWriter& generated_tensor(std::string name, std::vector<uint64_t> dims, uint32_t type, uint64_t size,
                               std::function<void(uint8_t*)> fill) {
    tensors_.push_back(Tensor{std::move(name), std::move(dims), type, {}, size, std::move(fill)});
    return *this;
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out = header();
    for (const auto& t : tensors_) {
      const size_t at = out.size();
      out.resize(at + t.bytes());
      t.write_into(out.data() + at);
      out.resize(align(out.size()), 0);
    }
    return out;
  }

  // The file to `fd` (a file or a memfd) from its current offset, tensor by tensor.
  // Throws std::runtime_error naming `what` when a write fails.
  void write_fd(int fd, const std::string& what) const {
    put_all(fd, header(), what);
    std::vector<uint8_t> data;
    for (const auto& t : tensors_) {
      data.assign(align(t.bytes()), 0);
      t.write_into(data.data());
      put_all(fd, data, what);
    }
  }

  void write(const std::string& path) const {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
    try {
      write_fd(fd, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  }

  // Raw bytes of n floats (F32 tensor data).
  static std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size() * sizeof(float));
    if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    return out;
  }

 private:
  // Magic, version, counts, metadata and tensor infos, padded to the alignment.
  std::vector<uint8_t> header() const {
    Buf h;
    h.put<uint32_t>(0x46554747).put<uint32_t>(3);  // "GGUF", version 3
    h.put<uint64_t>(tensors_.size()).put<uint64_t>(kvs_.size());
    for (const auto& [key, value] : kvs_) {
      h.str(key);
      h.bytes.insert(h.bytes.end(), value.begin(), value.end());
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      h.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) h.put<uint64_t>(d);
      h.put<uint32_t>(t.type).put<uint64_t>(offset);
      offset = align(offset + t.bytes());
    }
    std::vector<uint8_t> out = std::move(h.bytes);
    out.resize(align(out.size()), 0);
    return out;
  }

  static void put_all(int fd, const std::vector<uint8_t>& b, const std::string& what) {
    for (size_t done = 0; done < b.size();) {
      const ssize_t n = ::write(fd, b.data() + done, b.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("cannot write " + what + ": " + std::strerror(errno));
      done += static_cast<size_t>(n);
    }
  }

  struct Buf {
    std::vector<uint8_t> bytes;
    template <typename T>
    Buf& put(T v) {
      const size_t at = bytes.size();
      bytes.resize(at + sizeof(T));
      std::memcpy(bytes.data() + at, &v, sizeof(T));
      return *this;
    }
    Buf& str(std::string_view s) {
      put<uint64_t>(s.size());
      bytes.insert(bytes.end(), s.begin(), s.end());
      return *this;
    }
  };
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;
    uint64_t generated_size = 0;         // generated tensors: their size and filler
    std::function<void(uint8_t*)> fill;
    uint64_t bytes() const { return fill ? generated_size : data.size(); }
    void write_into(uint8_t* dst) const {
      if (fill) fill(dst);
      else if (!data.empty()) std::memcpy(dst, data.data(), data.size());
    }
  };

  static uint64_t align(uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

  template <typename T>
  GgufWriter& scalar(std::string_view key, uint32_t type, T v) {
    Buf b;
    b.put<uint32_t>(type).put<T>(v);
    return set(key, std::move(b.bytes));
  }
  template <typename T>
  GgufWriter& array(std::string_view key, uint32_t elem_type, const std::vector<T>& v) {
    Buf b;
    b.put<uint32_t>(kArray).put<uint32_t>(elem_type).put<uint64_t>(v.size());
    for (const T& x : v) b.put<T>(x);
    return set(key, std::move(b.bytes));
  }
  // The encoded type + value of `key`, replacing an earlier one in place.
  GgufWriter& set(std::string_view key, std::vector<uint8_t> value) {
    for (auto& kv : kvs_) {
      if (kv.first == key) {
        kv.second = std::move(value);
        return *this;
      }
    }
    kvs_.emplace_back(std::string(key), std::move(value));
    return *this;
  }

  std::vector<std::pair<std::string, std::vector<uint8_t>>> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace bs
