// The SSD tier's damaged files and faults: every kind of damaged file is a miss (and
// removed), never a wrong answer; faults injected through its file layer (a full disk,
// EIO on reads, fsync, rename) store nothing wrong and leave no temp file.
#include "disk_store_test_helpers.h"

namespace bs {
namespace {

using namespace disk_store_test;  // NOLINT: the suites' shared helpers

TEST(DiskStore, FlippedByteIsAMissAndRemoved) {
  TempDir dir;
  std::mt19937 rng(5);
  DiskKvStore store(dir.str(), kBig);
  auto kv = random_kv(rng, 3, 2, 8, 16);
  const ChunkKey key = key_of(*kv);
  ASSERT_TRUE(store.put(key, kv));
  int64_t off = 0;
  {
    auto e = store.open(key);
    ASSERT_TRUE(e.has_value());
    off = e->layer_offset(1) + e->layer_bytes() + 5;  // in layer 1's V
  }
  flip_byte(store.path_of(key), off);
  EXPECT_EQ(store.get(key), nullptr);
  EXPECT_FALSE(fs::exists(store.path_of(key)));
  EXPECT_FALSE(store.contains(key));
  EXPECT_EQ(store.stats().corrupt, 1);
  EXPECT_EQ(store.stats().bytes, 0);

  // Through the per-layer reader: the good layer reads, the bad one fails.
  ASSERT_TRUE(store.put(key, kv));
  auto e = store.open(key);
  ASSERT_TRUE(e.has_value());
  flip_byte(store.path_of(key), e->layer_offset(2) + 3);  // in layer 2's K
  std::vector<std::byte> k(e->layer_bytes()), v(e->layer_bytes());
  EXPECT_TRUE(store.read_layer(*e, 0, k.data(), v.data()));
  EXPECT_FALSE(store.read_layer(*e, 2, k.data(), v.data()));
  EXPECT_EQ(store.stats().corrupt, 2);
  EXPECT_FALSE(fs::exists(store.path_of(key)));

  // A flipped header byte: caught by the header checksum.
  ASSERT_TRUE(store.put(key, kv));
  flip_byte(store.path_of(key), 60);  // inside the token ids
  EXPECT_EQ(store.get(key), nullptr);
  EXPECT_EQ(store.stats().corrupt, 3);
  EXPECT_FALSE(fs::exists(store.path_of(key)));
}

TEST(DiskStore, TruncatedFileIsRemoved) {
  TempDir dir;
  std::mt19937 rng(6);
  auto a = random_kv(rng, 2, 2, 8, 16), b = random_kv(rng, 2, 2, 8, 16);
  std::string path_a, path_b;
  {
    DiskKvStore store(dir.str(), kBig);
    ASSERT_TRUE(store.put(key_of(*a), a));
    ASSERT_TRUE(store.put(key_of(*b), b));
    path_a = store.path_of(key_of(*a)), path_b = store.path_of(key_of(*b));
  }
  fs::resize_file(path_a, fs::file_size(path_a) - 100);
  {
    DiskKvStore store(dir.str(), kBig);
    EXPECT_FALSE(fs::exists(path_a));
    EXPECT_FALSE(store.contains(key_of(*a)));
    EXPECT_EQ(store.get(key_of(*a)), nullptr);
    ASSERT_NE(store.get(key_of(*b)), nullptr);

    // Truncated while running: a short read is a miss too.
    fs::resize_file(path_b, 5000);
    EXPECT_EQ(store.get(key_of(*b)), nullptr);
    EXPECT_FALSE(fs::exists(path_b));
    EXPECT_EQ(store.stats().corrupt, 2);  // a, dropped by the start-up scan, and b
  }
}

TEST(DiskStore, StartupRemovesGarbageAndTempFilesKeepsOthers) {
  TempDir dir;
  std::mt19937 rng(7);
  auto kv = random_kv(rng, 2, 2, 8, 16);
  const ChunkKey key = key_of(*kv);
  {
    DiskKvStore store(dir.str(), kBig);
    ASSERT_TRUE(store.put(key, kv));
  }
  const fs::path garbage = dir.path / (ChunkKey{5, 6}.hex() + ".bskv");
  const fs::path tmp = dir.path / (key.hex() + ".bskv.tmp.12345.0");
  const fs::path empty = dir.path / "empty.bskv";
  const fs::path unrelated = dir.path / "notes.txt";
  {
    std::ofstream(garbage, std::ios::binary) << std::string(9000, 'x');
    std::ofstream(tmp, std::ios::binary) << std::string(4096, '\0');
    std::ofstream(empty, std::ios::binary);
    std::ofstream(unrelated) << "keep me";
  }
  DiskKvStore store(dir.str(), kBig);
  EXPECT_FALSE(fs::exists(garbage));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(empty));
  EXPECT_TRUE(fs::exists(unrelated));
  EXPECT_EQ(store.stats().entries, 1);
  ASSERT_NE(store.get(key), nullptr);
  expect_same(*store.get(key), *kv);
}

// `get` of a key whose file another key's file was renamed over: a miss, counted
// as corrupt, and that file is removed; the same through open().
TEST(DiskStore, FileRenamedOverIsAMissAndCorrupt) {
  TempDir dir;
  std::mt19937 rng(15);
  auto a = random_kv(rng, 2, 2, 8, 16), b = random_kv(rng, 2, 2, 8, 16), c = random_kv(rng, 2, 2, 8, 16);
  const ChunkKey ka = key_of(*a), kb = key_of(*b), kc = key_of(*c);
  DiskKvStore store(dir.str(), kBig);
  for (const auto& kv : {a, b, c}) ASSERT_TRUE(store.put(key_of(*kv), kv));
  fs::rename(store.path_of(ka), store.path_of(kb));
  EXPECT_TRUE(store.contains(kb));  // the index cannot know yet
  EXPECT_EQ(store.get(kb), nullptr);
  StoreStats s = store.stats();
  EXPECT_EQ(s.corrupt, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 0);
  EXPECT_FALSE(store.contains(kb));
  EXPECT_FALSE(fs::exists(store.path_of(kb)));
  // a's name is empty now: a plain miss, not corrupt.
  EXPECT_EQ(store.get(ka), nullptr);
  EXPECT_EQ(store.stats().corrupt, 1);
  EXPECT_FALSE(store.contains(ka));
  // Through the per-layer reader: b's file (put again) under c's name.
  ASSERT_TRUE(store.put(kb, b));
  fs::rename(store.path_of(kb), store.path_of(kc));
  EXPECT_FALSE(store.open(kc).has_value());
  EXPECT_EQ(store.stats().corrupt, 2);
  EXPECT_FALSE(store.contains(kc));
  EXPECT_FALSE(fs::exists(store.path_of(kc)));
  EXPECT_EQ(store.get(kc), nullptr);
  EXPECT_EQ(store.get(kb), nullptr);
  EXPECT_EQ(store.stats().entries, 0);
  EXPECT_EQ(store.stats().bytes, 0);
}

TEST(DiskStore, FileUnderAnotherKeysNameIsAMiss) {
  TempDir dir;
  std::mt19937 rng(8);
  auto a = random_kv(rng, 2, 2, 8, 16), b = random_kv(rng, 2, 2, 8, 16);
  const ChunkKey ka = key_of(*a), kb = key_of(*b), kc{11, 12};
  {
    DiskKvStore store(dir.str(), kBig);
    ASSERT_TRUE(store.put(ka, a));
    ASSERT_TRUE(store.put(kb, b));
    // While running: a's file now sits under b's name.
    fs::rename(store.path_of(ka), store.path_of(kb));
    EXPECT_EQ(store.get(kb), nullptr);
    EXPECT_EQ(store.get(ka), nullptr);
    EXPECT_EQ(store.stats().corrupt, 1);
    EXPECT_FALSE(fs::exists(store.path_of(kb)));
    EXPECT_EQ(store.stats().entries, 0);
    ASSERT_TRUE(store.put(ka, a));
  }
  // At start-up: a file whose name is not its key is dropped.
  fs::rename(dir.path / (ka.hex() + ".bskv"), dir.path / (kc.hex() + ".bskv"));
  DiskKvStore store(dir.str(), kBig);
  EXPECT_EQ(store.stats().entries, 0);
  EXPECT_EQ(store.get(kc), nullptr);
  EXPECT_EQ(store.get(ka), nullptr);
  EXPECT_FALSE(fs::exists(dir.path / (kc.hex() + ".bskv")));
}

// ---- faults injected through the store's file layer (tests/faulty_file_io.h) -------

using testing::FaultyFileIo;

// The .bskv files and any other files in `dir` (a temp file left behind shows here).
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}
bool only_entries(const std::string& dir) {
  for (const auto& f : files_in(dir))
    if (f.size() < 5 || f.compare(f.size() - 5, 5, ".bskv") != 0) return false;
  return true;
}

