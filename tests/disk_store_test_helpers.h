// What the SSD tier's suites share (test_disk_store*.cpp): a fresh directory, random
// chunk KV and its key, byte-wise equality, and the file edits the damage tests make.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "storage/disk_store.h"
#include "storage/memory_store.h"
#include "faulty_file_io.h"
#include "tests/random_kv.h"

namespace bs::disk_store_test {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const fs::path& root = fs::temp_directory_path()) {
    static std::atomic<int> n{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = root / ("bs_disk_" + std::string(info->name()) + "_" + std::to_string(::getpid()) + "_" +
                   std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Random bit patterns (NaNs included): equality below is bytewise. F32 unless said.
inline std::shared_ptr<ChunkKv> random_kv(std::mt19937& rng, int layers, int heads, int m, int head_dim,
                                   kernels::TensorType dtype = kernels::TensorType::F32) {
  return testing::random_kv(rng, layers, heads, m, head_dim, dtype);
}

inline ChunkKey key_of(const ChunkKv& kv, uint64_t salt = 7) { return make_chunk_key(salt, KvKind::Chunk, kv.tokens); }

inline void expect_same(const ChunkKv& a, const ChunkKv& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.dtype, b.dtype);
  ASSERT_EQ(a.k.size(), b.k.size());
  ASSERT_EQ(a.v.size(), b.v.size());
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
}

inline void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good());
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(offset);
  f.write(&c, 1);
}

inline constexpr int64_t kBig = int64_t{1} << 30;

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void write_all(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

inline void set_mtime(const fs::path& path, int64_t seconds) {
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = static_cast<time_t>(seconds);
  times[0].tv_nsec = times[1].tv_nsec = 0;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}


}  // namespace bs::disk_store_test
