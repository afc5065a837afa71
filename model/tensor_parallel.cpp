#include "model/tensor_parallel.h"

#include <stdexcept>

#include "model/llama_model.h"

namespace bs {

void check_tensor_parallel(const LlamaConfig& full, int size) {
  if (size < 1) throw std::invalid_argument("tensor parallel degree " + std::to_string(size) + " must be >= 1");
  std::string bad;
  auto need = [&](int count, const char* what) {
    if (count % size != 0) bad += std::string(bad.empty() ? "" : ", ") + std::to_string(count) + " " + what;
  };
  need(full.n_heads, "query heads");
  need(full.n_kv_heads, "KV heads");
  need(full.ff, "feed-forward width");
  if (!bad.empty()) {
    std::string fits;
    for (int d = 1; d <= full.n_kv_heads; ++d)
      if (full.n_heads % d == 0 && full.n_kv_heads % d == 0 && full.ff % d == 0)
        fits += (fits.empty() ? "" : ", ") + std::to_string(d);
    throw std::invalid_argument("tensor parallel degree " + std::to_string(size) + " does not divide the model's " +
                                bad + " (" + std::to_string(full.n_heads) + " query / " +
                                std::to_string(full.n_kv_heads) + " KV heads; degrees that fit: " + fits + ")");
  }
}

LlamaConfig shard_config(const LlamaConfig& full, TpShard shard) {
  check_tensor_parallel(full, shard.size);
  if (shard.rank < 0 || shard.rank >= shard.size)
    throw std::invalid_argument("tensor parallel rank " + std::to_string(shard.rank) + " outside a group of " +
                                std::to_string(shard.size));
  LlamaConfig c = full;
  c.n_heads /= shard.size;
  c.n_kv_heads /= shard.size;
  c.ff /= shard.size;
  return c;
}

}  // namespace bs