// A disk that holds less than the budget: the write that does not fit fails with
// ENOSPC, the store evicts its least recently used entry and the retry stores the new
// one; nothing half-written is left, the other entries read back bit for bit.
TEST(DiskStoreFaults, AFullDiskEvictsTheLeastRecentlyUsedAndStoresTheNewEntry) {
  TempDir dir;
  auto io = std::make_shared<FaultyFileIo>();
  DiskKvStore store(dir.str(), kBig, false, {}, io);
  std::mt19937 rng(21);
  std::vector<std::shared_ptr<ChunkKv>> kvs;
  for (int i = 0; i < 4; ++i) kvs.push_back(random_kv(rng, 3, 2, 40, 16));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.put(key_of(*kvs[i]), kvs[i]));
  const int64_t entry = static_cast<int64_t>(fs::file_size(store.path_of(key_of(*kvs[0]))));
  io->set_capacity(dir.str(), entry * 3 + entry / 2);  // room for three and a half
  ASSERT_NE(store.get(key_of(*kvs[0])), nullptr);       // entry 0 used: entry 1 is now the oldest
  ASSERT_TRUE(store.put(key_of(*kvs[3]), kvs[3]));
  EXPECT_GE(io->failed(FaultyFileIo::Op::Write), 1);
  const StoreStats st = store.stats();
  EXPECT_EQ(st.write_errors, 1);
  EXPECT_EQ(st.evictions, 1);
  EXPECT_FALSE(store.contains(key_of(*kvs[1])));
  for (int i : {0, 2, 3}) {
    auto got = store.get(key_of(*kvs[i]));
    ASSERT_NE(got, nullptr) << i;
    expect_same(*got, *kvs[i]);
  }
  EXPECT_TRUE(only_entries(dir.str()));
  EXPECT_EQ(files_in(dir.str()).size(), 3u);
}

