// Tests for the GGUF reader (model/gguf.*) and the dequantization kernels (kernels/dequant.*).
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

namespace {

using bs::kernels::TensorType;
using bs::gguf::GgufError;
using bs::gguf::GgufFile;
using bs::gguf::MetaValue;
using bs::gguf::TensorInfo;
namespace kn = bs::kernels;

const char* kModelPath = BLENDSERVE_DEFAULT_MODEL;
const std::string kFixtures = BLENDSERVE_FIXTURES;

bool file_exists(const std::string& p) { return ::access(p.c_str(), R_OK) == 0; }

std::vector<uint8_t> read_prefix(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> buf(max_bytes);
  in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(max_bytes));
  buf.resize(static_cast<size_t>(in.gcount()));
  return buf;
}

uint32_t f2u(float f) { return std::bit_cast<uint32_t>(f); }
float u2f(uint32_t u) { return std::bit_cast<float>(u); }

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

GgufFile parse(const std::vector<uint8_t>& buf) { return GgufFile::parse(buf.data(), buf.size()); }

// Asserts parsing throws GgufError whose message contains every one of `needles`.
void expect_error(const std::vector<uint8_t>& buf, std::initializer_list<std::string> needles) {
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
Builder valid_builder() {
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
Builder one_tensor(std::string name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                   size_t data_bytes) {
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.tensors.push_back({std::move(name), std::move(dims), type, offset});
  b.data.assign(data_bytes, 0);
  return b;
}

// ---- the real model ------------------------------------------------------------------

TEST(GgufRealModel, MetadataAndTensorTable) {
  if (!file_exists(kModelPath)) FAIL() << "model not found (run tools/setup.sh): " << kModelPath;
  const GgufFile f = GgufFile::open(kModelPath);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.get_float("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(f.get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_FALSE(f.has("general.alignment"));
  EXPECT_EQ(f.get_int("general.alignment"), std::nullopt);

  const auto* tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  const auto* types = f.get_int_array("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(types->size(), 49152u);
  const auto* merges = f.get_string_array("tokenizer.ggml.merges");
  ASSERT_NE(merges, nullptr);
  EXPECT_EQ(merges->size(), 48900u);
  ASSERT_TRUE(f.get_string("tokenizer.chat_template").has_value());
  EXPECT_NE(f.get_string("tokenizer.chat_template")->find("<|im_start|>"), std::string::npos);

  // Wrong-type access is an error, not a silent conversion.
  EXPECT_THROW(f.get_int("general.architecture"), GgufError);
  EXPECT_THROW(f.get_string("llama.block_count"), GgufError);
  EXPECT_THROW(f.get_string_array("tokenizer.ggml.token_type"), GgufError);

  ASSERT_EQ(f.tensors().size(), 272u);
  const TensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, TensorType::Q8_0);
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb.nbytes, 576u * 49152u / 32u * 34u);
  EXPECT_EQ(emb.row_elements(), 576);
  EXPECT_EQ(emb.n_rows(), 49152);
  const TensorInfo& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type, TensorType::Q4_1);
  EXPECT_EQ(q.dims, (std::vector<int64_t>{576, 576}));
  EXPECT_EQ(q.nbytes, 576u * 576u / 32u * 20u);
  const TensorInfo& down = f.tensor("blk.29.ffn_down.weight");
  EXPECT_EQ(down.dims, (std::vector<int64_t>{1536, 576}));
  const TensorInfo& norm = f.tensor("blk.0.attn_norm.weight");
  EXPECT_EQ(norm.type, TensorType::F32);
  EXPECT_EQ(norm.dims, (std::vector<int64_t>{576}));
  EXPECT_EQ(norm.n_elements(), 576);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied embeddings
  EXPECT_THROW(f.tensor("output.weight"), GgufError);
  // Tensor data lies in the mapping, in file order, non-overlapping and aligned.
  EXPECT_EQ(emb.offset, 0u);
  EXPECT_EQ(norm.data - emb.data, static_cast<ptrdiff_t>(norm.offset));
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_EQ(f.find_tensor(t.name), &t);
  }
  EXPECT_EQ(f.tensors().front().name, "token_embd.weight");
}

TEST(GgufRealModel, ParseFromHeapCopyMatchesOpen) {
  if (!file_exists(kModelPath)) FAIL() << "model not found (run tools/setup.sh): " << kModelPath;
  const std::vector<uint8_t> buf = read_prefix(kModelPath, size_t{1} << 30);
  ASSERT_GT(buf.size(), 90u << 20);
  const GgufFile a = GgufFile::parse(buf.data(), buf.size());
  const GgufFile b = GgufFile::open(kModelPath);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const auto& ta = a.tensors()[i];
    const auto& tb = b.tensors()[i];
    EXPECT_EQ(ta.name, tb.name);
    EXPECT_EQ(ta.offset, tb.offset);
    ASSERT_EQ(ta.nbytes, tb.nbytes);
    EXPECT_GE(ta.data, buf.data());
    EXPECT_LE(ta.data + ta.nbytes, buf.data() + buf.size());
    EXPECT_EQ(std::memcmp(ta.data, tb.data, std::min<size_t>(ta.nbytes, 4096)), 0) << ta.name;
  }
  // The last tensor ends exactly at the end of the file, so dropping one byte must fail.
  EXPECT_THROW(GgufFile::parse(buf.data(), buf.size() - 1), GgufError);
  // A copy of a GgufFile stays valid after the original is gone (shared mapping).
  std::optional<GgufFile> copy;
  {
    GgufFile c = GgufFile::open(kModelPath);
    copy = c;
  }
  const TensorInfo& norm = copy->tensor("output_norm.weight");
  float x;
  std::memcpy(&x, norm.data, sizeof x);
  EXPECT_TRUE(std::isfinite(x));
}

