// The GGUF reader (model/gguf.*) on malformed files: every header, metadata and tensor
// table fault is a GgufError naming it, and single-byte corruptions never crash.
#include "gguf_test_helpers.h"

namespace {

using namespace bs::gguf_test;  // NOLINT: the suites' shared helpers

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
