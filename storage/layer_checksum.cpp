#include "storage/layer_checksum.h"

#include <xxhash.h>

#include <new>

namespace bs {

uint64_t layer_checksum(const void* k, const void* v, size_t bytes_each) {
  XXH3_state_t* st = XXH3_createState();
  if (!st) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, k, bytes_each);
  XXH3_64bits_update(st, v, bytes_each);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace bs
