// The per-layer checksum of a chunk's KV: XXH3-64 over one layer's K bytes, then its V
// bytes. Both the SSD file format (storage/disk_store.h: the header's layer_sum) and
// the remote wire format (storage/remote_protocol.h: ENTRY's layer_sums) carry it, and
// a worker checks a slice read from a storage node against the sum the node's file
// holds: one function, so the two formats cannot drift apart.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bs {

// k, v: bytes_each bytes each (one layer's [kv_heads, m, head_dim] K, then V).
uint64_t layer_checksum(const void* k, const void* v, size_t bytes_each);

}  // namespace bs
