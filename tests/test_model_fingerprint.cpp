// The chunk-KV key covers everything that changes KV bytes: a model that differs in one
// weight byte, its RoPE base, its norm epsilon, the kernels or the precision gets a
// different fingerprint, so a stored chunk is a miss for it. Real model file, copied
// and patched on disk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/llama_model.h"
#include "storage/chunk_kv.h"
#include "storage/memory_store.h"
#include "tests/model_fixture.h"

namespace bs {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::string write_temp(const std::vector<uint8_t>& bytes, const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("bs_fingerprint_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Overwrites the float32 value of metadata key `key` (GGUF: u64 length, key bytes,
// u32 type = 6, value).
void patch_f32(std::vector<uint8_t>& bytes, const std::string& key, float value) {
  const uint64_t len = key.size();
  std::vector<uint8_t> needle(8);
  std::memcpy(needle.data(), &len, 8);
  needle.insert(needle.end(), key.begin(), key.end());
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bytes.end()) << key;
  const size_t at = static_cast<size_t>(it - bytes.begin()) + needle.size();
  uint32_t type;
  std::memcpy(&type, &bytes[at], 4);
  ASSERT_EQ(type, 6u) << key << " is not a float32";
  std::memcpy(&bytes[at + 4], &value, 4);
}

uint64_t fingerprint_of(const std::string& path, kernels::Backend& backend, kernels::Precision p) {
  return LlamaModel(path, backend, p).fingerprint();
}

TEST(KvFingerprint, EverythingThatChangesKvBytesChangesTheKey) {
  REQUIRE_MODEL();
  auto& cpu = testing::shared_backend();
  const auto f32 = kernels::Precision::F32;
  const auto original = read_bytes(testing::model_path());
  const std::string copy = write_temp(original, "same.gguf");
  const uint64_t base = fingerprint_of(copy, cpu, f32);
  EXPECT_EQ(fingerprint_of(testing::model_path(), cpu, f32), base) << "the same bytes give the same key";

  // One byte in the middle of one weight tensor (found in the file by its first 64 bytes).
  {
    auto bytes = original;
    const gguf::GgufFile f = gguf::GgufFile::open(testing::model_path());
    const auto& t = f.tensor("blk.17.ffn_down.weight");
    auto it = std::search(bytes.begin(), bytes.end(), t.data, t.data + 64);
    ASSERT_NE(it, bytes.end());
    bytes[static_cast<size_t>(it - bytes.begin()) + t.nbytes / 2] ^= 0x11;
    EXPECT_NE(fingerprint_of(write_temp(bytes, "weight.gguf"), cpu, f32), base) << "one weight byte";
  }
  // RoPE base and norm epsilon (metadata only: the tensors are untouched).
  {
    auto bytes = original;
    patch_f32(bytes, "llama.rope.freq_base", 100001.0f);
    EXPECT_NE(fingerprint_of(write_temp(bytes, "rope.gguf"), cpu, f32), base) << "rope base";
  }
  {
    auto bytes = original;
    patch_f32(bytes, "llama.attention.layer_norm_rms_epsilon", 2e-5f);
    EXPECT_NE(fingerprint_of(write_temp(bytes, "eps.gguf"), cpu, f32), base) << "norm epsilon";
  }
  // Other kernels, other precision.
  auto reference = kernels::make_reference_backend();
  EXPECT_NE(fingerprint_of(copy, *reference, f32), base) << "kernels";
  if (cpu.supports(kernels::Precision::BF16)) {
    EXPECT_NE(fingerprint_of(copy, cpu, kernels::Precision::BF16), base) << "precision";
  }

  // And so a chunk stored for one model is a miss for the other.
  MemoryKvStore store(int64_t{1} << 30);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  auto kv = std::make_shared<ChunkKv>();
  kv->tokens = tokens;
  ASSERT_TRUE(store.put(make_chunk_key(base, KvKind::Chunk, tokens), kv));
  EXPECT_TRUE(store.contains(make_chunk_key(base, KvKind::Chunk, tokens)));
  EXPECT_FALSE(store.contains(make_chunk_key(fingerprint_of(copy, *reference, f32), KvKind::Chunk, tokens)));
  fs::remove_all(fs::path(copy).parent_path());
}

}  // namespace
}  // namespace bs
