// Reader of the safetensors format (Hugging Face's weight files): an 8-byte little
// endian header length N, N bytes of JSON ({"name": {"dtype", "shape",
// "data_offsets": [begin, end]}, ..., optional "__metadata__"}), then the raw tensor
// bytes, row-major. Memory-maps the file and validates every entry against the file
// before any tensor is touched: malformed input is a SafetensorsError naming the
// file and the problem, never a crash. Debian packages no C++ reader of it, so this
// small one is ours, on nlohmann-json, fuzzed (tests/fuzz/fuzz_safetensors.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/tensor_types.h"

namespace bs::safetensors {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Tensor {
  std::string name;
  kernels::TensorType type;    // F32, F16 or BF16 (other dtypes are refused by name)
  std::vector<int64_t> shape;  // row-major: the last dimension is contiguous
  const uint8_t* data;         // into the mapping
  size_t nbytes;
};

class File {
 public:
  // mmap `path` read-only and parse it.
  static File open(const std::string& path);
  // Parse a buffer the caller keeps alive (the fuzzer, tests); `what` names it in errors.
  static File parse(const uint8_t* data, size_t size, const std::string& what = "buffer");

  const std::vector<Tensor>& tensors() const { return tensors_; }
  // What keeps the tensors' data alive (the mapping; empty for parse()).
  std::shared_ptr<const void> keep() const { return mapping_; }

 private:
  std::shared_ptr<const void> mapping_;
  std::vector<Tensor> tensors_;
};

}  // namespace bs::safetensors