// Full with nothing of ours on it: the write fails, and the next ones are refused
// without touching the disk for kFullCooldown; what was stored before stays readable.
TEST(DiskStoreFaults, AFullDiskWithNothingToEvictRefusesWritesForAWhile) {
  TempDir dir;
  auto io = std::make_shared<FaultyFileIo>();
  DiskKvStore store(dir.str(), kBig, false, {}, io);
  std::mt19937 rng(22);
  auto kv = random_kv(rng, 2, 2, 40, 16), other = random_kv(rng, 2, 2, 40, 16);
  io->set_capacity(dir.str(), 1024);  // less than any entry
  EXPECT_FALSE(store.put(key_of(*kv), kv));
  const int64_t write_failures = io->failed(FaultyFileIo::Op::Write);
  EXPECT_GE(write_failures, 1);
  EXPECT_FALSE(store.put(key_of(*other), other));  // refused at once: no write tried
  EXPECT_EQ(io->failed(FaultyFileIo::Op::Write), write_failures);
  EXPECT_EQ(store.stats().write_errors, 2);
  EXPECT_FALSE(store.contains(key_of(*kv)));
  EXPECT_TRUE(files_in(dir.str()).empty());
}

// EIO on one entry's reads: that entry is a miss (removed, counted corrupt), the
// others read back; stored again, it reads back. The per-layer reader says false.
TEST(DiskStoreFaults, EioOnReadsIsAMissThatRemovesOnlyThatEntry) {
  TempDir dir;
  auto io = std::make_shared<FaultyFileIo>();
  DiskKvStore store(dir.str(), kBig, false, {}, io);
  std::mt19937 rng(23);
  auto a = random_kv(rng, 3, 2, 16, 16), b = random_kv(rng, 3, 2, 16, 16);
  ASSERT_TRUE(store.put(key_of(*a), a));
  ASSERT_TRUE(store.put(key_of(*b), b));
  io->fail(FaultyFileIo::Op::Read, key_of(*a).hex(), EIO, 1);
  EXPECT_EQ(store.get(key_of(*a)), nullptr);
  EXPECT_FALSE(store.contains(key_of(*a)));
  EXPECT_FALSE(fs::exists(store.path_of(key_of(*a))));
  EXPECT_EQ(store.stats().corrupt, 1);
  auto got_b = store.get(key_of(*b));
  ASSERT_NE(got_b, nullptr);
  expect_same(*got_b, *b);
  ASSERT_TRUE(store.put(key_of(*a), a));
  auto got_a = store.get(key_of(*a));
  ASSERT_NE(got_a, nullptr);
  expect_same(*got_a, *a);
  // Layer by layer: the header reads, layer 1's read fails.
  auto reader = store.open_layers(key_of(*b));
  ASSERT_NE(reader, nullptr);
  std::vector<std::byte> k(static_cast<size_t>(reader->layer_bytes())), v(k.size());
  ASSERT_TRUE(reader->read_layer(0, k.data(), v.data()));
  io->fail(FaultyFileIo::Op::Read, key_of(*b).hex(), EIO, 1);
  EXPECT_FALSE(reader->read_layer(1, k.data(), v.data()));
  EXPECT_FALSE(store.contains(key_of(*b)));
}

