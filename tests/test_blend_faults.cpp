// Faults injected into the SSD tier of a real runtime on the real model, through the
// store's file layer (storage/file_io.h, tests/faulty_file_io.h): a disk that fills up
// under write-back keeps every request answered, evicts to make room and holds only
// whole entries that a restart finds and serves; EIO on a stored chunk's reads makes
// that chunk a miss — the request answers what it answers without the entry, never
// wrong KV — and the runtime goes on; one unreadable at start-up is dropped by the
// scan and counted. Every wait is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime/runtime.h"
#include "actors/runtime/runtime_context.h"
#include "faulty_file_io.h"
#include "model_fixture.h"
#include "rag_runtime_fixture.h"
#include "settles.h"
#include "temp_dir.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::FaultyFileIo;
using testing::RagCase;
using testing::TempDir;
using testing::wait_stored;

RuntimeRequest request_for(const RagCase& c, int max_tokens = 8) {
  RuntimeRequest r;
  r.messages = {{"user", c.question + " Answer briefly."}};
  r.documents = c.documents;
  r.sampling.max_tokens = max_tokens;
  r.ratio = 0.15f;
  return r;
}

// SSD only (RAM off, so every stored chunk is read from the disk), in `dir`.
RuntimeConfig ssd_only(const fs::path& dir, std::shared_ptr<FileIo> io = nullptr) {
  RuntimeConfig c = default_runtime_config();
  c.data_dir = dir.string();
  c.ssd.path = (dir / "kv").string();
  c.ssd.direct_io = false;
  c.ram.enabled = false;
  c.ssd.file_io = std::move(io);
  return c;
}

int64_t bytes_in(const fs::path& dir) {
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += static_cast<int64_t>(e.file_size());
  return n;
}

std::vector<fs::path> entries_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(BlendFaults, AnSsdThatFillsUpKeepsAnsweringAndHoldsOnlyWholeEntries) {
  REQUIRE_MODEL();
  TempDir dir;
  const auto cases = testing::rag_cases(3, 2);
  auto io = std::make_shared<FaultyFileIo>();
  const fs::path kv = dir.path() / "kv";
  {
    Runtime rt(ssd_only(dir.path(), io));
    // The first case's chunks fit; then the disk holds one and a half times what they
    // take, and the next two cases' write-backs run into ENOSPC.
    ASSERT_NE(rt.run(request_for(cases[0])).finish_reason, "error");
    wait_stored(rt, request_for(cases[0]));
    const int64_t first = bytes_in(kv);
    ASSERT_GT(first, 0);
    io->set_capacity(kv.string(), first + first / 2);
    for (int i = 1; i < 3; ++i) {
      const RequestResult r = rt.run(request_for(cases[static_cast<size_t>(i)]));
      EXPECT_NE(r.finish_reason, "error") << r.error;
      EXPECT_FALSE(r.tokens.empty());
    }
    // Write-back ends (stored or refused) before the checks: the compute thread and
    // the writer are idle once the queues are empty.
    ASSERT_TRUE(testing::settles(
        [&] { return rt.context().compute->queued() == 0 && rt.context().ssd_write_queue.bytes.load() == 0; }, 120));
    const StoreStats st = rt.context().ssd->stats();
    EXPECT_GE(st.write_errors, 1) << "the disk never filled: the test proves nothing";
    EXPECT_GE(st.evictions, 1);
    EXPECT_GE(io->failed(FaultyFileIo::Op::Write), 1);
    EXPECT_LE(bytes_in(kv), first + first / 2);
    const json stores = json::parse(rt.stores_json());
    EXPECT_EQ(stores["ssd"]["write_errors"].get<int64_t>(), st.write_errors);
    // The last case again: whatever of it is stored comes from the disk.
    const RequestResult again = rt.run(request_for(cases[2]));
    EXPECT_NE(again.finish_reason, "error") << again.error;
  }
  // Only whole entries are left (no temp file), and a restart without faults finds
  // every one of them, reads each back whole, and answers from them.
  for (const auto& f : entries_in(kv)) EXPECT_EQ(f.extension(), ".bskv") << f;
  auto cfg = ssd_only(dir.path());
  cfg.write_back = false;
  Runtime again(cfg);
  auto& ssd = *again.context().ssd;
  EXPECT_EQ(ssd.stats().entries, static_cast<int64_t>(entries_in(kv).size()));
  for (const ChunkKey& key : ssd.keys()) EXPECT_NE(ssd.get(key), nullptr) << key.hex();
  EXPECT_EQ(ssd.stats().corrupt, 0);
  const RequestResult r = again.run(request_for(cases[2]));
  EXPECT_NE(r.finish_reason, "error") << r.error;
  EXPECT_GE(r.chunks_from("ssd") + r.chunks_missed, 2);
}