TEST(GgufRealModel, TruncatedPrefixesThrow) {
  if (!file_exists(kModelPath)) FAIL() << "model not found (run tools/setup.sh): " << kModelPath;
  const std::vector<uint8_t> head = read_prefix(kModelPath, 2u << 20);
  ASSERT_EQ(head.size(), 2u << 20);
  std::vector<size_t> cuts;
  for (size_t i = 0; i <= 64; ++i) cuts.push_back(i);
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<size_t> dist(0, head.size());
  for (int i = 0; i < 200; ++i) cuts.push_back(dist(rng));
  cuts.push_back(head.size());
  int inside_a_length = 0;  // cuts inside a string's length field (the vocabulary is most of the head)
  for (size_t cut : cuts) {
    // Exactly-sized heap copy, so AddressSanitizer catches any read past the end.
    std::vector<uint8_t> prefix(head.begin(), head.begin() + static_cast<ptrdiff_t>(cut));
    try {
      GgufFile::parse(prefix.data(), prefix.size());
      ADD_FAILURE() << "prefix of " << cut << " bytes parsed";
    } catch (const GgufError& e) {
      const std::string msg = e.what();
      const bool meaningful = msg.find("truncated") != std::string::npos ||
                              msg.find("exceeds") != std::string::npos ||
                              msg.find("too large") != std::string::npos ||
                              msg.find("cannot fit") != std::string::npos ||
                              msg.find("past end of file") != std::string::npos;
      EXPECT_TRUE(meaningful) << "cut " << cut << ": " << msg;
      if (msg.find("truncated file: length of ") != std::string::npos) ++inside_a_length;
    }
  }
  // The message names the string whose length was cut (built only on failure).
  EXPECT_GT(inside_a_length, 0);
}

// ---- dequantization against gguf-py ---------------------------------------------------

// Slices of rows of a real file's tensors against gguf-py's dequantization of the same
// rows (tools/fixtures/make_dequant_fixture.py), bit for bit, fp32 and bf16; the types seen.
void expect_rows_match_gguf_py(const std::string& model, const std::string& fixture_name,
                               const std::set<std::string>& types) {
  if (!file_exists(model)) FAIL() << "model not found (run tools/setup.sh): " << model;
  const std::string fixture = kFixtures + "/" + fixture_name;
  std::ifstream in(fixture);
  ASSERT_TRUE(in) << "missing " << fixture << " (tools/fixtures/make_dequant_fixture.py)";
  const nlohmann::json doc = nlohmann::json::parse(in);
  const GgufFile f = GgufFile::open(model);
  std::set<std::string> types_seen;
  size_t values_checked = 0;
  for (const auto& jt : doc.at("tensors")) {
    const std::string name = jt.at("name");
    const TensorInfo& t = f.tensor(name);
    EXPECT_EQ(std::string(kn::type_traits(t.type).name), jt.at("type").get<std::string>()) << name;
    EXPECT_EQ(t.dims, jt.at("dims").get<std::vector<int64_t>>()) << name;
    types_seen.insert(jt.at("type").get<std::string>());
    const int64_t ne0 = t.row_elements();
    const size_t row_bytes = static_cast<size_t>(kn::type_row_bytes(t.type, ne0));
    for (const auto& jr : jt.at("rows")) {
      const int64_t r = jr.at("row");
      ASSERT_LT(r, t.n_rows());
      const uint8_t* src = t.data + static_cast<size_t>(r) * row_bytes;
      std::vector<float> row(static_cast<size_t>(ne0), std::nanf(""));
      kn::dequantize_row(t.type, src, row.data(), ne0);
      std::vector<uint16_t> row_bf16(static_cast<size_t>(ne0));
      kn::dequantize_row_to_bf16(t.type, src, row_bf16.data(), ne0);
      for (const auto& js : jr.at("slices")) {
        const size_t start = js.at("start");
        const auto values = js.at("values").get<std::vector<double>>();
        for (size_t i = 0; i < values.size(); ++i) {
          const float want = static_cast<float>(values[i]);
          ASSERT_EQ(static_cast<double>(want), values[i]) << "fixture value not a float";
          EXPECT_EQ(f2u(row[start + i]), f2u(want))
              << name << " row " << r << " col " << start + i << ": " << row[start + i] << " vs " << want;
          EXPECT_EQ(row_bf16[start + i], kn::fp32_to_bf16(want)) << name << " row " << r;
          ++values_checked;
        }
      }
    }
  }
  EXPECT_EQ(types_seen, types);
  EXPECT_GT(values_checked, 1000u);
}

TEST(GgufDequant, MatchesGgufPyReference) {
  expect_rows_match_gguf_py(kModelPath, "dequant_reference.json", {"Q4_1", "Q8_0", "F32"});
}

// Gemma 3 270M Q4_K_M as llama.cpp's quantizer wrote it: real Q5_0, Q4_K and Q6_K rows.
TEST(GgufDequant, RealKQuantFileMatchesGgufPyReference) {
  expect_rows_match_gguf_py(BLENDSERVE_GEMMA3_MODEL, "dequant_reference_gemma3.json",
                            {"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"});
}

