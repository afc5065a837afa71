// The GGUF reader (model/gguf.*) on the real model and on synthetic files. Malformed
// files: test_gguf_malformed.cpp; the dequantization kernels: test_dequant.cpp.
#include "gguf_test_helpers.h"

namespace {

using namespace bs::gguf_test;  // NOLINT: the suites' shared helpers

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


}  // namespace
