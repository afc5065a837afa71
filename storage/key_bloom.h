// A Bloom filter over chunk keys: how a worker tells the cluster's frontend which
// document KV it holds (RAM and SSD tiers) in a few bytes per key, on every
// heartbeat, so the frontend can send a request where its documents already are.
// False positives (a key said held that is not) only cost a worse routing choice:
// the worker then computes or loads the chunk as it would anyway; never a wrong
// answer. False negatives do not happen.
//
// Keys are already uniform 128-bit hashes (XXH3-128 of model fingerprint, kind,
// tokens), so the k probe positions come from the key's two halves by double
// hashing (Kirsch-Mitzenmacher: h_i = lo + i * (hi | 1), the step odd), no
// further hashing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/chunk_kv.h"

namespace bs {

class KeyBloom {
 public:
  // Empty filter that holds nothing (may_contain is always false).
  KeyBloom() = default;
  // Sized for `expected_keys` at false-positive rate `fp_rate` (0 < fp_rate < 1):
  // m = -n ln p / (ln 2)^2 bits, rounded up to whole 64-bit words, k = m/n ln 2
  // probes (1..16). At least 64 bits, at most `max_bits` (the report stays bounded:
  // with more keys than that the rate rises instead).
  static KeyBloom sized_for(int64_t expected_keys, double fp_rate = 0.01, int64_t max_bits = int64_t{8} << 20);
  // From a report: `words` (the bit array, 64 bits per word, bit i in word i/64)
  // and `probes`. Throws std::invalid_argument on an empty array or probes outside
  // 1..16 (a malformed report).
  KeyBloom(std::vector<uint64_t> words, int probes);

  void add(const ChunkKey& key);
  bool may_contain(const ChunkKey& key) const;

  const std::vector<uint64_t>& words() const { return words_; }
  int probes() const { return probes_; }
  int64_t bits() const { return static_cast<int64_t>(words_.size()) * 64; }
  int64_t keys_added() const { return added_; }

 private:
  std::vector<uint64_t> words_;
  int probes_ = 0;
  int64_t added_ = 0;
};

}  // namespace bs