// Random blocks of every block type (every quant, packed scale and high bit drawn at
// random; Q5_1 and Q5_K too, which neither file holds) against gguf-py, bit for bit.
TEST(GgufDequant, RandomBlocksOfEveryBlockTypeMatchGgufPy) {
  const std::string fixture = kFixtures + "/dequant_blocks_reference.json";
  std::ifstream in(fixture);
  ASSERT_TRUE(in) << "missing " << fixture << " (tools/fixtures/make_dequant_fixture.py)";
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::set<std::string> seen;
  for (const auto& jt : doc.at("types")) {
    const std::string name = jt.at("type");
    const kn::TensorTypeTraits* traits = nullptr;
    for (uint32_t id = 0; id < 64 && !traits; ++id)
      if (const auto* t = kn::find_tensor_type(id); t && name == t->name) traits = t;
    ASSERT_NE(traits, nullptr) << name;
    seen.insert(name);
    const std::string hex = jt.at("bytes");
    std::vector<uint8_t> bytes(hex.size() / 2);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    const int64_t blocks = jt.at("blocks");
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), blocks * traits->block_bytes) << name;
    const auto values = jt.at("values").get<std::vector<double>>();
    const int64_t n = blocks * traits->block_elements;
    ASSERT_EQ(static_cast<int64_t>(values.size()), n) << name;
    std::vector<float> got(static_cast<size_t>(n), std::nanf(""));
    kn::dequantize_row(traits->type, bytes.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(f2u(got[i]), f2u(static_cast<float>(values[i]))) << name << " element " << i << ": " << got[i]
                                                                 << " vs " << values[i];
  }
  EXPECT_EQ(seen, (std::set<std::string>{"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}));
}

// ---- hand-constructed blocks -----------------------------------------------------------

// Independent fp16 decoding from the IEEE definition.
double half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) {
    v = std::ldexp(m, -24);
  } else if (e == 31) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + m, e - 25);
  }
  return s ? -v : v;
}

TEST(Dequant, Fp16ToFp32AllValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = kn::fp16_to_fp32(static_cast<uint16_t>(h));
    const double want = half_value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
      // Round trip for every non-NaN half.
      ASSERT_EQ(kn::fp32_to_fp16(got), h) << h;
    }
  }
}

