// The dequantization kernels (kernels/dequant.*): rows of real files against gguf-py,
// every block type's random blocks, hand-constructed blocks, fp16/bf16 conversions.
#include "gguf_test_helpers.h"

namespace {

using namespace bs::gguf_test;  // NOLINT: the suites' shared helpers

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


}  // namespace
