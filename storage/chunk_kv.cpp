#include "storage/chunk_kv.h"

#include <xxhash.h>

#include <cstdio>

namespace bs {

std::string ChunkKey::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

ChunkKey make_chunk_key(uint64_t model_fingerprint, KvKind kind, std::span<const int32_t> tokens,
                        std::span<const int32_t> prelude) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, &model_fingerprint, sizeof model_fingerprint);
  XXH3_128bits_update(st, &kind, sizeof kind);
  if (!prelude.empty()) {
    // Length first, so the prelude and the tokens cannot trade places.
    const uint64_t p = prelude.size();
    XXH3_128bits_update(st, &p, sizeof p);
    XXH3_128bits_update(st, prelude.data(), prelude.size_bytes());
  }
  XXH3_128bits_update(st, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return ChunkKey{h.high64, h.low64};
}

}  // namespace bs
