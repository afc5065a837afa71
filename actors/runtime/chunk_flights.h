// Which chunks are being computed in the background, and which stored chunk entries
// are provisional: the two facts that make a chunk computed once and reusable at once.
//
// A request whose documents were not stored computes them in place, in its own prompt,
// and the write-back then computes each one alone (the KV the blend's selection was
// measured on) in the compute thread's background. Two things follow:
//  - Single flight: eight requests that miss the same new chunk at once queue one
//    compute of it, not eight. claim() admits the first; the others join it.
//  - Reusable at once: until that compute is done, the chunk's rows of the first
//    request's own cache (in context, K rotated back to positions 0..m-1) are put in
//    RAM as a provisional entry under the chunk's key, so the next request hits at
//    once. A provisional entry is not written to the SSD or the storage node (an
//    eviction does not demote it), and the background compute replaces it.
//
// Shared by the layer worker (claims, provisional entries), the compute thread's jobs
// (computed, release) and the RAM tier's eviction listener (provisional?); one lock.
// Bounded: claims by the compute thread's background queue (a job it refuses is
// released at once), provisional keys by kMaxProvisional (past it the set is
// cleared, and those entries count as clean: an in-context entry is a valid entry of
// the chunk, only one the blend was not measured on).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>

#include "storage/chunk_kv.h"

namespace bs {

class ChunkFlights {
 public:
  static constexpr size_t kMaxProvisional = size_t{1} << 16;

  // Claims the background compute of `key`: true for the first claim; false while a
  // compute of it is claimed and not released (the caller joins it: counted).
  bool claim(const ChunkKey& key);
  // Ends a claim: the compute stored its entry, failed, found it stored, or was not queued.
  void release(const ChunkKey& key);
  // The entry stored under `key` now (RAM) is a request's in-context KV.
  void mark_provisional(const ChunkKey& key);
  // The provisional entry could not be stored (the RAM tier refused it).
  void unmark_provisional(const ChunkKey& key);
  bool provisional(const ChunkKey& key) const;
  // The chunk's KV computed alone is on its way to the stores (it replaces a
  // provisional entry): counted, and the key is no longer provisional.
  void computed(const ChunkKey& key);

  struct Stats {
    int64_t computed = 0;     // chunks computed alone in the background
    int64_t joined = 0;       // claims that found the chunk's compute already claimed
    int64_t provisional = 0;  // provisional entries stored
    int64_t in_flight = 0;    // claims now
  };
  Stats stats() const;

 private:
  mutable std::mutex mu_;
  std::unordered_set<ChunkKey, ChunkKeyHash> claimed_, provisional_;
  int64_t computed_ = 0, joined_ = 0, provisional_stored_ = 0;
};

}  // namespace bs
