// GGUF reader: memory-maps a GGUF v2/v3 file, parses its metadata and tensor table,
// and validates everything against the file size before any tensor is touched.
// Malformed input never crashes: every problem is a GgufError naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kernels/tensor_types.h"

namespace bs::gguf {

struct GgufError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Tensor types (ggml numbering, block sizes, dequantizers): kernels/tensor_types.h.
using kernels::TensorType;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  TensorType type;           // one of the supported types (others are rejected at parse)
  uint64_t offset;            // relative to the data section
  const uint8_t* data;        // points into the mapping
  size_t nbytes;
  int64_t n_elements() const;
  int64_t row_elements() const { return dims.empty() ? 1 : dims[0]; }
  int64_t n_rows() const { return n_elements() / row_elements(); }
};

// One metadata value. Arrays are stored typed.
using MetaValue = std::variant<uint64_t, int64_t, double, bool, std::string,
                               std::vector<int64_t>, std::vector<double>, std::vector<std::string>,
                               std::vector<bool>>;

class GgufFile {
 public:
  // mmap a file read-only; throws GgufError on any malformation.
  static GgufFile open(const std::string& path);
  // Parse a buffer the caller keeps alive (used by the fuzzer and tests).
  static GgufFile parse(const uint8_t* data, size_t size);
  // A model's view assembled by another reader (a Hugging Face checkpoint,
  // model/hf_checkpoint.h): its metadata under GGUF's keys, its tensors under GGUF's
  // names, their data in memory `keep` holds alive (the safetensors mappings). Throws
  // GgufError on a duplicate tensor name.
  static GgufFile assemble(std::unordered_map<std::string, MetaValue> meta, std::vector<TensorInfo> tensors,
                           std::vector<std::shared_ptr<const void>> keep);

  uint32_t version() const { return version_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Throws GgufError("missing tensor NAME") when absent.
  const TensorInfo& tensor(std::string_view name) const;

  bool has(std::string_view key) const;
  // Typed getters: nullopt when the key is absent, GgufError when present with the wrong type.
  std::optional<int64_t> get_int(std::string_view key) const;    // any integer type
  std::optional<double> get_float(std::string_view key) const;   // float32/64 (or integer)
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  const std::vector<int64_t>* get_int_array(std::string_view key) const;
  const std::vector<double>* get_float_array(std::string_view key) const;
  const std::unordered_map<std::string, MetaValue>& metadata() const { return meta_; }
  // Forgets a metadata key (nothing when absent): a model drops the vocabulary's arrays
  // once its tokenizer holds them (Gemma 3's 262k token texts, scores and types: ~14 MB).
  void drop_metadata(std::string_view key) { meta_.erase(std::string(key)); }

 private:
  struct Mapping;
  std::shared_ptr<Mapping> mapping_;  // keeps the mmap alive; shared so GgufFile is copyable
  std::vector<std::shared_ptr<const void>> keep_;  // assemble(): what holds the tensors' data
  uint32_t version_ = 0;
  std::unordered_map<std::string, MetaValue> meta_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  friend struct Parser;
};

}  // namespace bs::gguf
