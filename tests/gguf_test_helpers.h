// What the GGUF reader's suites share (test_gguf*.cpp, test_dequant.cpp): the real
// model's path and the fixtures, a tiny GGUF writer (Builder) with a valid file of every
// metadata kind, and the check that a malformed buffer is refused with a message.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "model/gguf.h"

namespace bs::gguf_test {

using bs::kernels::TensorType;
using bs::gguf::GgufError;
using bs::gguf::GgufFile;
using bs::gguf::MetaValue;
using bs::gguf::TensorInfo;
namespace kn = bs::kernels;

inline const char* const kModelPath = BLENDSERVE_DEFAULT_MODEL;
inline const std::string kFixtures = BLENDSERVE_FIXTURES;

inline bool file_exists(const std::string& p) { return ::access(p.c_str(), R_OK) == 0; }

inline std::vector<uint8_t> read_prefix(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> buf(max_bytes);
  in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(max_bytes));
  buf.resize(static_cast<size_t>(in.gcount()));
  return buf;
}

inline uint32_t f2u(float f) { return std::bit_cast<uint32_t>(f); }
inline float u2f(uint32_t u) { return std::bit_cast<float>(u); }

// ---- a tiny GGUF writer ----------------------------------------------------------------

enum VT : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STR = 8, ARR = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& v) {
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

struct Builder {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // overrides the real counts when set
  std::optional<uint64_t> kv_count;
  std::vector<std::vector<uint8_t>> kvs;  // encoded key/value pairs
  std::vector<Tensor> tensors;
  uint64_t alignment = 32;
  std::vector<uint8_t> data;  // data section contents
  bool pad = true;            // pad the header to `alignment`

  // key + type + value
  template <typename T>
  Builder& kv(std::string_view key, uint32_t type, T v) {
    Bytes e;
    e.str(key).put<uint32_t>(type).put<T>(v);
    kvs.push_back(e.b);
    return *this;
  }
  Builder& kv_str(std::string_view key, std::string_view v) {
    Bytes e;
    e.str(key).put<uint32_t>(STR).str(v);
    kvs.push_back(e.b);
    return *this;
  }
  Builder& kv_raw(std::string_view key, uint32_t type, const std::vector<uint8_t>& payload) {
    Bytes e;
    e.str(key).put<uint32_t>(type).raw(payload);
    kvs.push_back(e.b);
    return *this;
  }
  template <typename T>
  Builder& kv_arr(std::string_view key, uint32_t elem_type, const std::vector<T>& v) {
    Bytes e;
    e.str(key).put<uint32_t>(ARR).put<uint32_t>(elem_type).put<uint64_t>(v.size());
    for (const T& x : v) e.put<T>(x);
    kvs.push_back(e.b);
    return *this;
  }
  Builder& kv_arr_str(std::string_view key, const std::vector<std::string>& v) {
    Bytes e;
    e.str(key).put<uint32_t>(ARR).put<uint32_t>(STR).put<uint64_t>(v.size());
    for (const auto& x : v) e.str(x);
    kvs.push_back(e.b);
    return *this;
  }

  size_t header_size() const { return header().size(); }

  std::vector<uint8_t> header() const {
    Bytes h;
    h.put<uint32_t>(magic).put<uint32_t>(version);
    h.put<uint64_t>(tensor_count.value_or(tensors.size()));
    h.put<uint64_t>(kv_count.value_or(kvs.size()));
    for (const auto& e : kvs) h.raw(e);
    for (const auto& t : tensors) {
      h.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) h.put<uint64_t>(d);
      h.put<uint32_t>(t.type).put<uint64_t>(t.offset);
    }
    return h.b;
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out = header();
    if (pad) {
      while (out.size() % alignment != 0) out.push_back(0);
    }
    out.insert(out.end(), data.begin(), data.end());
    return out;
  }
};

inline GgufFile parse(const std::vector<uint8_t>& buf) { return GgufFile::parse(buf.data(), buf.size()); }

// Asserts parsing throws GgufError whose message contains every one of `needles`.
inline void expect_error(const std::vector<uint8_t>& buf, std::initializer_list<std::string> needles) {
  try {
    parse(buf);
    ADD_FAILURE() << "expected GgufError containing '" << *needles.begin() << "'";
  } catch (const GgufError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("gguf: ", 0), 0u) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

// A valid file: one metadata of each kind, three tensors with known contents.
//   a: F32 dims {4, 2} at 0 (values 0..7)
//   b: Q8_0 dims {32} at 32 (d = 0.5, q = j - 16)
//   c: F16 dims {8} at 96 (1.0, -2.0, 0.5, ...)
inline Builder valid_builder() {
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.kv<uint32_t>("llama.block_count", U32, 2);
  b.kv<int8_t>("test.i8", I8, -5);
  b.kv<uint8_t>("test.u8", U8, 200);
  b.kv<int16_t>("test.i16", I16, -30000);
  b.kv<uint16_t>("test.u16", U16, 60000);
  b.kv<int32_t>("test.i32", I32, -2000000000);
  b.kv<int64_t>("test.i64", I64, -(int64_t{1} << 40));
  b.kv<uint64_t>("test.u64", U64, 12345);
  b.kv<uint64_t>("test.u64big", U64, ~uint64_t{0});
  b.kv<float>("llama.rope.freq_base", F32, 10000.5f);
  b.kv<double>("test.f64", F64, 0.1);
  b.kv<uint8_t>("test.bool", BOOL, 1);
  b.kv_arr_str("test.strings", {"a", "", "hello world"});
  b.kv_arr<int32_t>("test.ints", I32, {1, -2, 3});
  b.kv_arr<uint64_t>("test.u64s", U64, {0, 7});
  b.kv_arr<float>("test.floats", F32, {0.5f, -1.25f});
  b.kv_arr<double>("test.doubles", F64, {1e300});
  b.kv_arr<uint8_t>("test.bools", BOOL, {1, 0, 1});
  b.kv_arr<int32_t>("test.empty", I32, {});
  b.tensors.push_back({"a", {4, 2}, 0, 0});
  b.tensors.push_back({"b", {32}, 8, 32});
  b.tensors.push_back({"c", {8}, 1, 96});
  Bytes d;
  for (int i = 0; i < 8; ++i) d.put<float>(static_cast<float>(i));
  d.put<uint16_t>(0x3800);  // 0.5
  for (int j = 0; j < 32; ++j) d.put<int8_t>(static_cast<int8_t>(j - 16));
  while (d.b.size() < 96) d.put<uint8_t>(0xee);
  for (uint16_t h : {0x3c00, 0xc000, 0x3800, 0x0000, 0x8000, 0x7bff, 0x0001, 0x4200}) d.put<uint16_t>(h);
  b.data = d.b;
  return b;
}

// A minimal valid file with a single tensor, for tensor-table malformations.
inline Builder one_tensor(std::string name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                   size_t data_bytes) {
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.tensors.push_back({std::move(name), std::move(dims), type, offset});
  b.data.assign(data_bytes, 0);
  return b;
}


}  // namespace bs::gguf_test