TEST(BlendFaults, EioOnAStoredChunksReadsMakesItAMissNeverWrongKv) {
  REQUIRE_MODEL();
  TempDir dir;
  const auto req = request_for(testing::rag_cases(1, 2)[0]);
  {
    Runtime rt(ssd_only(dir.path()));
    rt.run(req);
    wait_stored(rt, req);
  }
  // The largest file is a document chunk (the prefix is short).
  const fs::path kv = dir.path() / "kv";
  fs::path victim;
  for (const auto& f : entries_in(kv))
    if (victim.empty() || fs::file_size(f) > fs::file_size(victim)) victim = f;
  // What the request answers without that entry: the same store with the file gone.
  const fs::path gone = dir.path() / "kv_gone";
  fs::copy(kv, gone);
  fs::remove(gone / victim.filename());
  RequestResult expected;
  {
    auto cfg = ssd_only(dir.path());
    cfg.ssd.path = gone.string();
    cfg.write_back = false;
    Runtime rt(cfg);
    expected = rt.run(req);
    EXPECT_EQ(expected.chunks_missed, 1);
  }
  // Once the runtime is up, the victim's reads fail with EIO from its second layer on
  // (its header and layer 0 read: one pread each, K and V apiece in buffered mode).
  auto io = std::make_shared<FaultyFileIo>();
  auto cfg = ssd_only(dir.path(), io);
  cfg.write_back = false;
  Runtime rt(cfg);
  io->fail(FaultyFileIo::Op::Read, victim.filename().string(), EIO, -1, 3);
  const RequestResult r = rt.run(req);
  ASSERT_NE(r.finish_reason, "error") << r.error;
  EXPECT_EQ(r.tokens, expected.tokens);
  EXPECT_GE(io->failed(FaultyFileIo::Op::Read), 1);
  EXPECT_EQ(rt.context().ssd->stats().corrupt, 1);
  EXPECT_FALSE(fs::exists(victim));
  // It failed mid-load (the prefill began again with that chunk computed), not at planning.
  EXPECT_TRUE(json::parse(rt.traces_json(1))[0].at("fallback").get<bool>());
  // The runtime goes on: the next request answers the same.
  const RequestResult next = rt.run(req);
  EXPECT_EQ(next.tokens, expected.tokens);
}

// Unreadable at start-up: the scan drops the entry (counted corrupt), and the request
// answers as without it.
TEST(BlendFaults, AnEntryUnreadableAtStartIsDroppedAndCounted) {
  REQUIRE_MODEL();
  TempDir dir;
  const auto req = request_for(testing::rag_cases(1, 2)[0]);
  {
    Runtime rt(ssd_only(dir.path()));
    rt.run(req);
    wait_stored(rt, req);
  }
  const fs::path kv = dir.path() / "kv";
  const auto files = entries_in(kv);
  ASSERT_GE(files.size(), 2u);  // the two chunks (the prefix is shorter than a prefix block)
  auto io = std::make_shared<FaultyFileIo>();
  io->fail(FaultyFileIo::Op::Read, files[0].filename().string(), EIO, 1);
  auto cfg = ssd_only(dir.path(), io);
  cfg.write_back = false;
  Runtime rt(cfg);
  EXPECT_EQ(io->failed(FaultyFileIo::Op::Read), 1);
  EXPECT_EQ(rt.context().ssd->stats().corrupt, 1);
  EXPECT_EQ(rt.context().ssd->stats().entries, static_cast<int64_t>(files.size()) - 1);
  EXPECT_FALSE(fs::exists(files[0]));
  const RequestResult r = rt.run(req);
  EXPECT_NE(r.finish_reason, "error") << r.error;
}

}  // namespace
}  // namespace bs