// EIO where the write is made durable (fsync) or takes its name (rename): nothing is
// stored, no temp file is left, the store and its directory agree, the next put works.
TEST(DiskStoreFaults, EioOnFsyncOrRenameStoresNothingAndLeavesNoTempFile) {
  TempDir dir;
  auto io = std::make_shared<FaultyFileIo>();
  DiskKvStore store(dir.str(), kBig, false, {}, io);
  std::mt19937 rng(24);
  auto a = random_kv(rng, 2, 2, 16, 16), b = random_kv(rng, 2, 2, 16, 16);
  io->fail(FaultyFileIo::Op::Fsync, ".tmp.", EIO, 1);
  EXPECT_FALSE(store.put(key_of(*a), a));
  EXPECT_FALSE(store.contains(key_of(*a)));
  EXPECT_TRUE(files_in(dir.str()).empty());
  ASSERT_TRUE(store.put(key_of(*a), a));
  // A rename that fails while replacing an entry: the old file goes too (never an
  // index that disagrees with the directory).
  io->fail(FaultyFileIo::Op::Rename, key_of(*a).hex(), EIO, 1);
  EXPECT_FALSE(store.put(key_of(*a), a));
  EXPECT_FALSE(store.contains(key_of(*a)));
  EXPECT_TRUE(files_in(dir.str()).empty());
  EXPECT_EQ(store.stats().write_errors, 2);
  ASSERT_TRUE(store.put(key_of(*b), b));
  // A restart over this directory finds exactly what the store holds.
  DiskKvStore again(dir.str(), kBig);
  EXPECT_TRUE(again.contains(key_of(*b)));
  EXPECT_FALSE(again.contains(key_of(*a)));
}

}  // namespace
}  // namespace bs