TEST(Dequant, Fp32ToFp16Rounding) {
  EXPECT_EQ(kn::fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(kn::fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(kn::fp32_to_fp16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(kn::fp32_to_fp16(65520.0f), 0x7c00);  // halfway: ties to even = inf
  EXPECT_EQ(kn::fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(kn::fp32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(kn::fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);          // tie -> even (0)
  EXPECT_EQ(kn::fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);          // above the tie
  EXPECT_EQ(kn::fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);          // 1.5 ulp tie -> even
  EXPECT_EQ(kn::fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);   // tie -> even
  EXPECT_EQ(kn::fp32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);   // tie -> even
  const uint16_t nan = kn::fp32_to_fp16(std::nanf(""));
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

TEST(Dequant, Bf16Conversions) {
  EXPECT_EQ(kn::bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(kn::bf16_to_fp32(0xc0a0), -5.0f);
  EXPECT_EQ(kn::bf16_to_fp32(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(kn::bf16_to_fp32(0x0001), std::ldexp(1.0f, -133));
  EXPECT_TRUE(std::signbit(kn::bf16_to_fp32(0x8000)));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = kn::bf16_to_fp32(static_cast<uint16_t>(h));
    ASSERT_EQ(f2u(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(kn::fp32_to_bf16(f), h);
    }
  }
  const float one = 1.0f;
  EXPECT_EQ(kn::fp32_to_bf16(u2f(f2u(one) + 0x8000)), 0x3f80);      // 1 + half ulp: tie -> even
  EXPECT_EQ(kn::fp32_to_bf16(u2f(f2u(one) + 0x8001)), 0x3f81);      // just above the tie
  EXPECT_EQ(kn::fp32_to_bf16(u2f(f2u(one) + 0x7fff)), 0x3f80);      // just below
  EXPECT_EQ(kn::fp32_to_bf16(u2f(f2u(one) + 0x18000)), 0x3f82);     // 1.5 ulp tie -> even
  EXPECT_EQ(kn::fp32_to_bf16(-1.0f), 0xbf80);
  EXPECT_EQ(kn::fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(kn::fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  // NaNs stay NaN, including signalling NaNs whose payload lives in the dropped bits.
  EXPECT_EQ(kn::fp32_to_bf16(u2f(0x7fc00000)), 0x7fc0);
  EXPECT_EQ(kn::fp32_to_bf16(u2f(0x7f800001)), 0x7fc0);
  EXPECT_EQ(kn::fp32_to_bf16(u2f(0xff800001)), 0xffc0);
  EXPECT_EQ(kn::fp32_to_bf16(u2f(0x7fffffff)), 0x7fff);
}

std::vector<float> dq(TensorType t, const std::vector<uint8_t>& src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  kn::dequantize_row(t, src.data(), out.data(), n);
  return out;
}

TEST(Dequant, Q4_0Block) {
  Bytes b;
  // block 0: d = 0.5; byte j = low nibble j, high nibble 15 - j
  b.put<uint16_t>(0x3800);
  for (int j = 0; j < 16; ++j) b.put<uint8_t>(static_cast<uint8_t>(j | ((15 - j) << 4)));
  // block 1: d = -2; all nibbles 8 except element 0 (q=0) and element 16 (q=15)
  b.put<uint16_t>(0xc000);
  b.put<uint8_t>(0xf0);
  for (int j = 1; j < 16; ++j) b.put<uint8_t>(0x88);
  const auto x = dq(TensorType::Q4_0, b.b, 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(x[j + 16], (7 - j) * 0.5f) << j;
  }
  EXPECT_EQ(x[32], 16.0f);    // (0 - 8) * -2
  EXPECT_EQ(x[48], -14.0f);   // (15 - 8) * -2
  for (int j = 1; j < 16; ++j) {
    EXPECT_EQ(x[32 + j], 0.0f);
    EXPECT_EQ(x[48 + j], 0.0f);
  }
}

TEST(Dequant, Q4_1Block) {
  Bytes b;
  b.put<uint16_t>(0x3400);  // d = 0.25
  b.put<uint16_t>(0xbc00);  // m = -1
  for (int j = 0; j < 16; ++j) b.put<uint8_t>(static_cast<uint8_t>(j | ((15 - j) << 4)));
  const auto x = dq(TensorType::Q4_1, b.b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], j * 0.25f - 1.0f) << j;
    EXPECT_EQ(x[j + 16], (15 - j) * 0.25f - 1.0f) << j;
  }
  // ggml and gguf-py round q * d and the sum with m separately: compare with that
  // explicitly two-step-rounded formula for every nibble value and scales/mins with long
  // mantissas, subnormal and negative ones included.
  for (uint16_t dh : {0x3c01, 0x2e66, 0x1234, 0x0003}) {
    for (uint16_t mh : {0xb555, 0x3333, 0x8001}) {
      Bytes c;
      c.put<uint16_t>(dh).put<uint16_t>(mh);
      for (int j = 0; j < 16; ++j) c.put<uint8_t>(static_cast<uint8_t>(j | ((15 - j) << 4)));
      const auto y = dq(TensorType::Q4_1, c.b, 32);
      const float d = static_cast<float>(half_value(dh)), m = static_cast<float>(half_value(mh));
      for (int j = 0; j < 32; ++j) {
        const int qv = j < 16 ? j : 15 - (j - 16);
        volatile float p = static_cast<float>(qv) * d;  // volatile: rounded to float here
        const float want = p + m;
        ASSERT_EQ(f2u(y[j]), f2u(want)) << dh << " " << mh << " " << j;
      }
    }
  }
}

TEST(Dequant, Q8_0Block) {
  Bytes b;
  b.put<uint16_t>(0x4000);  // d = 2
  for (int j = 0; j < 32; ++j) b.put<int8_t>(static_cast<int8_t>(j * 8 - 128));
  b.put<uint16_t>(0x3555);  // d = 0.333251953125
  for (int j = 0; j < 32; ++j) b.put<int8_t>(static_cast<int8_t>(127 - j));
  const auto x = dq(TensorType::Q8_0, b.b, 64);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(x[j], static_cast<float>((j * 8 - 128) * 2)) << j;
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(x[32 + j], static_cast<float>(127 - j) * 0.333251953125f) << j;
  }
}

TEST(Dequant, F16AndBf16AndF32Rows) {
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x0400, 0x7c00, 0xfc00, 0x8000,
                                        0x3555, 0x4248, 0x0000, 0x03ff};
  const std::vector<float> want = {1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -14),
                                   INFINITY, -INFINITY, -0.0f, 0.333251953125f, 3.140625f, 0.0f,
                                   std::ldexp(1023.0f, -24)};
  // 12 values through the F16C 8-wide path and the scalar tail.
  Bytes b;
  for (uint16_t h : halves) b.put<uint16_t>(h);
  const auto x = dq(TensorType::F16, b.b, 12);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(f2u(x[i]), f2u(want[i])) << i;

  Bytes bb;
  for (uint16_t h : {0x3f80, 0xc0a0, 0x4049, 0x0000, 0x7f80}) bb.put<uint16_t>(h);
  const auto z = dq(TensorType::BF16, bb.b, 5);
  EXPECT_EQ(z[0], 1.0f);
  EXPECT_EQ(z[1], -5.0f);
  EXPECT_EQ(z[2], 3.140625f);
  EXPECT_EQ(z[3], 0.0f);
  EXPECT_EQ(z[4], INFINITY);

  Bytes bf;
  for (float v : {1.5f, -0.0f, 1e-30f}) bf.put<float>(v);
  const auto w = dq(TensorType::F32, bf.b, 3);
  EXPECT_EQ(f2u(w[0]), f2u(1.5f));
  EXPECT_EQ(f2u(w[1]), f2u(-0.0f));
  EXPECT_EQ(f2u(w[2]), f2u(1e-30f));
}

TEST(Dequant, ToBf16MatchesRoundedFp32) {
  std::mt19937 rng(7);
  for (kn::TensorType type : {kn::TensorType::F32, kn::TensorType::F16, kn::TensorType::BF16, kn::TensorType::Q4_0,
                             kn::TensorType::Q4_1, kn::TensorType::Q5_0, kn::TensorType::Q5_1, kn::TensorType::Q8_0,
                             kn::TensorType::Q4_K, kn::TensorType::Q5_K, kn::TensorType::Q6_K}) {
    const int64_t n = kn::type_traits(type).block_elements == 256 ? 256 * 5 : 32 * 19;  // several chunks, ends mid-chunk
    std::vector<uint8_t> src(static_cast<size_t>(kn::type_row_bytes(type, n)));
    for (auto& c : src) c = static_cast<uint8_t>(rng());
    if (type == kn::TensorType::F32) {  // keep F32 inputs away from NaN noise: random finite floats
      for (size_t i = 0; i < src.size(); i += 4) src[i + 3] &= 0x3f;
    }
    std::vector<float> f(static_cast<size_t>(n));
    std::vector<uint16_t> h(static_cast<size_t>(n));
    kn::dequantize_row(type, src.data(), f.data(), n);
    kn::dequantize_row_to_bf16(type, src.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (type == kn::TensorType::BF16 && std::isnan(f[i])) continue;  // copied raw, checked below
      ASSERT_EQ(h[i], kn::fp32_to_bf16(f[i])) << kn::type_traits(type).name << " " << i;
    }
    if (type == kn::TensorType::BF16) {
      EXPECT_EQ(std::memcmp(h.data(), src.data(), src.size()), 0);
    }
  }
}

TEST(Dequant, RejectsBadArguments) {
  float out[64];
  uint8_t src[64] = {};
  EXPECT_THROW(kn::dequantize_row(static_cast<TensorType>(10), src, out, 32), std::invalid_argument);  // Q2_K
  EXPECT_THROW(kn::dequantize_row(TensorType::Q4_K, src, out, 32), std::invalid_argument);  // blocks of 256
  EXPECT_THROW(kn::dequantize_row(TensorType::Q4_1, src, out, 31), std::invalid_argument);
  EXPECT_THROW(kn::dequantize_row(TensorType::Q8_0, src, out, -32), std::invalid_argument);
  EXPECT_THROW(kn::dequantize_row(kn::TensorType::Q4_0, src, out, 16), std::invalid_argument);
  uint16_t h[64];
  EXPECT_THROW(kn::dequantize_row_to_bf16(static_cast<TensorType>(99), src, h, 32), std::invalid_argument);
  kn::dequantize_row(TensorType::Q4_0, src, out, 0);  // empty rows are fine
}

TEST(Dequant, TypeTables) {
  EXPECT_STREQ(kn::type_traits(TensorType::Q4_1).name, "Q4_1");
  EXPECT_STREQ(kn::type_traits(TensorType::BF16).name, "BF16");
  EXPECT_STREQ(kn::ggml_type_name(14), "Q6_K");
  EXPECT_STREQ(kn::ggml_type_name(30), "BF16");
  EXPECT_EQ(kn::ggml_type_name(1000), nullptr);
  EXPECT_EQ(kn::type_traits(TensorType::F32).block_elements, 1);
  EXPECT_EQ(kn::type_traits(TensorType::F32).block_bytes, 4);
  EXPECT_EQ(kn::type_traits(TensorType::F16).block_bytes, 2);
  EXPECT_EQ(kn::type_traits(TensorType::BF16).block_bytes, 2);
  EXPECT_EQ(kn::type_traits(TensorType::Q4_0).block_elements, 32);
  EXPECT_EQ(kn::type_traits(TensorType::Q4_0).block_bytes, 18);
  EXPECT_EQ(kn::type_traits(TensorType::Q4_1).block_bytes, 20);
  EXPECT_EQ(kn::type_traits(TensorType::Q8_0).block_bytes, 34);
  EXPECT_EQ(kn::type_traits(TensorType::Q5_0).block_bytes, 22);
  EXPECT_EQ(kn::type_traits(TensorType::Q5_1).block_bytes, 24);
  EXPECT_EQ(kn::type_traits(TensorType::Q4_K).block_elements, 256);
  EXPECT_EQ(kn::type_traits(TensorType::Q4_K).block_bytes, 144);
  EXPECT_EQ(kn::type_traits(TensorType::Q5_K).block_bytes, 176);
  EXPECT_EQ(kn::type_traits(TensorType::Q6_K).block_bytes, 210);
  EXPECT_EQ(kn::find_tensor_type(10), nullptr);  // Q2_K: known to ggml, not supported here
  EXPECT_STREQ(kn::ggml_type_name(10), "Q2_K");
  EXPECT_EQ(kn::type_row_bytes(TensorType::Q4_1, 64), 40);
}

// ---- synthetic files -------------------------------------------------------------------

TEST(GgufSynthetic, ValidFileParses) {
  const Builder b = valid_builder();
  const std::vector<uint8_t> buf = b.build();
  const GgufFile f = parse(buf);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 20u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_EQ(f.get_int("test.i8"), -5);
  EXPECT_EQ(f.get_int("test.u8"), 200);
  EXPECT_EQ(f.get_int("test.i16"), -30000);
  EXPECT_EQ(f.get_int("test.u16"), 60000);
  EXPECT_EQ(f.get_int("test.i32"), -2000000000);
  EXPECT_EQ(f.get_int("test.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(f.get_int("test.u64"), 12345);
  EXPECT_EQ(std::get<uint64_t>(f.metadata().at("test.u64big")), ~uint64_t{0});
  EXPECT_THROW(f.get_int("test.u64big"), GgufError);
  EXPECT_EQ(f.get_float("test.u64big"), 18446744073709551615.0);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 10000.5);
  EXPECT_EQ(f.get_float("test.f64"), 0.1);
  EXPECT_EQ(f.get_float("llama.block_count"), 2.0);  // integers read as floats
  EXPECT_EQ(f.get_bool("test.bool"), true);
  EXPECT_THROW(f.get_bool("test.u8"), GgufError);
  EXPECT_THROW(f.get_float("general.architecture"), GgufError);
  EXPECT_EQ(f.get_string("nope"), std::nullopt);
  EXPECT_EQ(f.get_string_array("nope"), nullptr);
  EXPECT_FALSE(f.has("nope"));
  EXPECT_TRUE(f.has("test.empty"));
  ASSERT_NE(f.get_string_array("test.strings"), nullptr);
  EXPECT_EQ(*f.get_string_array("test.strings"), (std::vector<std::string>{"a", "", "hello world"}));
  ASSERT_NE(f.get_int_array("test.ints"), nullptr);
  EXPECT_EQ(*f.get_int_array("test.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f.get_int_array("test.u64s"), (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(*f.get_int_array("test.empty"), (std::vector<int64_t>{}));
  ASSERT_NE(f.get_float_array("test.floats"), nullptr);
  EXPECT_EQ(*f.get_float_array("test.floats"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(*f.get_float_array("test.doubles"), (std::vector<double>{1e300}));
  EXPECT_EQ(std::get<std::vector<bool>>(f.metadata().at("test.bools")), (std::vector<bool>{true, false, true}));
  EXPECT_THROW(f.get_float_array("test.ints"), GgufError);
  EXPECT_THROW(f.get_int_array("test.strings"), GgufError);

  const size_t data_start = (b.header_size() + 31) / 32 * 32;
  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo& a = f.tensor("a");
  EXPECT_EQ(a.type, TensorType::F32);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a.n_elements(), 8);
  EXPECT_EQ(a.n_rows(), 2);
  EXPECT_EQ(a.nbytes, 32u);
  EXPECT_EQ(a.data, buf.data() + data_start);
  float row1[4];
  kn::dequantize_row(a.type, a.data + 16, row1, 4);
  EXPECT_EQ(row1[0], 4.0f);
  EXPECT_EQ(row1[3], 7.0f);
  const TensorInfo& q = f.tensor("b");
  EXPECT_EQ(q.type, TensorType::Q8_0);
  EXPECT_EQ(q.nbytes, 34u);
  EXPECT_EQ(q.offset, 32u);
  EXPECT_EQ(q.data, buf.data() + data_start + 32);
  float qv[32];
  kn::dequantize_row(q.type, q.data, qv, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(qv[j], (j - 16) * 0.5f);
  const TensorInfo& c = f.tensor("c");
  EXPECT_EQ(c.type, TensorType::F16);
  EXPECT_EQ(c.data, buf.data() + data_start + 96);
  float cv[8];
  kn::dequantize_row(c.type, c.data, cv, 8);
  EXPECT_EQ(cv[0], 1.0f);
  EXPECT_EQ(cv[1], -2.0f);
  EXPECT_EQ(cv[5], 65504.0f);
  EXPECT_EQ(cv[7], 3.0f);
  EXPECT_EQ(f.find_tensor("d"), nullptr);
  try {
    f.tensor("d");
    ADD_FAILURE();
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor d"), std::string::npos) << e.what();
  }
}

TEST(GgufSynthetic, Version2AndAlignment) {
  Builder b = valid_builder();
  b.version = 2;
  EXPECT_EQ(parse(b.build()).version(), 2u);

  Builder c = one_tensor("t", {8}, 0, 64, 96);
  c.kv<uint32_t>("general.alignment", U32, 64);
  c.alignment = 64;
  const auto buf = c.build();
  const GgufFile f = parse(buf);
  EXPECT_EQ(f.tensor("t").data, buf.data() + (c.header_size() + 63) / 64 * 64 + 64);
  EXPECT_EQ(static_cast<size_t>(f.tensor("t").data - buf.data()) % 64, 0u);

  // No tensors and no padding at all is a valid (empty) model.
  Builder e;
  e.kv_str("general.architecture", "llama");
  e.pad = false;
  const GgufFile g = parse(e.build());
  EXPECT_TRUE(g.tensors().empty());
}

TEST(GgufSynthetic, OpenFromDisk) {
  const Builder b = valid_builder();
  const auto buf = b.build();
  char path[] = "/tmp/test_gguf_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, buf.data(), buf.size()), static_cast<ssize_t>(buf.size()));
  close(fd);
  {
    const GgufFile f = GgufFile::open(path);
    float v[4];
    kn::dequantize_row(TensorType::F32, f.tensor("a").data, v, 4);
    EXPECT_EQ(v[2], 2.0f);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
  }
  // A truncated file on disk names the problem and the path.
  ASSERT_EQ(truncate(path, static_cast<off_t>(buf.size() - 1)), 0);
  try {
    GgufFile::open(path);
    ADD_FAILURE();
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("extends past end of file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  ASSERT_EQ(truncate(path, 0), 0);
  EXPECT_THROW(GgufFile::open(path), GgufError);
  unlink(path);
  try {
    GgufFile::open(path);
    ADD_FAILURE();
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GgufFile::open("/tmp"), GgufError);
}

TEST(GgufMalformed, Header) {
  Builder b = valid_builder();
  b.magic = 0x46554746;
  expect_error(b.build(), {"bad magic"});
  b = valid_builder();
  b.version = 1;
  expect_error(b.build(), {"unsupported version 1"});
  b.version = 4;
  expect_error(b.build(), {"unsupported version 4"});
  b.version = 0x03000000;
  expect_error(b.build(), {"big-endian"});
  expect_error({}, {"truncated"});
  expect_error({'G', 'G', 'U'}, {"truncated"});
  expect_error({'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0}, {"truncated", "tensor count"});
  b = valid_builder();
  b.tensor_count = uint64_t{1} << 60;
  expect_error(b.build(), {"tensor count"});
  b.tensor_count = ~uint64_t{0};
  expect_error(b.build(), {"tensor count"});
  b = valid_builder();
  b.kv_count = uint64_t{1} << 62;
  expect_error(b.build(), {"key/value count"});
  // Each count alone could fit in the bytes left, both together cannot.
  b = valid_builder();
  {
    const size_t left = b.build().size() - 24;
    b.kv_count = left / 13;
    b.tensor_count = left / 32;
    expect_error(b.build(), {"key/value count", "tensor count", "too large"});
  }
  // Counts that fit the bytes but claim one entry too many run into the tensor table / EOF.
  b = valid_builder();
  b.kv_count = b.kvs.size() + 1;
  expect_error(b.build(), {"gguf: "});
}

TEST(GgufMalformed, Metadata) {
  // Key string length beyond the file.
  {
    Builder b = valid_builder();
    Bytes e;
    e.put<uint64_t>(uint64_t{1} << 40);
    b.kvs.insert(b.kvs.begin(), e.b);
    expect_error(b.build(), {"string length 1099511627776", "metadata key #0"});
  }
  // String value length beyond the file names the key.
  {
    Builder b = valid_builder();
    Bytes p;
    p.put<uint64_t>(~uint64_t{0} - 3);
    b.kv_raw("general.name", STR, p.b);
    expect_error(b.build(), {"string length", "'general.name'"});
  }
  // Truncated inside a string value / inside the metadata.
  {
    Builder b;
    b.kv_str("general.name", "hello world");
    auto buf = b.header();
    buf.resize(buf.size() - 3);
    expect_error(buf, {"'general.name'"});
  }
  {
    Builder b;
    b.kv<uint64_t>("x.u64", U64, 5);
    auto buf = b.header();
    buf.resize(buf.size() - 1);
    expect_error(buf, {"truncated", "'x.u64'"});
  }
  // Array element count larger than the bytes could hold.
  {
    Builder b = valid_builder();
    Bytes p;
    p.put<uint32_t>(I32).put<uint64_t>(uint64_t{1} << 61);
    b.kv_raw("tokenizer.ggml.token_type", ARR, p.b);
    expect_error(b.build(), {"'tokenizer.ggml.token_type'", "array of"});
  }
  {
    Builder b = valid_builder();
    Bytes p;
    p.put<uint32_t>(STR).put<uint64_t>(uint64_t{1} << 59);
    b.kv_raw("tokenizer.ggml.tokens", ARR, p.b);
    expect_error(b.build(), {"'tokenizer.ggml.tokens'", "array of"});
  }
  // A plausible count whose elements run off the end.
  {
    Builder b;
    b.kv_arr_str("tokenizer.ggml.tokens", {"aaaa", "bbbb", "cccc"});
    auto buf = b.header();
    buf.resize(buf.size() - 6);
    expect_error(buf, {"'tokenizer.ggml.tokens'"});
  }
  {
    Builder b;
    b.kv_arr<int32_t>("ints", I32, {1, 2, 3, 4, 5, 6});
    auto buf = b.header();
    buf.resize(buf.size() - 2);
    expect_error(buf, {"'ints'"});
  }
  // Arrays of arrays.
  {
    Builder b = valid_builder();
    Bytes p;
    p.put<uint32_t>(ARR).put<uint64_t>(1).put<uint32_t>(I32).put<uint64_t>(1).put<int32_t>(7);
    b.kv_raw("nested", ARR, p.b);
    expect_error(b.build(), {"'nested'", "arrays of arrays"});
  }
  // Unknown value / element types.
  {
    Builder b = valid_builder();
    b.kv<uint32_t>("weird", 13, 0);
    expect_error(b.build(), {"'weird'", "unknown value type 13"});
    b = valid_builder();
    Bytes p;
    p.put<uint32_t>(77).put<uint64_t>(1).put<uint32_t>(0);
    b.kv_raw("weird_arr", ARR, p.b);
    expect_error(b.build(), {"'weird_arr'", "unknown array element type 77"});
  }
  // Bool that is neither 0 nor 1.
  {
    Builder b = valid_builder();
    b.kv<uint8_t>("flag", BOOL, 2);
    expect_error(b.build(), {"invalid bool", "'flag'"});
    b = valid_builder();
    b.kv_arr<uint8_t>("flags", BOOL, {0, 1, 5});
    expect_error(b.build(), {"invalid bool", "'flags'"});
  }
  // uint64 array elements that do not fit in int64.
  {
    Builder b = valid_builder();
    b.kv_arr<uint64_t>("big", U64, {1, ~uint64_t{0}});
    expect_error(b.build(), {"'big'", "does not fit in int64"});
  }
  // Duplicate keys.
  {
    Builder b = valid_builder();
    b.kv<uint32_t>("llama.block_count", U32, 3);
    expect_error(b.build(), {"duplicate key 'llama.block_count'"});
  }
  // Alignment: not a power of two, zero, wrong type.
  for (uint32_t a : {0u, 3u, 48u, 100u}) {
    Builder b = valid_builder();
    b.kv<uint32_t>("general.alignment", U32, a);
    expect_error(b.build(), {"general.alignment", "power of two"});
  }
  {
    Builder b = valid_builder();
    b.kv_str("general.alignment", "32");
    expect_error(b.build(), {"general.alignment", "integer"});
  }
  {
    Builder b = valid_builder();
    b.kv<uint64_t>("general.alignment", U64, uint64_t{1} << 40);
    expect_error(b.build(), {"general.alignment", "too large"});
  }
  // Non-printable bytes in key names are escaped in messages.
  {
    Builder b = valid_builder();
    b.kv<uint32_t>(std::string("bad\x01key", 7), U32, 1);
    b.kv<uint32_t>(std::string("bad\x01key", 7), U32, 1);
    expect_error(b.build(), {"duplicate key 'bad\\x01key'"});
  }
}

TEST(GgufMalformed, TensorTable) {
  // n_dims
  expect_error(one_tensor("t", {1, 1, 1, 1, 1}, 0, 0, 32).build(), {"'t'", "n_dims 5"});
  expect_error(one_tensor("t", {}, 0, 0, 32).build(), {"'t'", "n_dims 0"});
  // dims <= 0 (zero, or > INT64_MAX which is negative as int64)
  expect_error(one_tensor("t", {4, 0}, 0, 0, 32).build(), {"'t'", "invalid dimension 0"});
  expect_error(one_tensor("t", {~uint64_t{0}}, 0, 0, 32).build(), {"'t'", "invalid dimension -1"});
  // element count overflow
  expect_error(one_tensor("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0, 32).build(), {"'t'", "overflows"});
  expect_error(one_tensor("t", {3, uint64_t{1} << 62}, 0, 0, 32).build(), {"'t'", "overflows"});
  // byte size overflow / larger than the file
  expect_error(one_tensor("t", {uint64_t{1} << 62}, 0, 0, 32).build(), {"'t'", "byte size that overflows"});
  expect_error(one_tensor("t", {1 << 20}, 0, 0, 32).build(), {"tensor 't' extends past end of file"});
  // unknown / unsupported types
  expect_error(one_tensor("t", {256}, 11, 0, 1024).build(), {"'t'", "unsupported tensor type 11 (Q3_K)"});
  expect_error(one_tensor("t", {256}, 999, 0, 1024).build(), {"'t'", "unsupported tensor type 999"});
  // row size not a multiple of the block size
  expect_error(one_tensor("blk.0.attn_q.weight", {48, 2}, 3, 0, 1024).build(),
               {"'blk.0.attn_q.weight'", "not a multiple", "Q4_1"});
  expect_error(one_tensor("t", {16}, 2, 0, 1024).build(), {"'t'", "not a multiple"});
  // offset not aligned
  expect_error(one_tensor("t", {4}, 0, 16, 64).build(), {"'t'", "not aligned"});
  // past EOF
  expect_error(one_tensor("blk.0.attn_q.weight", {576, 576}, 3, 0, 1000).build(),
               {"tensor 'blk.0.attn_q.weight' extends past end of file"});
  expect_error(one_tensor("t", {8}, 0, 32, 63).build(), {"tensor 't' extends past end of file"});
  expect_error(one_tensor("t", {8}, 0, ~uint64_t{0} - 31, 64).build(), {"tensor 't' extends past end of file"});
  // data section begins past EOF (header not padded, no data)
  {
    Builder b = one_tensor("t", {8}, 0, 0, 0);
    b.pad = false;
    auto buf = b.build();
    ASSERT_NE(buf.size() % 32, 0u);
    expect_error(buf, {"data section"});
  }
  // truncated inside the tensor table
  {
    const Builder b = one_tensor("blk.0.attn_q.weight", {576, 576}, 3, 0, 0);
    const auto h = b.header();
    const size_t table_start = 4 + 4 + 8 + 8 + b.kvs[0].size();
    for (size_t cut = table_start; cut < h.size(); ++cut) {
      std::vector<uint8_t> prefix(h.begin(), h.begin() + static_cast<ptrdiff_t>(cut));
      try {
        parse(prefix);
        ADD_FAILURE() << "cut " << cut;
      } catch (const GgufError& e) {
        const std::string msg = e.what();
        EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("exceeds") != std::string::npos)
            << msg;
        EXPECT_TRUE(msg.find("tensor #0") != std::string::npos ||
                    msg.find("'blk.0.attn_q.weight'") != std::string::npos)
            << msg;
      }
    }
  }
  // overlapping ranges
  {
    Builder b;
    b.tensors.push_back({"x", {16}, 0, 0});   // [0, 64)
    b.tensors.push_back({"y", {16}, 0, 32});  // [32, 96)
    b.data.assign(128, 0);
    expect_error(b.build(), {"overlaps", "'x'", "'y'"});
    b.tensors[1].offset = 64;  // adjacent is fine
    EXPECT_NO_THROW(parse(b.build()));
    b.tensors.push_back({"z", {8}, 1, 0});  // inside x, listed last
    expect_error(b.build(), {"overlaps"});
  }
  // duplicate tensor names
  {
    Builder b;
    b.tensors.push_back({"w", {8}, 0, 0});
    b.tensors.push_back({"w", {8}, 0, 32});
    b.data.assign(64, 0);
    expect_error(b.build(), {"duplicate tensor name 'w'"});
  }
  // tensor name length beyond the file
  {
    Builder b = one_tensor("t", {8}, 0, 0, 32);
    auto buf = b.header();
    const size_t name_len_at = 4 + 4 + 8 + 8 + b.kvs[0].size();
    const uint64_t huge = uint64_t{1} << 50;
    std::memcpy(buf.data() + name_len_at, &huge, 8);
    expect_error(buf, {"string length", "tensor #0"});
  }
}

// Every single-byte corruption of a valid file must either parse or throw GgufError:
// no crash, no other exception type, no out-of-bounds read (under ASan).
TEST(GgufMalformed, SingleByteCorruptionsNeverCrash) {
  const std::vector<uint8_t> good = valid_builder().build();
  size_t rejected = 0, accepted = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x7f}, uint8_t{0x80}, static_cast<uint8_t>(good[i] + 1)}) {
      if (v == good[i]) continue;
      std::vector<uint8_t> bad = good;
      bad[i] = v;
      try {
        const GgufFile f = parse(bad);
        ++accepted;
        for (const auto& t : f.tensors()) {
          ASSERT_GE(t.data, bad.data());
          ASSERT_LE(t.data + t.nbytes, bad.data() + bad.size());
        }
      } catch (const GgufError&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 100u);
  EXPECT_GT(accepted, 100u);  // e.g. changed metadata values or tensor contents
}

}  // namespace
