#include "storage/chunk_kv.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "kernels/dequant.h"
#include "kernels/kv_view.h"

namespace bs {

int64_t ChunkKv::elem_bytes() const { return kernels::kv_dtype_bytes(dtype); }

void ChunkKv::allocate() {
  if (!kernels::is_kv_dtype(dtype)) throw std::invalid_argument("chunk KV: dtype must be F32, F16 or BF16");
  k.assign(static_cast<size_t>(n_layers * layer_bytes()), std::byte{0});
  v.assign(k.size(), std::byte{0});
}

bool ChunkKv::consistent() const {
  return kernels::is_kv_dtype(dtype) && n_layers >= 0 &&
         static_cast<int64_t>(k.size()) == n_layers * layer_bytes() && v.size() == k.size();
}

namespace {
std::vector<float> widen(const ChunkKv& kv, const std::vector<std::byte>& bytes) {
  std::vector<float> out(bytes.size() / static_cast<size_t>(kv.elem_bytes()));
  kernels::kv_to_fp32(kv.dtype, bytes.data(), out.data(), static_cast<int64_t>(out.size()));
  return out;
}
}  // namespace

std::vector<float> ChunkKv::k_fp32() const { return widen(*this, k); }
std::vector<float> ChunkKv::v_fp32() const { return widen(*this, v); }

void ChunkKv::set_fp32(std::span<const float> k_values, std::span<const float> v_values) {
  allocate();
  const size_t n = k.size() / static_cast<size_t>(elem_bytes());
  if (k_values.size() != n || v_values.size() != n) throw std::invalid_argument("chunk KV: wrong number of values");
  kernels::kv_from_fp32(dtype, k_values.data(), k.data(), static_cast<int64_t>(n));
  kernels::kv_from_fp32(dtype, v_values.data(), v.data(), static_cast<int64_t>(n));
}

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

ChunkKey make_prefix_block_key(uint64_t model_fingerprint, const ChunkKey& previous, std::span<const int32_t> block) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  const KvKind kind = KvKind::PrefixBlock;
  XXH3_128bits_update(st, &model_fingerprint, sizeof model_fingerprint);
  XXH3_128bits_update(st, &kind, sizeof kind);
  XXH3_128bits_update(st, &previous.hi, sizeof previous.hi);
  XXH3_128bits_update(st, &previous.lo, sizeof previous.lo);
  XXH3_128bits_update(st, block.data(), block.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return ChunkKey{h.high64, h.low64};
}

std::shared_ptr<ChunkKv> slice_rows(const ChunkKv& kv, int64_t from, int64_t m) {
  if (from < 0 || m < 0 || from + m > kv.length()) throw std::out_of_range("slice_rows: rows outside the entry");
  auto out = std::make_shared<ChunkKv>();
  out->tokens.assign(kv.tokens.begin() + from, kv.tokens.begin() + from + m);
  out->n_layers = kv.n_layers;
  out->kv_heads = kv.kv_heads;
  out->head_dim = kv.head_dim;
  out->dtype = kv.dtype;
  out->allocate();
  const int64_t row = kv.head_dim * kv.elem_bytes();
  for (int l = 0; l < kv.n_layers; ++l)
    for (int h = 0; h < kv.kv_heads; ++h) {
      const int64_t src = h * kv.length() * row + from * row, dst = h * m * row;
      std::memcpy(out->k_layer(l) + dst, kv.k_layer(l) + src, static_cast<size_t>(m * row));
      std::memcpy(out->v_layer(l) + dst, kv.v_layer(l) + src, static_cast<size_t>(m * row));
    }
  return out;
}

}  // namespace bs
